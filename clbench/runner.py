"""One continual run, end to end: the loop lives here and only here.

::

    build stream (order applied), model, strategy, ContinualModule, one Trainer
    evaluate the untrained model on every test experience          -> r_init
    for each experience i (run order):
        strategy.before_experience
        Trainer.fit on strategy.train_loader(strategy.train_dataset(exp_i))
        evaluate on every test experience (future ones too)         -> R[i, :]
        strategy.after_experience
        checkpoint (model, strategy state, R so far, RNG, config)
    scores from R -> result.json

Evaluation runs under ``no_grad`` rather than inference mode (``inference_mode=False``): the
metric states live across ``validate`` and ``fit`` calls, and tensors created in inference mode
could not be updated in place during the validation that ``fit`` runs.

One ``Trainer`` serves the whole stream: each experience raises ``fit_loop.max_epochs`` by the
epochs per experience and calls ``fit`` again, so per-experience set-up costs one optimizer
construction, not a new Trainer. Lightning calls ``configure_optimizers`` on every ``fit``,
so optimizer state (e.g. Adam moments) starts fresh at each experience, as in Avalanche's
default; a strategy that needs state across experiences keeps it itself.

Evaluation is Lightning validation over one loader per test experience. With
``train.eval_every_epoch`` it runs after every epoch inside ``fit`` (the per-epoch R matrix) and
the last epoch's row is the experience's row, so no second pass is made.

Every stage re-seeds its generators from ``(seed, purpose, stage)``
(:mod:`clbench.seeding`), so a run resumed from the checkpoint after stage k is bit-identical
to an uninterrupted one on CPU.
"""

from __future__ import annotations

import copy
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

from clbench.config import SCHEMA_VERSION, config_hash, order_label
from clbench.errors import NonFiniteLoss, UserError

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"

# Trainer arguments the runner sets itself; a config may not override them.
_RESERVED_TRAINER_ARGS = ("max_epochs", "min_epochs", "callbacks", "logger", "enable_checkpointing",
                          "num_sanity_val_steps", "enable_progress_bar", "deterministic", "check_val_every_n_epoch",
                          "default_root_dir", "inference_mode")


def _quiet_lightning() -> None:
    import lightning.pytorch  # noqa: F401  (it sets its loggers to INFO when first imported)

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for pattern in (".*does not have many workers.*", ".*You defined a `validation_step` but have no.*",
                    ".*isinstance\\(treespec, LeafSpec\\).*", ".*LeafSpec.*", ".*GPU available but not used.*",
                    ".*The number of training batches.*", ".*Total length of .* across ranks is zero.*"):
        warnings.filterwarnings("ignore", message=pattern)


