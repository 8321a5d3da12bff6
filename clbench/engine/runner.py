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

The run is built once, by :func:`clbench.engine.parts.build_parts`; this module only loops over
the parts and is the only reader of the loop's state. What is learned and how it is scored
belongs to the objective (:mod:`clbench.objectives`): R's entries are each test column's primary
metric, in the objective's direction. The parts around the loop have modules of their own: the
Trainer (:mod:`clbench.engine.trainer`), the output directory
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

Every stage re-seeds its generators from ``(seed, purpose, stage)`` (:class:`clbench.seeding.Seeds`),
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
from clbench.errors import NonFiniteLoss, NonFiniteScore, Unwritable, unwritable
from clbench.engine.outputs import RESULT, TENSORBOARD, OutputDir, check_output, remove_leftovers
from clbench.engine.precision import pinning, saved_precision
from clbench.engine.state import RunState
from clbench.engine.trainer import RESERVED_TRAINER_ARGS, end_process_group
from clbench.plugins.hooks import check_json, failure as hook_failure

if TYPE_CHECKING:
    from clbench.engine.evaluation import Evaluation
    from clbench.engine.parts import RunParts

__all__ = ["CHECKPOINT", "RESULT", "TENSORBOARD", "RESERVED_TRAINER_ARGS", "ContinualRun", "run"]


