"""Reference models (``metrics.reference_models``): the thesis's baselines for intransigence and
reference forward transfer, one per experience, each trained from the run's initial weights."""

from __future__ import annotations


def reference_scores(run, stage_epochs: int) -> list[float]:
    """The thesis's reference models: the initial weights trained on experience j only.

    Reference j uses the same epochs and the same seeds (training and loader) as stage j of
    the continual run, so the two differ only in their starting weights; intransigence
    then measures what the earlier experiences did, not seed noise. (The thesis seeds its
    baselines with a separate key; this is the controlled version of that comparison.)
    """
    from clbench.plugins import build
    from clbench.engine import checkpoint, seeding
    from clbench.engine.stage import evaluate, fit_stage
    from clbench.engine.module import ContinualModule
    from clbench.strategy import Strategy
    from clbench.engine.trainer import make_trainer

    scores = []
    for exp in run.experiences:
        seeding.seed_all(seeding.derive(run.cfg["seed"], "model"))
        model = build.build_model(run.cfg, run.spec, run.source, run.objective, check_size=False)  # the run's fit
        if checkpoint.digest(model.state_dict()) != run.initial_digest:
            raise RuntimeError("the model builder is not deterministic: a reference model would not start "
                               "from the continual run's initial weights")
        if run.pretraining is not None:
            run.pretraining.load_into(run, model)
        run.begin_experience(exp, model)
        module = ContinualModule(model, Strategy(), run.objective, optimizer=run.optimizer,
                                 scheduler=run.scheduler, columns=[exp])
        trainer = make_trainer(run.cfg, run.source)
        seeding.seed_all(seeding.derive(run.cfg["seed"], "train", exp.position))
        loader = run.make_loader(exp.train, shuffle=True, seed=seeding.derive(run.cfg["seed"], "loader", exp.position))
        fit_stage(run, trainer, module, loader, stage_epochs)
        scores.append(evaluate(run, trainer, module, [run.make_loader(exp.test, shuffle=False)]).values["primary"][0])
    return scores
