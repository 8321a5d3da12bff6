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
to an uninterrupted one on CPU. The checkpoint also restores the global RNG states and the
Trainer's epoch and step counters (Lightning draws from the global generator depending on
them); ``docs/reliability.md`` lists what a checkpoint holds and what a resume checks.
"""

from __future__ import annotations

import copy
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

from clbench.config import NON_SEMANTIC, SCHEMA_VERSION, canonical_json, config_hash, order_label
from clbench.errors import NonFiniteLoss, UserError, did_you_mean

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"
TENSORBOARD = "tensorboard"
# Version of the checkpoint layout; a checkpoint of another version is refused, not misread.
CHECKPOINT_SCHEMA = 2

# Trainer arguments the runner sets itself; a config may not override them.
_RESERVED_TRAINER_ARGS = ("max_epochs", "min_epochs", "callbacks", "logger", "enable_checkpointing",
                          "num_sanity_val_steps", "enable_progress_bar", "deterministic", "check_val_every_n_epoch",
                          "default_root_dir", "inference_mode", "use_distributed_sampler")


def _quiet_lightning() -> None:
    import lightning.pytorch  # noqa: F401  (it sets its loggers to INFO when first imported)

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for pattern in (".*does not have many workers.*", ".*You defined a `validation_step` but have no.*",
                    ".*isinstance\\(treespec, LeafSpec\\).*", ".*LeafSpec.*", ".*GPU available but not used.*",
                    ".*The number of training batches.*", ".*Total length of .* across ranks is zero.*"):
        warnings.filterwarnings("ignore", message=pattern)


def prepare_output(output: Path | None, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a finished run; check the directory is writable. Deletes nothing."""
    if output is None:
        if resume:
            raise UserError("nothing to resume without an output directory", where="--resume",
                            fix="give the interrupted run's --output")
        return
    if resume and overwrite:
        raise UserError("--resume continues the run in --output, --overwrite starts it again", where="--resume",
                        fix="pass one of them, not both")
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


