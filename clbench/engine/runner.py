"""One continual run, end to end: the loop lives here and only here.

::

    build stream (order applied), objective, model, strategy, ContinualModule, one Trainer
    optional pretraining on a subset held out of every experience (clbench.engine.pretrain)
    evaluate the (pretrained or untrained) model on every test experience   -> r_init
    for each experience i (run order):
        strategy.adapt_model (structure experience i trains), strategy.before_experience
        Trainer.fit on strategy.train_loader(strategy.train_dataset(exp_i))
        evaluate on every test experience (future ones too)         -> R[i, :]
        strategy.after_experience
        checkpoint (model, strategy state, R so far, RNG, config)
    scores from R -> result.json

What is learned and how it is scored belongs to the objective (:mod:`clbench.objectives`): R's
entries are each test column's primary metric, in the objective's direction. The parts around
the loop have modules of their own: the Trainer (:mod:`clbench.engine.trainer`), the output directory
(:mod:`clbench.engine.outputs`), the test sets and R's columns (:mod:`clbench.engine.columns`),
checkpoints (:mod:`clbench.engine.checkpoint`), the tests' crash points (:mod:`clbench.engine.faults`)
and the result (:mod:`clbench.results.assemble`). ``docs/engine.md`` draws how they fit together.

Evaluation runs under ``no_grad`` rather than inference mode (``inference_mode=False``): the
metric states live across ``validate`` and ``fit`` calls, and tensors created in inference mode
could not be updated in place during the validation that ``fit`` runs.

One ``Trainer`` serves the whole stream: each experience raises ``fit_loop.max_epochs`` by the
epochs per experience and calls ``fit`` again, so per-experience set-up costs one optimizer
construction, not a new Trainer. Lightning calls ``configure_optimizers`` on every ``fit``,
so optimizer state (e.g. Adam moments) starts fresh at each experience, as in Avalanche's
default; a strategy that needs state across experiences keeps it itself.

With ``train.eval_every_epoch`` evaluation runs after every epoch inside ``fit`` (the per-epoch
R matrix) and the last epoch's row is the experience's row, so no second pass is made.

Every stage re-seeds its generators from ``(seed, purpose, stage)`` (:mod:`clbench.engine.seeding`),
so a run resumed from the checkpoint after stage k is bit-identical to an uninterrupted one on
CPU; ``docs/reliability.md`` lists what a checkpoint holds and what a resume checks.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING
from clbench.engine.checkpoint import CHECKPOINT
from clbench.errors import NonFiniteLoss, NonFiniteScore, Unwritable, UserError, unwritable
from clbench.engine.outputs import RESULT, TENSORBOARD, OutputDir, check_output, remove_leftovers
from clbench.engine.precision import pinning, saved_precision
from clbench.engine.state import RunState
from clbench.engine.trainer import RESERVED_TRAINER_ARGS, end_process_group
from clbench.plugins.hooks import check_json, failure as hook_failure

if TYPE_CHECKING:
    from clbench.engine.evaluation import Evaluation

__all__ = ["CHECKPOINT", "RESULT", "TENSORBOARD", "RESERVED_TRAINER_ARGS", "ContinualRun", "run"]


class ContinualRun:
    """A configured run. ``execute()`` trains through the stream and returns the result dict."""

    def __init__(self, cfg: dict, output: Path | None, *, source: str = "config", resume: bool = False,
                 overwrite: bool = False, progress: bool | None = None):
        self.cfg = cfg
        self.output = Path(output) if output is not None else None
        self.path: Path | None = None  # where this run writes: output, or its staging folder
        self.source = source
        self.resume = resume
        self.overwrite = overwrite
        self.show_progress = cfg["logging"]["progress"] if progress is None else progress
        self.world_size, self.rank = 1, 0
        self.sharded = False  # parameters sharded (trainer.strategy: fsdp)
        self.precision = "32-true"  # the Trainer's, once built

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        from clbench.plugins import build
        from clbench.engine import checkpoint, pretrain, seeding
        from clbench.engine.columns import EvalColumns
        from clbench.engine.module import ContinualModule
        from clbench.data.streams import ordered_experiences, spec_of
        from clbench.metrics.routing_recording import RoutingRecording

        cfg, src = self.cfg, self.source
        seed = cfg["seed"]
        pretraining = pretrain.settings(cfg, src)  # checked before the stream is built
        seeding.seed_all(seeding.derive(seed, "build"))
        self.strategy = build.build_strategy(cfg, src)  # before the stream: it checks its arguments cheaply
        self.scenario = build.build_benchmark(cfg, src)
        self.spec = spec_of(self.scenario)
        self.experiences = ordered_experiences(self.scenario, cfg["order"], where=f"{src}: order")
        self.pretraining = pretrain.carve(pretraining, self.experiences, seed)  # held out of every experience
        if self.spec.scenario_type not in self.strategy.supports:
            raise UserError(f"strategy '{cfg['strategy']['class_path']}' does not support "
                            f"{self.spec.scenario_type} streams like '{self.spec.name}'", where=f"{src}: strategy",
                            fix=f"it supports: {', '.join(sorted(self.strategy.supports))}")
        self.objective = build.build_objective(cfg, self.spec, src)
        given = (f"objective '{cfg['objective']['class_path']}'" if cfg.get("objective")
                 else f"stream '{self.spec.name}' (objective {self.spec.objective})")
        build.check_requirements(cfg, type(self.strategy), type(self.objective), given, src)
        try:
            self.objective.setup(self.spec, self.experiences)
        except UserError as err:  # about one of its init_args: name the config file too
            raise build.locate_error(err, src) from None
        self.optimizer = build.optimizer_factory(cfg, src)
        self.scheduler = build.scheduler_factory(cfg, src)
        seeding.seed_all(seeding.derive(seed, "model"))
        model = build.build_model(cfg, self.spec, src, self.objective)
        self.objective.attach(model)
        # Reference models are rebuilt the same seeded way; the digest proves they start equal.
        self.initial_digest = checkpoint.digest(model.state_dict()) if cfg["metrics"]["reference_models"] else None
        self.frozen_base = checkpoint.FrozenBase(model)
        self.columns = EvalColumns(self.experiences, self.spec.global_test)
        self.module = ContinualModule(model, self.strategy, self.objective, optimizer=self.optimizer,
                                      scheduler=self.scheduler, columns=self.columns.scored_as)
        self.routing = RoutingRecording(self.columns.domains,
                                               max(exp.domain_id for exp in self.experiences) + 1)
        self.module.sharding_listeners.append(self.frozen_base)
        self.strategy.setup(self.module.context, self.experiences, seeding.derive(seed, "strategy"))
        self.strategy.adapt_model(self.module.context, 0)

    def make_loader(self, dataset, *, shuffle: bool, seed: int | None = None, batch_size: int | None = None, **kw):
        """A loader configured from ``train:``; under data parallelism each rank reads its shard."""
        from clbench.data.datasets import run_loader

        kw.setdefault("collate_fn", self.objective.collate(train=shuffle))
        return run_loader(self.cfg, dataset, shuffle=shuffle, seed=seed, batch_size=batch_size,
                          world_size=self.world_size, rank=self.rank, **kw)

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, trainer, loaders) -> "Evaluation":
        """One pass of the run's module over ``loaders`` (one per test column)."""
        from clbench.engine.stage import evaluate

        return evaluate(self, trainer, self.module, loaders)

    # -- the run --------------------------------------------------------------------------
    def execute(self) -> dict:
        """Run in the output directory (or its staging folder under ``--overwrite``), which is
        made the directory's run only once this one has succeeded."""
        from clbench.engine.trainer import SigintWatch

        directory = None
        if self.output is not None:
            directory = OutputDir(self.output, resume=self.resume, overwrite=self.overwrite)
            self.path = directory.open()
        try:
            with SigintWatch() as self.watch, pinning() as self.pin_precision:
                result = self._execute()
        except BaseException as err:
            if directory is not None:
                directory.abandon()
            end_process_group(only_gloo=True)
            reported = self._unwritable(err) or hook_failure(err, getattr(self, "strategy", None), self.source)
            if reported is not None:
                raise reported from None
            raise
        if directory is not None:
            directory.commit() if self.rank == 0 else directory.close()
        end_process_group()
        return result

    def _unwritable(self, err: BaseException) -> Unwritable | None:
        """A full or read-only disk, as one line that says the finished experiences are safe."""
        reported = err if isinstance(err, Unwritable) else unwritable(err, folder=self.output)
        if reported is None:
            return None
        if self.path is not None and (self.path / CHECKPOINT).exists():
            return Unwritable(reported.what, where=reported.where,
                              fix=f"{reported.fix} with --resume: the experiences finished before are checkpointed")
        return reported

    def _execute(self) -> dict:
        from clbench.engine import checkpoint
        from clbench.plugins.build import preflight
        from clbench.engine.trainer import (check_parallel_support, check_reserved, make_trainer, quiet_lightning,
                                     shards_parameters, start_process_group, trainer_args)

        clock = time.perf_counter()
        import lightning.pytorch  # noqa: F401  (imports are not the run's time)
        import torch  # noqa: F401

        import_seconds = time.perf_counter() - clock
        start = time.perf_counter()
        preflight(self.cfg, self.source)  # imports the components only; fails fast on a typo
        check_reserved(self.cfg, self.source)
        ckpt = checkpoint.read(self.path / CHECKPOINT, self.cfg, self.source) if self.resume else None
        if ckpt is not None:  # the later stages compute as the first ones did, on any machine
            self.pin_precision(saved_precision(ckpt))
        quiet_lightning()
        trainer_args(self.cfg, self.source)
        self._build()
        cfg = self.cfg
        epochs = cfg["train"]["epochs"]
        stages = [self.experiences[-1]] if self.strategy.single_stage else self.experiences
        from clbench.engine import faults

        callbacks, progress = [], None
        if self.show_progress:
            import sys

            from clbench.engine.progress import ContinualProgress, LineProgress

            # a live bar draws nothing into a file or pipe: lines there, with elapsed and estimated time
            progress = (ContinualProgress if sys.stderr.isatty() else LineProgress)(len(stages))
            callbacks.append(progress)
        callbacks.append(self.routing)
        callbacks.extend(faults.callbacks())  # CLBENCH_TEST_KILL_AT's crash points: none outside tests
        loggers = []
        if self.path is not None:
            from clbench.engine.loggers import build_loggers, logger_specs

            # On resume, TensorBoard hides what the killed process logged after the checkpoint.
            loggers = build_loggers(logger_specs(cfg["logging"], self.source), self.path, self.source,
                                    purge_step=ckpt["epoch"] if ckpt else None)
        if loggers:
            from lightning.pytorch.callbacks import LearningRateMonitor

            callbacks.append(LearningRateMonitor(logging_interval="step"))
        trainer = make_trainer(cfg, self.source, callbacks=callbacks, logger=loggers or False,
                               root=str(self.path) if self.path else None)
        check_parallel_support(trainer, self.strategy, self.module.model, cfg["strategy"]["class_path"], self.source)
        self.world_size, self.rank = trainer.world_size, trainer.global_rank
        self.precision = trainer.precision  # "32-true", or bf16-mixed (clbench.engine.precision)
        self.sharded = shards_parameters(trainer)
        writes = self.path is not None and trainer.is_global_zero
        if writes:
            remove_leftovers(self.path, resuming=ckpt is not None)  # the logger writes nothing before the first metric
        eval_loaders = [self.make_loader(data, shuffle=False) for data in self.columns.sets]

        state = RunState()
        if ckpt is not None:
            state = RunState.from_dict(checkpoint.restore(ckpt, self.module, self.strategy, trainer,
                                                                 self.frozen_base))
            state.resumes += 1
            if progress is not None:
                last = f" ({stages[state.stage - 1].name})" if state.stage and not self.strategy.single_stage else ""
                progress.console.print(f"resuming after experience {state.stage}/{len(stages)}{last}")
        wall_before = state.wall_seconds
        if state.r_init is None:
            if self.pretraining is not None:
                state.pretrain = self.pretraining.run(self, trainer, eval_loaders)
            t0 = time.perf_counter()
            state.r_init, state.global_init = self.columns.split(self.evaluate(trainer, eval_loaders).values)
            state.eval_seconds += time.perf_counter() - t0

        start_process_group(trainer, self.module)  # resumed: no evaluation above made it
        try:
            for stage in range(state.stage, len(stages)):
                self.watch.check()
                self._train_stage(trainer, stage, stages, eval_loaders, state, progress)
                check_json(self.strategy, f"{self.source}: strategy")  # what result.json holds, from the first stage
                state.wall_seconds = wall_before + time.perf_counter() - start
                if writes and stage == len(stages) - 1:
                    self.objective.save_outputs(self.path)  # e.g. the final stage's generations
                if writes or (self.sharded and self.path is not None):  # sharded: gathered by every rank
                    from clbench.engine.saved import save_after

                    save_after(self, stage, len(stages), write=writes)  # the weights others load
                    self._save_checkpoint(trainer, state, write=writes)
        finally:
            if progress is not None:
                progress.close()

        if cfg["metrics"]["reference_models"]:
            from clbench.engine.reference import reference_scores

            reference = reference_scores(self, epochs)
        else:
            reference = None
        from clbench.engine import pretrain
        from clbench.engine.summary import run_summary
        from clbench.results import assemble as results

        result = results.assemble(run_summary(self), asdict(state), reference,
                                  wall=wall_before + time.perf_counter() - start, import_seconds=import_seconds)
        pretrain.record(result, state)
        if loggers:
            from clbench.engine.loggers import log_result

            log_result(loggers, result)
        if writes:
            from clbench.io import json_text, write_json

            faults.before_result_write(trainer, self.path / RESULT, lambda h: h.write(json_text(result).encode()))
            write_json(self.path / RESULT, result)
            (self.path / CHECKPOINT).unlink(missing_ok=True)
        return result

    def _train_stage(self, trainer, stage: int, stages: list, eval_loaders: list, state: RunState, progress) -> None:
        """Train experience ``stages[stage]``, evaluate every column, append R's row."""
        from clbench.engine import seeding
        from clbench.engine.stage import fit_stage

        cfg, seed = self.cfg, self.cfg["seed"]
        epochs = cfg["train"]["epochs"]
        exp = stages[stage]
        label = exp.name if not self.strategy.single_stage else "joint"
        seeding.seed_all(seeding.derive(seed, "train", stage))
        self.module.experience = stage
        # routing records in training, per experience (none in joint training); N_eff's "old"
        # units: the test units of the experiences before this one (MH-MoE measures route
        # collisions on old tasks' tokens), none at the first stage or in joint training
        self.routing.training_domain = None if self.strategy.single_stage else exp.domain_id
        earlier = [] if self.strategy.single_stage else stages[:stage]
        self.routing.old_domains = {e.domain_id for e in earlier} - {exp.domain_id}
        self.strategy.adapt_model(self.module.context, stage + 1)
        self.strategy.before_experience(self.module.context, exp)
        self.begin_experience(exp)
        dataset = self.strategy.train_dataset(exp)
        loader_seed = seeding.derive(seed, "loader", stage)
        loader = self.strategy.train_loader(
            self.module.context, dataset,
            lambda ds, **kw: self.make_loader(ds, shuffle=True, seed=kw.pop("seed", loader_seed), **kw))
        first_epoch = trainer.current_epoch
        if progress is not None:
            progress.start_stage(stage, label, epochs, first_epoch)
        self.frozen_base.observe()
        t0 = time.perf_counter()
        try:
            epoch_evals = fit_stage(self, trainer, self.module, loader, epochs,
                                    val_loaders=eval_loaders if cfg["train"]["eval_every_epoch"] else None)
        except NonFiniteLoss as err:
            raise NonFiniteLoss(
                f"training diverged on experience {stage + 1}/{len(stages)} '{label}': loss became "
                f"{err.value} in epoch {trainer.current_epoch - first_epoch + 1}/{epochs}",
                where=self.source, fix="lower train.optimizer.init_args.lr, or check the data, the model "
                                       "and the strategy's loss") from None
        state.train_seconds += time.perf_counter() - t0
        state.train_routing.append(self.routing.take_training())
        if epoch_evals:
            evaluation = epoch_evals[-1]
            for epoch_eval in epoch_evals:
                state.epoch_rows.append(self.columns.split(epoch_eval.values)[0])
                state.epoch_stage.append(stage)
        else:
            t0 = time.perf_counter()
            evaluation = self.evaluate(trainer, eval_loaders)
            state.eval_seconds += time.perf_counter() - t0
        columns, global_ = self.columns.split(evaluation.values)
        self._check_finite(columns, stage, len(stages), label)
        state.rows.append(columns)
        state.global_rows.append(global_)
        if any(r is not None for r in evaluation.recalls):
            state.recall = {"columns": self.columns.per_experience(evaluation.recalls),
                            "global": self.columns.global_value(evaluation.recalls)}
        if self.routing.evaluation is not None:
            state.routing.append(evaluation.routing)
            state.compositions.append(evaluation.compositions)
        self.strategy.after_experience(self.module.context, exp)
        state.stage = stage + 1

    def begin_experience(self, exp, model=None) -> None:
        """The objective's per-experience set-up (class weights), then the model's, if it has
        one (``model.begin_experience(exp)``: e.g. routing prototypes from the experience's data;
        see :class:`clbench.models.protocol.ContinualModel`)."""
        from clbench.models.protocol import begin_experience

        self.objective.begin_experience(exp)
        begin_experience(self.module.model if model is None else model, exp)

    def _save_checkpoint(self, trainer, state: RunState, write: bool = True) -> None:
        """Everything needed to continue after ``state.stage`` experiences, written atomically
        (by global rank 0: ``write``; with sharded parameters every rank gathers them)."""
        import torch

        from clbench.engine import checkpoint, faults
        from clbench.io import torch_save

        payload = checkpoint.payload(self.cfg, self.module, self.strategy, trainer, asdict(state), self.source,
                                     self.frozen_base)
        if not write:
            return
        path = self.path / CHECKPOINT
        faults.before_checkpoint_write(trainer, state.stage - 1, path, lambda handle: torch.save(payload, handle))
        torch_save(path, payload)

    def _check_finite(self, columns: dict[str, list], stage: int, total: int, label: str) -> None:
        if any(v is None or math.isnan(v) for v in columns["primary"]):
            raise NonFiniteScore(f"evaluation after experience {stage + 1}/{total} '{label}' produced NaN "
                                f"{'/'.join(dict.fromkeys(self.module.primary))}",
                                where=self.source, fix="check the model's outputs and the test data")


def run(cfg: dict, output: str | Path | None = None, *, source: str = "config", resume: bool = False,
        overwrite: bool = False, progress: bool | None = None) -> dict:
    """Run ``cfg`` (a resolved config), write ``output/result.json``, return the result.

    ``resume`` continues from ``output/checkpoint.pt``; ``overwrite`` replaces a finished or
    unfinished run in ``output``, but only once the new run has succeeded.
    """
    output = Path(output) if output is not None else None
    check_output(output, resume=resume, overwrite=overwrite)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return ContinualRun(cfg, output, source=source, resume=resume, overwrite=overwrite, progress=progress).execute()
