"""A finished run read off its parts as plain values, for the result (:mod:`clbench.results.assemble`)."""

from __future__ import annotations

from clbench.results.assemble import RunSummary


def run_summary(parts, precision: str) -> RunSummary:
    """What the result says of a finished run (its :class:`~clbench.engine.parts.RunParts`,
    trained; ``precision``: its Trainer's) besides its loop state: the plain values
    :func:`clbench.results.assemble.assemble` takes."""
    from clbench.metrics.declared import contributed, recorded, routing_contributed
    from clbench.models.layers.adapted import adapter_scales

    model, strategy, objective = parts.model, parts.strategy, parts.objective
    specs = {**objective.metric_specs(), **contributed(objective, strategy)}
    return RunSummary(
        cfg=parts.cfg, scenario_type=parts.spec.scenario_type, num_classes=parts.spec.num_classes,
        synthetic=parts.spec.synthetic,
        objective={"name": type(objective).__name__, **objective.summary()},
        higher_is_better=objective.higher_is_better,
        column_names=parts.columns.per_experience(parts.module.primary),
        metrics={**recorded(parts.module.eval_metrics, specs),
                 **{name: spec.info() for name, spec in routing_contributed(objective, strategy).items()}},
        experiences=[exp.name for exp in parts.experiences], domains=[exp.domain_id for exp in parts.experiences],
        single_stage=strategy.single_stage, precision=precision,
        params_total=sum(p.numel() for p in model.parameters()),
        params_trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        adapter_scales=adapter_scales(model),
        strategy_class=f"{type(strategy).__module__}:{type(strategy).__qualname__}",
        strategy_params=strategy.hparams(), strategy_diagnostics=strategy.diagnostics())
