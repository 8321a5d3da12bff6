"""Reference models (``metrics.reference_models``): the thesis's baselines for intransigence and
reference forward transfer, one per experience, each trained from the run's initial weights."""

from __future__ import annotations


def reference_scores(parts, watch=None) -> list[float]:
    """The thesis's reference models: the initial weights trained on experience j only.

    Reference j uses the same epochs and the same seeds (training and loader) as stage j of
    the continual run, so the two differ only in their starting weights; intransigence
    then measures what the earlier experiences did, not seed noise. (The thesis seeds its
    baselines with a separate key; this is the controlled version of that comparison.)
    """
    from clbench.engine import checkpoint
    from clbench.engine.stage import evaluate, fit_plain
    from clbench.plugins import build

    scores = []
    for exp in parts.experiences:
        parts.seeds.model()
        # the run's model fitted this machine already: check_size=False
        model = build.build_model(parts.cfg, parts.spec, parts.source, parts.objective, check_size=False)
        if checkpoint.digest(model.state_dict()) != parts.initial_digest:
            raise RuntimeError("the model builder is not deterministic: a reference model would not start "
                               "from the continual run's initial weights")
        if parts.pretraining is not None:
            parts.pretraining.load_into(parts, model, watch)
        parts.begin_experience(exp, model)
        trainer, module = fit_plain(parts, model, exp.train, exp.position, parts.config.train.epochs,
                                    columns=[exp], watch=watch)
        test = [parts.loader(exp.test, trainer, shuffle=False)]
        scores.append(evaluate(trainer, module, test, watch=watch).values.primary[0])
    return scores
