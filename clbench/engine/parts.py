"""A run's parts, built once from its config: stream, objective, strategy, model, the module that
joins them, the optimizer and scheduler factories, and the seed protocol.

:func:`build_parts` is the only place a run is built, and it runs nothing. The loop
(:mod:`clbench.engine.runner`) trains the parts through the stream; pretraining, reference models,
saving, restoring and the result's summary are handed the parts (or plain values), never the loop.

``stream=`` builds from a saved stream description (:mod:`clbench.data.description`) instead of
the benchmark: no dataset is opened, the experiences carry no data and there are no test columns
(``columns`` is None). That is how :func:`clbench.load_model` rebuilds a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from clbench.seeding import Seeds
from clbench.errors import UserError

if TYPE_CHECKING:
    from clbench.config.schema import RunConfig
    from clbench.data.streams import Experience, StreamSpec
    from clbench.engine.checkpoint import FrozenBase
    from clbench.engine.columns import EvalColumns
    from clbench.engine.module import ContinualModule
    from clbench.engine.pretrain import Pretraining
    from clbench.metrics.routing_recording import RoutingRecording
    from clbench.objectives.base import Objective
    from clbench.strategy import Strategy


@dataclass(frozen=True)
class RunParts:
    """What a run is made of (the record is frozen; the objects in it train)."""

    cfg: dict  # the resolved config: what names and hashes the run, and what the plugin builders read
    config: "RunConfig"  # the same, typed: what the engine reads (parts.config.train.epochs)
    source: str  # where the config came from, for errors
    seeds: Seeds
    spec: "StreamSpec"
    experiences: list["Experience"]  # run order
    strategy: "Strategy"
    objective: "Objective"
    module: "ContinualModule"
    optimizer: Callable
    scheduler: Callable | None
    frozen_base: "FrozenBase"
    routing: "RoutingRecording"
    columns: "EvalColumns | None"  # None when built from a description (no test sets)
    pretraining: "Pretraining | None"
    initial_digest: str | None  # the initial weights' digest, when reference models are asked for

    @property
    def model(self):
        return self.module.model

    @property
    def stages(self) -> list["Experience"]:
        """What trains, one stage each: every experience, or the last one for a single-stage
        learner (joint training sees the whole stream at once)."""
        return [self.experiences[-1]] if self.strategy.single_stage else self.experiences

    def loader(self, dataset, trainer, *, shuffle: bool, seed: int | None = None, batch_size: int | None = None,
               **kw: Any):
        """A loader configured from ``train:``; under data parallelism each of ``trainer``'s ranks
        reads its shard."""
        from clbench.data.datasets import run_loader

        kw.setdefault("collate_fn", self.objective.collate(train=shuffle))
        if shuffle and self.config.train.group_by_length and "sampler" not in kw:
            kw["lengths"] = self.objective.lengths(dataset)
            if kw["lengths"] is None:
                raise UserError(f"objective {type(self.objective).__name__} gives its samples no length",
                                where=f"{self.source}: train.group_by_length", fix="remove it")
        return run_loader(self.cfg, dataset, shuffle=shuffle, seed=seed, batch_size=batch_size,
                          world_size=trainer.world_size, rank=trainer.global_rank, **kw)

    def begin_experience(self, exp, model=None) -> None:
        """The objective's per-experience set-up (class weights), then the model's, if it has
        one (``model.begin_experience(exp)``: e.g. routing prototypes from the experience's data;
        see :class:`clbench.models.protocol.ContinualModel`)."""
        from clbench.models.protocol import begin_experience

        self.objective.begin_experience(exp)
        begin_experience(self.module.model if model is None else model, exp)


def build_parts(cfg: dict, source: str = "config", *, stream: tuple["StreamSpec", list["Experience"]] | None = None
                ) -> RunParts:
    """Build ``cfg``'s run, seeded as every run of it is; ``stream``: a described stream's spec
    and experiences (in run order) in place of the benchmark's."""
    from clbench.config.schema import RunConfig
    from clbench.data.streams import ordered_experiences, spec_of
    from clbench.engine import checkpoint, pretrain
    from clbench.engine.columns import EvalColumns
    from clbench.engine.module import ContinualModule
    from clbench.metrics.declared import routing_contributed
    from clbench.metrics.routing_recording import RoutingRecording
    from clbench.plugins import build

    config = RunConfig.model_validate(cfg)  # a resolved config is valid: this only types it
    seeds = Seeds(config.seed)
    pretraining = pretrain.settings(cfg, source) if stream is None else None  # checked before the stream is built
    seeds.build()
    strategy = build.build_strategy(cfg, source)  # before the stream: it checks its arguments cheaply
    if stream is None:
        scenario = build.build_benchmark(cfg, source)
        spec = spec_of(scenario)
        experiences = ordered_experiences(scenario, config.order, where=f"{source}: order")
        pretraining = pretrain.carve(pretraining, experiences, seeds.seed)  # held out of every experience
    else:
        spec, experiences = stream
    if spec.scenario_type not in strategy.supports:
        raise UserError(f"strategy '{config.strategy.class_path}' does not support "
                        f"{spec.scenario_type} streams like '{spec.name}'", where=f"{source}: strategy",
                        fix=f"it supports: {', '.join(sorted(strategy.supports))}")
    objective = build.build_objective(cfg, spec, source)
    given = (f"objective '{config.objective.class_path}'" if config.objective is not None
             else f"stream '{spec.name}' (objective {spec.objective})")
    build.check_requirements(cfg, type(strategy), type(objective), given, source)
    try:
        objective.setup(spec, experiences)
    except UserError as err:  # about one of its init_args: name the config file too
        raise build.locate_error(err, source) from None
    optimizer = build.optimizer_factory(cfg, source)
    scheduler = build.scheduler_factory(cfg, source)
    seeds.model()
    model = build.build_model(cfg, spec, source, objective)
    objective.attach(model)
    # Reference models are rebuilt the same seeded way; the digest proves they start equal.
    initial_digest = checkpoint.digest(model.state_dict()) if config.metrics.reference_models else None
    frozen_base = checkpoint.FrozenBase(model)
    columns = EvalColumns(experiences, spec.global_test) if stream is None else None
    scored_as = columns.scored_as if columns is not None else [experiences[-1]]
    module = ContinualModule(model, strategy, objective, optimizer=optimizer, scheduler=scheduler, columns=scored_as)
    domains = columns.domains if columns is not None else []
    routing = RoutingRecording(domains, max(exp.domain_id for exp in experiences) + 1,
                               metrics=routing_contributed(objective, strategy))
    module.sharding_listeners.append(frozen_base)
    strategy.setup(module.context, experiences, seeds.strategy())
    strategy.adapt_model(module.context, 0)
    return RunParts(cfg=cfg, config=config, source=source, seeds=seeds, spec=spec, experiences=experiences,
                    strategy=strategy, objective=objective, module=module, optimizer=optimizer, scheduler=scheduler,
                    frozen_base=frozen_base, routing=routing, columns=columns, pretraining=pretraining,
                    initial_digest=initial_digest)
