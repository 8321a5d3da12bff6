"""A finished run read off its objects as plain values, for the result (:mod:`clbench.results.assemble`)."""

from __future__ import annotations

from clbench.results.assemble import RunSummary


def run_summary(run) -> RunSummary:
    """What the result says of ``run`` (a :class:`clbench.engine.runner.ContinualRun` that has
    finished) besides its loop state: the plain values :func:`clbench.results.assemble.assemble` takes."""
    from clbench.metrics.declared import contributed, recorded
    from clbench.models.layers.adapted import adapter_scales

    model, strategy, objective = run.module.model, run.strategy, run.objective
    specs = {**objective.metric_specs(), **contributed(objective, strategy)}
    return RunSummary(
        cfg=run.cfg, scenario_type=run.spec.scenario_type, num_classes=run.spec.num_classes,
        objective={"name": type(objective).__name__, **objective.summary()},
        higher_is_better=objective.higher_is_better,
        column_names=run.columns.per_experience(run.module.primary),
        metrics=recorded(run.module.eval_metrics, specs),
        experiences=[exp.name for exp in run.experiences], domains=[exp.domain_id for exp in run.experiences],
        single_stage=strategy.single_stage, precision=run.precision,
        params_total=sum(p.numel() for p in model.parameters()),
        params_trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        adapter_scales=adapter_scales(model),
        strategy_class=f"{type(strategy).__module__}:{type(strategy).__qualname__}",
        strategy_params=strategy.hparams(), strategy_diagnostics=strategy.diagnostics())