def prepare_output(output: Path | None, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a finished run; check the directory is writable."""
    if output is None:
        return
    if output.exists() and not output.is_dir():
        raise UserError(f"output path {output} is a file", where="--output", fix="give a directory path")
    if not resume and not overwrite:
        if (output / RESULT).exists():
            raise UserError(f"{output} already holds a finished run ({RESULT})", where="--output",
                            fix="choose another --output, or pass --overwrite to replace it")
        if (output / CHECKPOINT).exists():
            raise UserError(f"{output} holds an unfinished run ({CHECKPOINT})", where="--output",
                            fix="pass --resume to continue it, or --overwrite to start again")
    if resume and not (output / CHECKPOINT).exists():
        if (output / RESULT).exists():
            raise UserError(f"the run in {output} is already complete", where="--resume",
                            fix=f"read {output / RESULT}; nothing to resume")
        raise UserError(f"no checkpoint to resume in {output}", where="--resume",
                        fix="run without --resume to start it, or point --output at the interrupted run")
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / ".clbench-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UserError(f"cannot write to {output}: {err.strerror}", where="--output",
                        fix="choose a writable directory") from None


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out += _diff_keys(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [prefix or "<root>"]


def environment() -> dict[str, Any]:
    """Package versions, Python, platform, device and git commit, for the record."""
    import platform
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    import torch

    packages = {}
    for name in ("clbench", "torch", "lightning", "torchmetrics", "avalanche-lib", "timm", "transformers", "peft",
                 "numpy", "scikit-learn"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    commit = None
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": packages,
            "device": device, "cuda": torch.version.cuda if torch.cuda.is_available() else None,
            "git_commit": commit}


def _peak_memory_mb() -> dict[str, float | None]:
    import resource

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"cpu_peak_rss_mb": round(rss, 1), "gpu_peak_allocated_mb": round(gpu, 1) if gpu is not None else None}


class ContinualRun:
    """A configured run. ``execute()`` trains through the stream and returns the result dict."""

    def __init__(self, cfg: dict, output: Path | None, *, source: str = "config", resume: bool = False,
                 progress: bool | None = None):
        self.cfg = cfg
        self.output = Path(output) if output is not None else None
        self.source = source
        self.resume = resume
        self.show_progress = cfg["logging"]["progress"] if progress is None else progress

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        import torch

        from clbench import build, seeding
        from clbench.metrics import make_eval_metrics
        from clbench.module import ContinualModule
        from clbench.streams import ordered_experiences, spec_of

        cfg, src = self.cfg, self.source
        seed = cfg["seed"]
        seeding.seed_all(seeding.derive(seed, "build"))
        self.scenario = build.build_benchmark(cfg, src)
        self.spec = spec_of(self.scenario)
        self.experiences = ordered_experiences(self.scenario, cfg["order"], where=f"{src}: order")
        self.strategy = build.build_strategy(cfg, src)
        if self.spec.scenario_type not in self.strategy.supports:
            raise UserError(f"strategy '{cfg['strategy']['class_path']}' does not support "
                            f"{self.spec.scenario_type} streams like '{self.spec.name}'", where=f"{src}: strategy",
                            fix=f"it supports: {', '.join(sorted(self.strategy.supports))}")
        self.optimizer = build.optimizer_factory(cfg, src)
        seeding.seed_all(seeding.derive(seed, "model"))
        model = build.build_model(cfg, self.spec, src)
        self.initial_model_state = copy.deepcopy(model.state_dict()) if cfg["metrics"]["reference_models"] else None
        self.imbalance = self.spec.global_test is not None
        columns = len(self.experiences) + (1 if self.imbalance else 0)
        self.module = ContinualModule(model, self.strategy, num_classes=self.spec.num_classes, num_columns=columns,
                                      optimizer=self.optimizer,
                                      eval_metrics=lambda k: make_eval_metrics(k, imbalance=True))
        self._trainer_args()  # validate before any training starts
        self.strategy.setup(self.module, self.experiences, seeding.derive(seed, "strategy"))

    def _trainer_args(self) -> dict:
        import lightning.pytorch as pl

        from clbench.build import check_init_args

        args = dict(self.cfg["trainer"] or {})
        for key in args:
            if key in _RESERVED_TRAINER_ARGS:
                raise UserError(f"'{key}' is set by the runner", where=f"{self.source}: trainer.{key}",
                                fix="use train.epochs / train.eval_every_epoch instead, or remove it")
        check_init_args(pl.Trainer, args, f"{self.source}: trainer")
        return args

    def _make_trainer(self, callbacks: list, logger: Any) -> Any:
        import lightning.pytorch as pl

        return pl.Trainer(max_epochs=0, logger=logger, callbacks=callbacks, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                          deterministic=self.cfg["train"]["deterministic"], check_val_every_n_epoch=1,
                          inference_mode=False,
                          default_root_dir=str(self.output) if self.output else None, **self._trainer_args())

    def _loader(self, dataset, *, shuffle: bool, seed: int | None = None, batch_size: int | None = None, **kw):
        from clbench.data import make_loader

        train = self.cfg["train"]
        bs = batch_size or (train["batch_size"] if shuffle else train["eval_batch_size"])
        return make_loader(dataset, bs, shuffle=shuffle, seed=seed, num_workers=train["num_workers"],
                           pin_memory=self.cfg["trainer"].get("accelerator") not in ("cpu", None), **kw)

    # -- evaluation -----------------------------------------------------------------------
    def _evaluate(self, trainer, loaders) -> dict[str, list[float]]:
        trainer.validate(self.module, loaders, verbose=False)
        return self.module.last_eval

    def _split(self, evaluation: dict[str, list[float]]) -> tuple[dict[str, list[float]], dict[str, float]]:
        """Per-experience columns, and the global balanced test set's values (last column)."""
        T = len(self.experiences)
        columns = {k: v[:T] for k, v in evaluation.items()}
        global_ = {k: v[T] for k, v in evaluation.items()} if self.imbalance else {}
        return columns, global_

    def _reference_scores(self, stage_epochs: int) -> list[float]:
        """The thesis's reference models: the initial weights trained on experience j only."""
        import lightning.pytorch as pl

        from clbench import build, seeding
        from clbench.module import ContinualModule
        from clbench.strategy import Strategy

        scores = []
        for exp in self.experiences:
            seeding.seed_all(seeding.derive(self.cfg["seed"], "model"))
            model = build.build_model(self.cfg, self.spec, self.source)
            model.load_state_dict(self.initial_model_state)
            module = ContinualModule(model, Strategy(), num_classes=self.spec.num_classes, num_columns=1,
                                     optimizer=self.optimizer)
            trainer = pl.Trainer(max_epochs=stage_epochs, logger=False, enable_checkpointing=False,
                                 enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                                 deterministic=self.cfg["train"]["deterministic"], **self._trainer_args())
            seeding.seed_all(seeding.derive(self.cfg["seed"], "reference", exp.position))
            trainer.fit(module, self._loader(exp.train, shuffle=True,
                                             seed=seeding.derive(self.cfg["seed"], "reference-loader", exp.position)))
            trainer.validate(module, [self._loader(exp.test, shuffle=False)], verbose=False)
            scores.append(module.last_eval["acc"][0])
        return scores

    # -- checkpoints ----------------------------------------------------------------------
    def _save_checkpoint(self, state: dict) -> None:
        if self.output is None:
            return
        import random

        import numpy as np
        import torch

        from clbench.io import torch_save

        rng = {"python": list(random.getstate()[1]), "numpy": np.random.get_state()[1].tolist(),
               "torch": torch.get_rng_state()}
        torch_save(self.output / CHECKPOINT, {
            "schema": SCHEMA_VERSION, "config": self.cfg, "config_hash": config_hash(self.cfg),
            "model": self.module.model.state_dict(), "strategy": self.strategy.state_dict(), "rng": rng, **state})

    def _load_checkpoint(self) -> dict:
        import pickle

        import torch

        path = self.output / CHECKPOINT
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
            raise UserError(f"cannot read checkpoint {path}: {str(err).splitlines()[0]}", where="--resume",
                            fix="delete the output directory and rerun") from None
        if ckpt.get("schema") != SCHEMA_VERSION:
            raise UserError(f"checkpoint {path} has schema {ckpt.get('schema')}, expected {SCHEMA_VERSION}",
                            where="--resume", fix="rerun from scratch with this version")
        differing = _diff_keys(ckpt["config"], self.cfg)
        differing = [k for k in differing if not k.startswith("logging")]
        if differing:
            raise UserError(f"config differs from the checkpoint's at {', '.join(differing)}", where=self.source,
                            fix="resume with the same config, or start a new run in another --output")
        self.module.model.load_state_dict(ckpt["model"])
        self.strategy.load_state_dict(ckpt["strategy"])
        return ckpt

    # -- the loop -------------------------------------------------------------------------
    def execute(self) -> dict:
        import torch

        from clbench import seeding

        _quiet_lightning()
        start = time.perf_counter()
        self._build()
        cfg, seed = self.cfg, self.cfg["seed"]
        epochs = cfg["train"]["epochs"]
        T = len(self.experiences)
        stages = [self.experiences[-1]] if self.strategy.single_stage else self.experiences

        callbacks, progress = [], None
        if self.show_progress:
            from clbench.progress import ContinualProgress

            progress = ContinualProgress(len(stages))
            callbacks.append(progress)
        logger = False
        if self.output is not None and cfg["logging"]["tensorboard"]:
            from lightning.pytorch.loggers import TensorBoardLogger

            logger = TensorBoardLogger(save_dir=str(self.output), name="tensorboard", version="")
        trainer = self._make_trainer(callbacks, logger)
        eval_loaders = [self._loader(exp.test, shuffle=False) for exp in self.experiences]
        if self.imbalance:
            eval_loaders.append(self._loader(self.spec.global_test, shuffle=False))

        state: dict[str, Any] = {"stage": 0, "rows": [], "global_rows": [], "epoch_rows": [], "epoch_stage": [],
                                 "r_init": None, "global_init": None, "train_seconds": 0.0, "eval_seconds": 0.0}
        if self.resume:
            ckpt = self._load_checkpoint()
            state.update({k: ckpt[k] for k in state})
        if state["r_init"] is None:
            t0 = time.perf_counter()
            state["r_init"], state["global_init"] = self._split(self._evaluate(trainer, eval_loaders))
            state["eval_seconds"] += time.perf_counter() - t0

        eval_every_epoch = cfg["train"]["eval_every_epoch"]
        try:
            for stage in range(state["stage"], len(stages)):
                exp = stages[stage]
                seeding.seed_all(seeding.derive(seed, "train", stage))
                self.module.experience = stage
                self.strategy.before_experience(self.module, exp)
                dataset = self.strategy.train_dataset(exp)
                loader_seed = seeding.derive(seed, "loader", stage)
                loader = self.strategy.train_loader(
                    self.module, dataset,
                    lambda ds, **kw: self._loader(ds, shuffle=True, seed=kw.pop("seed", loader_seed), **kw))
                if progress is not None:
                    progress.start_stage(stage, exp.name if not self.strategy.single_stage else "joint", epochs,
                                         trainer.current_epoch)
                self.module.epoch_evals = []
                trainer.fit_loop.max_epochs = trainer.current_epoch + epochs
                t0 = time.perf_counter()
                trainer.fit(self.module, train_dataloaders=loader,
                            val_dataloaders=eval_loaders if eval_every_epoch else None)
                if self.module.epoch_evals:
                    evaluation = self.module.epoch_evals[-1]
                    for epoch_eval in self.module.epoch_evals:
                        columns, _ = self._split(epoch_eval)
                        state["epoch_rows"].append(columns)
                        state["epoch_stage"].append(stage)
                    state["train_seconds"] += time.perf_counter() - t0
                else:
                    state["train_seconds"] += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    evaluation = self._evaluate(trainer, eval_loaders)
                    state["eval_seconds"] += time.perf_counter() - t0
                columns, global_ = self._split(evaluation)
                self._check_finite(columns, exp)
                state["rows"].append(columns)
                state["global_rows"].append(global_)
                self.strategy.after_experience(self.module, exp)
                state["stage"] = stage + 1
                if trainer.is_global_zero:
                    self._save_checkpoint(state)
        finally:
            if progress is not None:
                progress.close()

        reference = None
        if cfg["metrics"]["reference_models"]:
            reference = self._reference_scores(epochs)
        result = self._result(state, reference, wall=time.perf_counter() - start)
        if logger:
            self._log_tensorboard(logger, result)
        if self.output is not None and trainer.is_global_zero:
            from clbench.io import write_json

            write_json(self.output / RESULT, result)
            (self.output / CHECKPOINT).unlink(missing_ok=True)
        return result

    def _check_finite(self, columns: dict[str, list[float]], exp) -> None:
        import math

        if any(math.isnan(v) for v in columns.get("acc", [])):
            raise NonFiniteLoss(f"evaluation produced NaN on experience '{exp.name}'")

    # -- results --------------------------------------------------------------------------
    def _result(self, state: dict, reference: list[float] | None, wall: float) -> dict:
        from clbench.metrics import cl_scores

        cfg = self.cfg
        names = [exp.name for exp in self.experiences]
        r = [row["acc"] for row in state["rows"]]
        r_init = state["r_init"]["acc"]
        if self.strategy.single_stage:
            scores = {"acc": sum(r[-1]) / len(r[-1])}
            scores.update({k: None for k in ("aia", "bwt", "fwt", "forgetting")})
        else:
            scores = cl_scores(r, r_init=r_init, reference=reference)
        matrices = {name: [row[name] for row in state["rows"]] for name in state["rows"][-1] if name != "acc"}
        for name, matrix in matrices.items():
            scores[f"{name}_final"] = sum(matrix[-1]) / len(matrix[-1])
        result: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "status": "ok",
            "benchmark": {"name": cfg["benchmark"]["class_path"], "init_args": cfg["benchmark"]["init_args"],
                          "scenario_type": self.spec.scenario_type, "num_classes": self.spec.num_classes},
            "model": {"name": cfg["model"]["class_path"], "init_args": cfg["model"]["init_args"],
                      "params_total": sum(p.numel() for p in self.module.model.parameters()),
                      "params_trainable": sum(p.numel() for p in self.module.model.parameters() if p.requires_grad)},
            "strategy": {"name": cfg["strategy"]["class_path"],
                         "class": f"{type(self.strategy).__module__}:{type(self.strategy).__qualname__}",
                         "params": self.strategy.hparams()},
            "seed": cfg["seed"],
            "order": cfg["order"],
            "order_label": order_label(cfg["order"]),
            "experiences": names,
            "r_matrix": r,
            "r_init": r_init,
            "matrices": matrices,
            "scores": scores,
        }
        if state["global_rows"] and state["global_rows"][-1]:
            result["global_test"] = {name: [row[name] for row in state["global_rows"]]
                                     for name in state["global_rows"][-1]}
            result["global_test_init"] = state["global_init"]
            for name, values in result["global_test"].items():
                scores[f"global_{name}"] = values[-1]
        if reference is not None:
            result["reference"] = reference
        if state["epoch_rows"]:
            result["r_epochs"] = [row["acc"] for row in state["epoch_rows"]]
            result["epoch_stage"] = state["epoch_stage"]
            result["epoch_scores"] = self._epoch_scores(result["r_epochs"], state["epoch_stage"], r_init, reference)
        result.update({
            "config": cfg,
            "config_hash": config_hash(cfg),
            "env": environment(),
            "compute": {"wall_seconds": round(wall, 3), "train_seconds": round(state["train_seconds"], 3),
                        "eval_seconds": round(state["eval_seconds"], 3), **_peak_memory_mb()},
        })
        return result

    def _epoch_scores(self, r_epochs, epoch_stage, r_init, reference) -> list[dict]:
        """Scores on the intermediate R matrix after every epoch (thesis appendix A.11).

        After an epoch of stage i, the matrix is the finished rows 0..i-1 plus the current
        epoch's row as row i; scores are computed on that (i+1) x (i+1) leading block, so they
        track how forgetting and intransigence evolve within an experience.
        """
        from clbench.metrics import cl_scores

        if self.strategy.single_stage:
            return []
        out = []
        finished: list[list[float]] = []
        for k, (row, stage) in enumerate(zip(r_epochs, epoch_stage)):
            if len(finished) < stage:  # rows of completed stages are their last epoch's rows
                finished.append(r_epochs[k - 1])
            block = [r[: stage + 1] for r in finished[:stage]] + [row[: stage + 1]]
            scores = cl_scores(block, r_init=r_init[: stage + 1],
                               reference=reference[: stage + 1] if reference else None)
            out.append({"epoch": k, "stage": stage, **scores})
        return out

    def _log_tensorboard(self, logger, result: dict) -> None:
        from clbench.plots import r_matrix_figure

        writer = logger.experiment
        for i, row in enumerate(result["r_matrix"]):
            for name, value in zip(result["experiences"], row):
                writer.add_scalar(f"eval/acc/{name}", value, i)
        for key, value in result["scores"].items():
            if isinstance(value, (int, float)):
                writer.add_scalar(f"scores/{key}", value, 0)
        for k, scores in enumerate(result.get("epoch_scores", [])):
            for key, value in scores.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "stage"):
                    writer.add_scalar(f"epoch_scores/{key}", value, k)
        writer.add_figure("r_matrix", r_matrix_figure(result), 0)
        writer.flush()


def run(cfg: dict, output: str | Path | None = None, *, source: str = "config", resume: bool = False,
        overwrite: bool = False, progress: bool | None = None) -> dict:
    """Run ``cfg`` (a resolved config), write ``output/result.json``, return the result."""
    output = Path(output) if output is not None else None
    prepare_output(output, resume=resume, overwrite=overwrite)
    if overwrite and output is not None:
        (output / CHECKPOINT).unlink(missing_ok=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return ContinualRun(cfg, output, source=source, resume=resume, progress=progress).execute()