class ContinualRun:
    """A configured run. ``execute()`` builds its parts (``parts``), trains them through the
    stream and returns the result dict."""

    def __init__(self, cfg: dict, output: Path | None, *, source: str = "config", resume: bool = False,
                 overwrite: bool = False, progress: bool | None = None):
        self.cfg = cfg
        self.output = Path(output) if output is not None else None
        self.path: Path | None = None  # where this run writes: output, or its staging folder
        self.source = source
        self.resume = resume
        self.overwrite = overwrite
        self.show_progress = cfg["logging"]["progress"] if progress is None else progress
        self.parts: RunParts | None = None  # once built
        self.rank = 0  # the Trainer's global rank, once it is built: rank 0 writes

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
            strategy = self.parts.strategy if self.parts is not None else None
            reported = self._unwritable(err) or hook_failure(err, strategy, self.source)
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
        from clbench.engine.parts import build_parts
        from clbench.plugins.build import preflight
        from clbench.engine.trainer import (check_parallel_support, check_reserved, make_trainer, quiet_lightning,
                                            shards_parameters, trainer_args)

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
        self.parts = parts = build_parts(self.cfg, self.source)
        callbacks, progress, loggers = self._callbacks(ckpt)
        trainer = make_trainer(self.cfg, self.source, callbacks=callbacks, logger=loggers or False,
                               root=str(self.path) if self.path else None)
        check_parallel_support(trainer, parts.strategy, parts.model, parts.config.strategy.class_path, self.source)
        self.rank = trainer.global_rank
        sharded = shards_parameters(trainer)
        writes = self.path is not None and trainer.is_global_zero
        if writes:
            remove_leftovers(self.path, resuming=ckpt is not None)  # the logger writes nothing before the first metric
        eval_loaders = [parts.loader(data, trainer, shuffle=False) for data in parts.columns.sets]

        try:
            with parts.module.resident():  # on its device from the first pass to the last stage
                state, wall_before = self._loop(trainer, eval_loaders, ckpt, progress, start=start,
                                                writes=writes, sharded=sharded)
        finally:
            if progress is not None:
                progress.close()
        return self._finish(trainer, state, loggers, writes, started=start - wall_before,
                            import_seconds=import_seconds)

    def _loop(self, trainer, eval_loaders: list, ckpt: dict | None, progress, *, start: float, writes: bool,
              sharded: bool) -> tuple[RunState, float]:
        """The scores before training, then every stage trained, evaluated and saved. Returns the
        state and the wall time an interrupted run had spent before this process (0 when fresh)."""
        from clbench.engine.trainer import start_process_group

        parts, stages = self.parts, self.parts.stages
        state = self._first_state(trainer, ckpt, eval_loaders, progress)
        wall_before = state.wall_seconds
        start_process_group(trainer, parts.module)  # resumed: no evaluation above made it
        for stage in range(state.stage, len(stages)):
            self.watch.check()
            self._train_stage(trainer, stage, eval_loaders, state, progress)
            check_json(parts.strategy, f"{self.source}: strategy")  # what result.json holds, from the first stage
            state.wall_seconds = wall_before + time.perf_counter() - start
            if writes and stage == len(stages) - 1:
                parts.objective.save_outputs(self.path)  # e.g. the final stage's generations
            if writes or (sharded and self.path is not None):  # sharded: gathered by every rank
                from clbench.engine.saved import save_after

                save_after(self.path, parts, stage, len(stages), write=writes)  # the weights others load
                self._save_checkpoint(trainer, state, write=writes)
        return state, wall_before

    def _callbacks(self, ckpt: dict | None) -> tuple[list, object, list]:
        """The Trainer's callbacks (progress, routing, the tests' crash points, the learning-rate
        monitor where something logs), the progress display (None) and the loggers."""
        from clbench.engine import faults

        callbacks, progress = [], None
        if self.show_progress:
            import sys

            from clbench.engine.progress import ContinualProgress, LineProgress

            # a live bar draws nothing into a file or pipe: lines there, with elapsed and estimated time
            progress = (ContinualProgress if sys.stderr.isatty() else LineProgress)(len(self.parts.stages))
            callbacks.append(progress)
        callbacks.append(self.parts.routing)
        callbacks.extend(faults.callbacks())  # CLBENCH_TEST_KILL_AT's crash points: none outside tests
        loggers = []
        if self.path is not None:
            from clbench.engine.loggers import build_loggers, logger_specs

            # On resume, TensorBoard hides what the killed process logged after the checkpoint.
            loggers = build_loggers(logger_specs(self.cfg["logging"], self.source), self.path, self.source,
                                    purge_step=ckpt["epoch"] if ckpt else None)
        if loggers:
            from lightning.pytorch.callbacks import LearningRateMonitor

            callbacks.append(LearningRateMonitor(logging_interval="step"))
        return callbacks, progress, loggers

    def _first_state(self, trainer, ckpt: dict | None, eval_loaders: list, progress) -> RunState:
        """The loop's state to start from: the checkpoint's on resume, else a fresh one with the
        scores before any training (``r_init``; after pretraining, when the config asks for it)."""
        from clbench.engine import checkpoint

        parts, stages = self.parts, self.parts.stages
        state = RunState()
        if ckpt is not None:
            state = RunState.from_dict(checkpoint.restore(ckpt, parts.module, parts.strategy, trainer,
                                                          parts.frozen_base))
            state.resumes += 1
            if progress is not None:
                last = f" ({stages[state.stage - 1].name})" if state.stage and not parts.strategy.single_stage else ""
                progress.console.print(f"resuming after experience {state.stage}/{len(stages)}{last}")
        if state.r_init is None:
            if parts.pretraining is not None:
                untrained = parts.columns.split(self._evaluate(trainer, eval_loaders).values)[0].primary
                state.pretrain = parts.pretraining.run(parts, self.watch, untrained)
            t0 = time.perf_counter()
            r_init, state.global_init = parts.columns.split(self._evaluate(trainer, eval_loaders).values)
            state.r_init = asdict(r_init)
            state.eval_seconds += time.perf_counter() - t0
        return state

    def _finish(self, trainer, state: RunState, loggers: list, writes: bool, *, started: float,
                import_seconds: float) -> dict:
        """After the last stage: the reference models, the result, and writing it (by rank 0).
        ``started``: when the run would have started, on this process's clock, had it never been
        interrupted (its wall time counts the reference models too)."""
        from clbench.engine import faults
        from clbench.engine.summary import run_summary
        from clbench.results import assemble as results

        reference = None
        if self.parts.config.metrics.reference_models:
            from clbench.engine.reference import reference_scores

            reference = reference_scores(self.parts, self.watch)
        result = results.assemble(run_summary(self.parts, trainer.precision), asdict(state), reference,
                                  wall=time.perf_counter() - started, import_seconds=import_seconds)
        if loggers:
            from clbench.engine.loggers import log_result

            log_result(loggers, result)
        if writes:
            from clbench.io import json_text, write_json

            faults.before_result_write(trainer, self.path / RESULT, lambda h: h.write(json_text(result).encode()))
            write_json(self.path / RESULT, result)
            (self.path / CHECKPOINT).unlink(missing_ok=True)
        return result

    def _evaluate(self, trainer, loaders) -> "Evaluation":
        """One pass of the run's module over ``loaders`` (one per test column)."""
        from clbench.engine.stage import evaluate

        return evaluate(trainer, self.parts.module, loaders, watch=self.watch)

    def _train_stage(self, trainer, stage: int, eval_loaders: list, state: RunState, progress) -> None:
        """Train the run's stage ``stage``, evaluate every column, append R's row."""
        from clbench.engine.stage import fit_stage

        parts = self.parts
        stages, strategy, context = parts.stages, parts.strategy, parts.module.context
        epochs = parts.config.train.epochs
        exp = stages[stage]
        label = exp.name if not strategy.single_stage else "joint"
        parts.seeds.train(stage)
        parts.module.experience = stage
        # routing records in training, per experience (none in joint training); N_eff's "old"
        # units: the test units of the experiences before this one (MH-MoE measures route
        # collisions on old tasks' tokens), none at the first stage or in joint training
        earlier = [] if strategy.single_stage else stages[:stage]
        parts.routing.begin_stage(None if strategy.single_stage else exp.domain_id,
                                  {e.domain_id for e in earlier} - {exp.domain_id})
        strategy.adapt_model(context, stage + 1)
        strategy.before_experience(context, exp)
        parts.begin_experience(exp)
        dataset = strategy.train_dataset(exp)
        loader_seed = parts.seeds.loader(stage)
        loader = strategy.train_loader(
            context, dataset,
            lambda ds, **kw: parts.loader(ds, trainer, shuffle=True, seed=kw.pop("seed", loader_seed), **kw))
        first_epoch = trainer.current_epoch
        if progress is not None:
            progress.start_stage(stage, label, epochs, first_epoch)
        parts.frozen_base.observe()
        t0 = time.perf_counter()
        try:
            epoch_evals = fit_stage(trainer, parts.module, loader, epochs, watch=self.watch,
                                    val_loaders=eval_loaders if parts.config.train.eval_every_epoch else None)
        except NonFiniteLoss as err:
            raise NonFiniteLoss(
                f"training diverged on experience {stage + 1}/{len(stages)} '{label}': loss became "
                f"{err.value} in epoch {trainer.current_epoch - first_epoch + 1}/{epochs}",
                where=self.source, fix="lower train.optimizer.init_args.lr, or check the data, the model "
                                       "and the strategy's loss") from None
        state.train_seconds += time.perf_counter() - t0
        state.train_routing.append(parts.routing.take_training())
        columns_of = parts.columns
        if epoch_evals:
            evaluation = epoch_evals[-1]
            for epoch_eval in epoch_evals:
                state.epoch_rows.append(asdict(columns_of.split(epoch_eval.values)[0]))
                state.epoch_stage.append(stage)
        else:
            t0 = time.perf_counter()
            evaluation = self._evaluate(trainer, eval_loaders)
            state.eval_seconds += time.perf_counter() - t0
        columns, global_ = columns_of.split(evaluation.values)
        self._check_finite(columns.primary, stage, len(stages), label)
        state.rows.append(asdict(columns))
        state.global_rows.append(global_)
        if any(r is not None for r in evaluation.recalls):
            state.recall = {"columns": columns_of.per_experience(evaluation.recalls),
                            "global": columns_of.global_value(evaluation.recalls)}
        if evaluation.routing:  # the model routes: per stage, every routing layer's figures
            state.routing.append(evaluation.routing)
            state.compositions.append(evaluation.compositions)
            state.routing_metrics.append(evaluation.routing_metrics)
        strategy.after_experience(context, exp)
        state.stage = stage + 1

    def _save_checkpoint(self, trainer, state: RunState, write: bool = True) -> None:
        """Everything needed to continue after ``state.stage`` experiences, written atomically
        (by global rank 0: ``write``; with sharded parameters every rank gathers them)."""
        import torch

        from clbench.engine import checkpoint, faults
        from clbench.io import torch_save

        parts = self.parts
        payload = checkpoint.payload(self.cfg, parts.module, parts.strategy, trainer, asdict(state), self.source,
                                     parts.frozen_base)
        if not write:
            return
        path = self.path / CHECKPOINT
        faults.before_checkpoint_write(trainer, state.stage - 1, path, lambda handle: torch.save(payload, handle))
        torch_save(path, payload)

    def _check_finite(self, primary: list, stage: int, total: int, label: str) -> None:
        if any(v is None or math.isnan(v) for v in primary):
            raise NonFiniteScore(f"evaluation after experience {stage + 1}/{total} '{label}' produced NaN "
                                f"{'/'.join(dict.fromkeys(self.parts.module.primary))}",
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