def _lookup(cfg: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        cfg = cfg.get(key) if isinstance(cfg, dict) else None
    return cfg


def _plain_config(cfg: dict) -> dict:
    """The config as JSON sees it (tuples become lists), for storing and comparing."""
    import json

    from clbench.config import canonical_json

    return json.loads(canonical_json(cfg))


# Types ``torch.load(weights_only=True)`` reads back (besides tensors and containers).
_SAFE_LEAVES = (int, float, bool, str, bytes, bytearray, complex, type(None))


def _unsafe_path(value: Any, path: str = "") -> str | None:
    """The first place in ``value`` holding something a weights-only load would refuse."""
    import collections

    import torch

    kind = type(value)
    if kind in _SAFE_LEAVES or kind in (torch.Tensor, torch.nn.Parameter, torch.Size, torch.device, torch.dtype):
        return None
    if kind in (dict, collections.OrderedDict, collections.Counter):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            found = _unsafe_path(key, sub + " (key)") or _unsafe_path(item, sub)
            if found:
                return found
        return None
    if kind in (list, tuple, set):
        for i, item in enumerate(value):
            found = _unsafe_path(item, f"{path}[{i}]")
            if found:
                return found
        return None
    return f"{path or '<root>'} ({kind.__module__}.{kind.__qualname__})"


def _rng_states() -> dict:
    """Python, numpy, torch (and CUDA) global generator states, as tensors and plain values."""
    import random

    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": {"version": version, "state": list(internal), "gauss": gauss},
            "numpy": {"kind": kind, "keys": [int(k) for k in keys], "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached": float(cached)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized()
            else []}


def _set_rng_states(rng: dict) -> None:
    import random

    import numpy as np
    import torch

    py = rng["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npy = rng["numpy"]
    np.random.set_state((npy["kind"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached"]))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _restore_loop(trainer, state: dict) -> None:
    """Put the Trainer's epoch and step counters where the checkpointed one left them.

    A checkpoint is taken between two ``fit`` calls, never inside an epoch, so the loops must
    then behave as the uninterrupted Trainer's would at that point, not as Lightning's
    mid-epoch restart: the restart flags that ``load_state_dict`` raises are cleared.
    """
    from lightning.pytorch.loops.loop import _Loop

    trainer.fit_loop.load_state_dict(state)
    loops = [trainer.fit_loop]
    while loops:
        loop = loops.pop()
        loop.on_iteration_done()
        loops.extend(v for v in vars(loop).values() if isinstance(v, _Loop))


def _interruptible(trainer, call, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` (a Trainer entry point), with Ctrl-C kept a KeyboardInterrupt.

    Lightning answers Ctrl-C inside ``fit``/``validate`` with ``sys.exit(1)`` (and ignores
    SIGINT from then on), which would bypass the CLI's message and the leaderboard's
    bookkeeping; the last checkpoint is intact either way.
    """
    import signal

    try:
        return call(*args, **kwargs)
    except SystemExit:
        if not trainer.interrupted:
            raise
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:  # not the main thread
            pass
        raise KeyboardInterrupt from None


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
    commit = dirty = None
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=5).stdout.strip() or None
        if commit:
            dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                        capture_output=True, text=True, timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    # torch_threads is recorded because CPU results depend on it (reduction order).
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": packages,
            "device": device, "cuda": torch.version.cuda if torch.cuda.is_available() else None,
            "torch_threads": torch.get_num_threads(), "git_commit": commit, "git_dirty": dirty}


def _peak_memory_mb() -> dict[str, float | None]:
    import resource

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"cpu_peak_rss_mb": round(rss, 1), "gpu_peak_allocated_mb": round(gpu, 1) if gpu is not None else None}


def _finite_or_none(value: Any) -> Any:
    """NaN/Inf (a score undefined on this data, e.g. MAUC on a one-class test set) -> None,
    so result.json is strict JSON and readers see ``null`` for "undefined"."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


class ContinualRun:
    """A configured run. ``execute()`` trains through the stream and returns the result dict."""

    def __init__(self, cfg: dict, output: Path | None, *, source: str = "config", resume: bool = False,
                 overwrite: bool = False, progress: bool | None = None):
        from clbench import faults

        self.cfg = cfg
        self.output = Path(output) if output is not None else None
        self.source = source
        self.resume = resume
        self.overwrite = overwrite
        self.show_progress = cfg["logging"]["progress"] if progress is None else progress
        self.kill = faults.kill_point()  # crash injection for the resume tests; None unless asked for

    # -- building -------------------------------------------------------------------------
    def _build(self) -> None:
        from clbench import build, seeding
        from clbench.metrics import make_eval_metrics
        from clbench.module import ContinualModule
        from clbench.streams import ordered_experiences, spec_of

        cfg, src = self.cfg, self.source
        seed = cfg["seed"]
        seeding.seed_all(seeding.derive(seed, "build"))
        self.strategy = build.build_strategy(cfg, src)  # before the stream: it checks its arguments cheaply
        self.scenario = build.build_benchmark(cfg, src)
        self.spec = spec_of(self.scenario)
        self.experiences = ordered_experiences(self.scenario, cfg["order"], where=f"{src}: order")
        if self.spec.scenario_type not in self.strategy.supports:
            raise UserError(f"strategy '{cfg['strategy']['class_path']}' does not support "
                            f"{self.spec.scenario_type} streams like '{self.spec.name}'", where=f"{src}: strategy",
                            fix=f"it supports: {', '.join(sorted(self.strategy.supports))}")
        self.optimizer = build.optimizer_factory(cfg, src)
        seeding.seed_all(seeding.derive(seed, "model"))
        model = build.build_model(cfg, self.spec, src)
        self.initial_model_state = copy.deepcopy(model.state_dict()) if cfg["metrics"]["reference_models"] else None
        self.imbalance = self.spec.global_test is not None
        # Experiences that share one test set (CORe50's NI protocol) are evaluated once.
        self.test_sets: list = []
        self.column_of: list[int] = []
        for exp in self.experiences:
            found = next((i for i, data in enumerate(self.test_sets) if data is exp.test), None)
            if found is None:
                self.test_sets.append(exp.test)
                found = len(self.test_sets) - 1
            self.column_of.append(found)
        # Routing is attributed to a test set's domain only when the set belongs to one experience.
        domains = [self.experiences[self.column_of.index(i)].domain_id if self.column_of.count(i) == 1 else None
                   for i in range(len(self.test_sets))]
        self.module = ContinualModule(model, self.strategy, num_classes=self.spec.num_classes,
                                      num_columns=len(self.test_sets) + (1 if self.imbalance else 0),
                                      optimizer=self.optimizer,
                                      eval_metrics=lambda k: make_eval_metrics(k, imbalance=True),
                                      column_domains=domains + ([None] if self.imbalance else []))
        self.strategy.setup(self.module, self.experiences, seeding.derive(seed, "strategy"))

    def _reserved_trainer_args(self) -> None:
        for key in self.cfg["trainer"] or {}:
            if key in _RESERVED_TRAINER_ARGS:
                raise UserError(f"'{key}' is set by the runner", where=f"{self.source}: trainer.{key}",
                                fix="use train.epochs / train.eval_every_epoch instead, or remove it")

    def _trainer_args(self) -> dict:
        import inspect

        import lightning.pytorch as pl

        from clbench.build import check_init_args

        self._reserved_trainer_args()
        args = dict(self.cfg["trainer"] or {})
        allowed = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self", *_RESERVED_TRAINER_ARGS}
        for key in args:
            if key not in allowed:  # suggest only what a config may set
                raise UserError(f"unknown Trainer argument '{key}'", where=f"{self.source}: trainer.{key}",
                                fix=did_you_mean(key, allowed))
        check_init_args(pl.Trainer, args, f"{self.source}: trainer")
        return args

    def _make_trainer(self, callbacks: list, logger: Any) -> Any:
        import lightning.pytorch as pl

        return pl.Trainer(max_epochs=0, logger=logger, callbacks=callbacks, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                          deterministic=self.cfg["train"]["deterministic"], check_val_every_n_epoch=1,
                          inference_mode=False, use_distributed_sampler=False,
                          default_root_dir=str(self.output) if self.output else None, **self._trainer_args())

    def _check_parallel_support(self, trainer) -> None:
        """Fail fast when the strategy cannot run under the Trainer's parallelism."""
        self.world_size, self.rank = trainer.world_size, trainer.global_rank
        name = self.cfg["strategy"]["class_path"]
        sharded = type(trainer.strategy).__name__ in ("FSDPStrategy", "ModelParallelStrategy", "DeepSpeedStrategy")
        if sharded and not self.strategy.supports_sharded:
            kind = type(trainer.strategy).__name__
            raise UserError(f"strategy '{name}' does not support sharded parameters ({kind})",
                            where=f"{self.source}: trainer.strategy", fix="use trainer.strategy: ddp for this method")
        if self.world_size > 1 and not self.strategy.supports_distributed:
            raise UserError(f"strategy '{name}' does not support data-parallel training ({self.world_size} processes)",
                            where=f"{self.source}: trainer", fix="run it on one device (trainer.devices: 1)")

    def _loader(self, dataset, *, shuffle: bool, seed: int | None = None, batch_size: int | None = None, **kw):
        """A configured loader; under data parallelism each rank reads its own shard.

        Sharding is done here rather than by Lightning (``use_distributed_sampler=False``):
        training shards come from a seeded ``DistributedSampler``; evaluation shards from
        ``UnrepeatedDistributedSampler``, which never pads, so no test sample is counted twice
        when the per-rank metric states are summed.
        """
        import torch

        from clbench.data import make_loader

        train = self.cfg["train"]
        bs = batch_size or (train["batch_size"] if shuffle else train["eval_batch_size"])
        world = getattr(self, "world_size", 1)  # set from the Trainer; reference runs reuse it
        if world > 1 and "sampler" not in kw:
            from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
            from torch.utils.data import DistributedSampler

            if shuffle:
                kw["sampler"] = DistributedSampler(dataset, num_replicas=world, rank=self.rank, shuffle=True,
                                                   seed=seed or 0)
            else:
                kw["sampler"] = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=self.rank,
                                                             shuffle=False)
        pin = torch.cuda.is_available() and self.cfg["trainer"].get("accelerator") != "cpu"
        # Evaluation loaders do not keep workers alive: with one loader per test experience,
        # persistent workers would hold T x num_workers processes between evaluations.
        kw.setdefault("persistent_workers", shuffle)
        return make_loader(dataset, bs, shuffle=shuffle, seed=seed, num_workers=train["num_workers"],
                           pin_memory=pin, **kw)

    # -- evaluation -----------------------------------------------------------------------
    def _evaluate(self, trainer, loaders) -> dict[str, list[float]]:
        _interruptible(trainer, trainer.validate, self.module, loaders, verbose=False)
        self._stop_if_interrupted()
        return self.module.last_eval

    def _split(self, evaluation: dict[str, list[float]]) -> tuple[dict[str, list[float]], dict[str, float]]:
        """Per-experience columns (shared test sets fanned out), and the global balanced test
        set's values (the last loader)."""
        columns = {k: [v[i] for i in self.column_of] for k, v in evaluation.items()}
        global_ = {k: v[len(self.test_sets)] for k, v in evaluation.items()} if self.imbalance else {}
        return columns, global_

    def _reference_scores(self, stage_epochs: int) -> list[float]:
        """The thesis's reference models: the initial weights trained on experience j only.

        Reference j uses the same epochs and the same seeds (training and loader) as stage j of
        the continual run, so the two differ only in their starting weights; intransigence
        then measures what the earlier experiences did, not seed noise. (The thesis seeds its
        baselines with a separate key; this is the controlled version of that comparison.)
        """
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
                                 deterministic=self.cfg["train"]["deterministic"], inference_mode=False,
                                 use_distributed_sampler=False, **self._trainer_args())
            seeding.seed_all(seeding.derive(self.cfg["seed"], "train", exp.position))
            _interruptible(trainer, trainer.fit, module,
                           self._loader(exp.train, shuffle=True,
                                        seed=seeding.derive(self.cfg["seed"], "loader", exp.position)))
            _interruptible(trainer, trainer.validate, module, [self._loader(exp.test, shuffle=False)], verbose=False)
            scores.append(module.last_eval["acc"][0])
        return scores

    # -- checkpoints ----------------------------------------------------------------------
    def _save_checkpoint(self, trainer, state: dict) -> None:
        """Everything needed to continue after ``state['stage']`` experiences, written atomically."""
        import torch

        from clbench import faults
        from clbench.io import torch_save

        payload = {"schema": CHECKPOINT_SCHEMA, "config_json": canonical_json(self.cfg),
                   "config_hash": config_hash(self.cfg), "model": self.module.model.state_dict(),
                   "strategy": self.strategy.state_dict(), "rng": _rng_states(),
                   "loop": trainer.fit_loop.state_dict(), "epoch": trainer.current_epoch, "state": state}
        unsafe = _unsafe_path(payload["strategy"])
        if unsafe:
            raise UserError(f"strategy state holds a value a checkpoint cannot store at {unsafe}",
                            where=f"{self.source}: strategy",
                            fix="return only tensors and plain Python values (int, float, str, list, dict) "
                                "from the strategy's state_dict")
        unsafe = _unsafe_path(payload)
        if unsafe:
            raise TypeError(f"checkpoint holds an unstorable value at {unsafe}")
        path = self.output / CHECKPOINT
        if self.kill is not None and self.kill.where == "checkpoint" and self.kill.stage == state["stage"] - 1:
            faults.interrupted_write(path, lambda handle: torch.save(payload, handle))
        torch_save(path, payload)

    def _read_checkpoint(self) -> dict:
        """The checkpoint in ``output``, refused (before anything is built) if its config differs."""
        import json

        import torch

        path = self.output / CHECKPOINT
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # a damaged file can fail in many ways inside the unpickler
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(f"cannot read checkpoint {path}, it is damaged or not a clbench checkpoint ({reason})",
                            where="--resume",
                            fix="delete the output directory and rerun without --resume") from None
        schema = ckpt.get("schema") if isinstance(ckpt, dict) else None
        if schema != CHECKPOINT_SCHEMA:
            raise UserError(f"checkpoint {path} has format {schema}, this clbench writes {CHECKPOINT_SCHEMA}",
                            where="--resume", fix="rerun without --resume (with --overwrite) to start again")
        missing = [k for k in ("config_json", "model", "strategy", "rng", "loop", "epoch", "state") if k not in ckpt]
        if missing:
            raise UserError(f"checkpoint {path} lacks {', '.join(missing)}", where="--resume",
                            fix="rerun without --resume (with --overwrite) to start again")
        saved = json.loads(ckpt["config_json"])
        current = _plain_config(self.cfg)
        differing = [k for k in _diff_keys(saved, current) if k.split(".")[0] not in NON_SEMANTIC]
        if differing:
            shown = "; ".join(f"{k}: checkpoint {_lookup(saved, k)!r}, now {_lookup(current, k)!r}"
                              for k in differing[:4])
            more = f" and {len(differing) - 4} more" if len(differing) > 4 else ""
            raise UserError(f"config differs from the checkpoint's at {', '.join(differing)} ({shown}{more})",
                            where=self.source,
                            fix="resume with the config the run started with, or start a new run in another --output")
        return ckpt

    def _restore(self, ckpt: dict, trainer) -> dict:
        """Strategy, model, trainer counters and RNG states as they were at the checkpoint."""
        # The strategy first: one that grows the model re-creates its modules before the weights load.
        self.strategy.load_state_dict(ckpt["strategy"])
        self.module.model.load_state_dict(ckpt["model"])
        _restore_loop(trainer, ckpt["loop"])
        _set_rng_states(ckpt["rng"])
        return ckpt["state"]

    def _clear_previous(self) -> None:
        """Remove what a replaced or crashed earlier run left (never before the new one is built)."""
        from clbench.io import remove_stale_temporaries

        for name in (CHECKPOINT, RESULT):
            remove_stale_temporaries(self.output, name)
        if self.resume:
            return
        for name in (CHECKPOINT, RESULT):  # only present with --overwrite
            (self.output / name).unlink(missing_ok=True)
        tensorboard = self.output / TENSORBOARD
        for stale in (*tensorboard.glob("events.out.tfevents.*"), tensorboard / "hparams.yaml"):
            stale.unlink(missing_ok=True)

    # -- the loop -------------------------------------------------------------------------
    def _watch_sigint(self):
        """Remember Ctrl-C, so that one Python swallows (raised inside a garbage-collector or
        ``__del__`` callback, where exceptions are only reported) still stops the run at the
        next check, without that report's traceback. Returns what to put back, or None."""
        import signal
        import sys
        import threading

        self._interrupted = False
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.default_int_handler:
            return None  # the caller handles SIGINT its own way
        previous_hook = sys.unraisablehook

        def handler(signum, frame):
            self._interrupted = True
            raise KeyboardInterrupt

        def unraisable(report) -> None:
            if not isinstance(report.exc_value, KeyboardInterrupt):
                previous_hook(report)

        signal.signal(signal.SIGINT, handler)
        sys.unraisablehook = unraisable
        return previous, previous_hook

    def _stop_if_interrupted(self) -> None:
        if getattr(self, "_interrupted", False):
            raise KeyboardInterrupt

    def execute(self) -> dict:
        import signal
        import sys

        previous = self._watch_sigint()
        try:
            return self._execute()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous[0])
                sys.unraisablehook = previous[1]

    def _execute(self) -> dict:
        from clbench import faults, seeding
        from clbench.build import preflight

        start = time.perf_counter()
        preflight(self.cfg, self.source)  # imports the components only; fails fast on a typo
        self._reserved_trainer_args()
        ckpt = self._read_checkpoint() if self.resume else None
        _quiet_lightning()
        self._trainer_args()
        self._build()
        cfg, seed = self.cfg, self.cfg["seed"]
        epochs = cfg["train"]["epochs"]
        stages = [self.experiences[-1]] if self.strategy.single_stage else self.experiences
        callbacks, progress = [], None
        if self.show_progress:
            from clbench.progress import ContinualProgress

            progress = ContinualProgress(len(stages))
            callbacks.append(progress)
        if self.kill is not None:
            kill = faults.callback(self.kill)
            if kill is not None:
                callbacks.append(kill)
        logger = False
        if self.output is not None and cfg["logging"]["tensorboard"]:
            from lightning.pytorch.loggers import TensorBoardLogger

            # On resume, TensorBoard hides what the killed process logged after the checkpoint.
            logger = TensorBoardLogger(save_dir=str(self.output), name=TENSORBOARD, version="",
                                       **({"purge_step": ckpt["epoch"]} if ckpt else {}))
        trainer = self._make_trainer(callbacks, logger)
        self._check_parallel_support(trainer)
        writes = self.output is not None and trainer.is_global_zero
        if writes:
            self._clear_previous()  # the logger writes nothing before the first metric
        eval_loaders = [self._loader(data, shuffle=False) for data in self.test_sets]
        if self.imbalance:
            eval_loaders.append(self._loader(self.spec.global_test, shuffle=False))

        state: dict[str, Any] = {"stage": 0, "rows": [], "global_rows": [], "epoch_rows": [], "epoch_stage": [],
                                 "r_init": None, "global_init": None, "train_seconds": 0.0, "eval_seconds": 0.0,
                                 "wall_seconds": 0.0, "resumes": 0, "routing": []}
        if ckpt is not None:
            state.update(self._restore(ckpt, trainer))
            state["resumes"] += 1
            if progress is not None:
                done = state["stage"]
                last = f" ({stages[done - 1].name})" if done and not self.strategy.single_stage else ""
                progress.console.print(f"resuming after experience {done}/{len(stages)}{last}")
        wall_before = state["wall_seconds"]
        if state["r_init"] is None:
            t0 = time.perf_counter()
            state["r_init"], state["global_init"] = self._split(self._evaluate(trainer, eval_loaders))
            state["eval_seconds"] += time.perf_counter() - t0

        eval_every_epoch = cfg["train"]["eval_every_epoch"]
        try:
            for stage in range(state["stage"], len(stages)):
                self._stop_if_interrupted()
                exp = stages[stage]
                label = exp.name if not self.strategy.single_stage else "joint"
                seeding.seed_all(seeding.derive(seed, "train", stage))
                self.module.experience = stage
                self.strategy.before_experience(self.module, exp)
                dataset = self.strategy.train_dataset(exp)
                loader_seed = seeding.derive(seed, "loader", stage)
                loader = self.strategy.train_loader(
                    self.module, dataset,
                    lambda ds, **kw: self._loader(ds, shuffle=True, seed=kw.pop("seed", loader_seed), **kw))
                first_epoch = trainer.current_epoch
                if progress is not None:
                    progress.start_stage(stage, label, epochs, first_epoch)
                self.module.epoch_evals = []
                trainer.fit_loop.max_epochs = first_epoch + epochs
                t0 = time.perf_counter()
                try:
                    _interruptible(trainer, trainer.fit, self.module, train_dataloaders=loader,
                                   val_dataloaders=eval_loaders if eval_every_epoch else None)
                    self._stop_if_interrupted()
                except NonFiniteLoss as err:
                    raise NonFiniteLoss(
                        f"training diverged on experience {stage + 1}/{len(stages)} '{label}': loss became "
                        f"{err.value} in epoch {trainer.current_epoch - first_epoch + 1}/{epochs}",
                        where=self.source, fix="lower train.optimizer.init_args.lr, or check the data, the model "
                                               "and the strategy's loss") from None
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
                self._check_finite(columns, stage, len(stages), label)
                state["rows"].append(columns)
                state["global_rows"].append(global_)
                if self.module.routing is not None:
                    state["routing"].append(self.module.last_routing)
                self.strategy.after_experience(self.module, exp)
                state["stage"] = stage + 1
                state["wall_seconds"] = wall_before + time.perf_counter() - start
                if writes:
                    self._save_checkpoint(trainer, state)
        finally:
            if progress is not None:
                progress.close()

        reference = None
        if cfg["metrics"]["reference_models"]:
            reference = self._reference_scores(epochs)
        result = self._result(state, reference, wall=wall_before + time.perf_counter() - start)
        if logger:
            self._log_tensorboard(logger, result)
        if writes:
            from clbench.io import json_text, write_json

            if self.kill is not None and self.kill.where == "result":
                faults.interrupted_write(self.output / RESULT, lambda h: h.write(json_text(result).encode()))
            write_json(self.output / RESULT, result)
            (self.output / CHECKPOINT).unlink(missing_ok=True)
        return result

    def _check_finite(self, columns: dict[str, list[float]], stage: int, total: int, label: str) -> None:
        import math

        if any(math.isnan(v) for v in columns.get("acc", [])):
            raise NonFiniteLoss(f"evaluation after experience {stage + 1}/{total} '{label}' produced NaN accuracy",
                                where=self.source, fix="check the model's outputs and the test data")

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
        if state.get("routing"):
            # per stage, per MoE layer: utilization[d][e] (fraction of domain d's units routed to
            # expert e), routing entropy and load imbalance (clbench.metrics.ExpertUtilization)
            result["expert_utilization"] = state["routing"]
        if state["epoch_rows"]:
            result["r_epochs"] = [row["acc"] for row in state["epoch_rows"]]
            result["epoch_stage"] = state["epoch_stage"]
            result["epoch_scores"] = self._epoch_scores(result["r_epochs"], state["epoch_stage"], r_init, reference)
        result.update({
            "config": cfg,
            "config_hash": config_hash(cfg),
            "env": environment(),
            "compute": {"wall_seconds": round(wall, 3), "train_seconds": round(state["train_seconds"], 3),
                        "eval_seconds": round(state["eval_seconds"], 3), "resumes": state["resumes"],
                        **_peak_memory_mb()},
        })
        return _finite_or_none(result)

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
    """Run ``cfg`` (a resolved config), write ``output/result.json``, return the result.

    ``resume`` continues from ``output/checkpoint.pt``; ``overwrite`` replaces a finished or
    unfinished run in ``output`` (its files are removed only once the new run is built).
    """
    output = Path(output) if output is not None else None
    prepare_output(output, resume=resume, overwrite=overwrite)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return ContinualRun(cfg, output, source=source, resume=resume, overwrite=overwrite, progress=progress).execute()
