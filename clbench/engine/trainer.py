"""The Lightning Trainer of a run: which arguments a config may set, how it is built, how
Ctrl-C reaches the user as Ctrl-C.

The runner fixes the Trainer arguments that its loop depends on (``RESERVED_TRAINER_ARGS``);
everything else under ``trainer:`` in a config goes to ``lightning.pytorch.Trainer`` as is.
An argument Lightning refuses (``precision: 7``, ``accelerator: gpu`` on a machine without
one) is reported as one line naming the config field, not as Lightning's traceback.

One value means something of clbench's own: ``strategy: fsdp`` is FSDP2 through Lightning's
``ModelParallelStrategy`` (see :mod:`clbench.engine.sharding` for why not Lightning's FSDP1
``FSDPStrategy``, which with DeepSpeed is refused).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from clbench.errors import UserError, did_you_mean

# Trainer arguments the runner sets itself; a config may not override them.
RESERVED_TRAINER_ARGS = ("max_epochs", "min_epochs", "callbacks", "logger", "enable_checkpointing",
                         "num_sanity_val_steps", "enable_progress_bar", "deterministic", "check_val_every_n_epoch",
                         "default_root_dir", "inference_mode", "use_distributed_sampler")
_OTHER_SHARDING = ("FSDPStrategy", "DeepSpeedStrategy")  # sharding clbench does not drive


def quiet_lightning() -> None:
    """Keep Lightning's start-up chatter and advice that does not apply off the terminal."""
    import lightning.pytorch  # noqa: F401  (it sets its loggers to INFO when first imported)

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for pattern in (".*does not have many workers.*", ".*You defined a `validation_step` but have no.*",
                    ".*isinstance\\(treespec, LeafSpec\\).*", ".*LeafSpec.*", ".*GPU available but not used.*",
                    ".*The number of training batches.*", ".*Total length of .* across ranks is zero.*",
                    ".*this fit will run with no optimizer.*"):  # a closed-form learner has none, on purpose
        warnings.filterwarnings("ignore", message=pattern)


def check_reserved(cfg: dict, source: str) -> None:
    for key in cfg["trainer"] or {}:
        if key in RESERVED_TRAINER_ARGS:
            raise UserError(f"'{key}' is set by the runner", where=f"{source}: trainer.{key}",
                            fix="use train.epochs / train.eval_every_epoch instead, or remove it")


def trainer_args(cfg: dict, source: str) -> dict:
    """The config's ``trainer:`` arguments, checked against the Trainer's signature."""
    import inspect

    import lightning.pytorch as pl

    from clbench.config.init_args import check_init_args

    check_reserved(cfg, source)
    args = dict(cfg["trainer"] or {})
    allowed = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self", *RESERVED_TRAINER_ARGS}
    for key in args:
        if key not in allowed:  # suggest only what a config may set
            raise UserError(f"unknown Trainer argument '{key}'", where=f"{source}: trainer.{key}",
                            fix=did_you_mean(key, allowed))
    check_init_args(pl.Trainer, args, f"{source}: trainer")
    return args


def _field_of(message: str, args: dict) -> str | None:
    """The config field a Trainer construction error is about, guessed from its message."""
    lowered = message.lower()
    # Lightning quotes the argument it refuses (`Trainer(devices=0)`); a name that only appears
    # in the text ("using cpu accelerator") is a weaker hint.
    quoted = [key for key in args if f"{key.lower()}=" in lowered]
    named = quoted + [key for key in args if key.lower() in lowered and key not in quoted]
    valued = [key for key, value in args.items() if isinstance(value, str) and len(value) > 2
              and value.lower() in lowered]
    return (named or valued or [None])[0]


def make_trainer(cfg: dict, source: str, *, callbacks: list | None = None, logger: Any = False,
                 root: str | None = None, max_epochs: int = 0) -> Any:
    """A Trainer with the runner's fixed arguments and the config's; its refusals as one line.
    Its callbacks always include an :class:`~clbench.engine.evaluation.EvaluationLog`, which
    collects what each evaluation pass returns."""
    import lightning.pytorch as pl
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from clbench.engine.evaluation import EvaluationLog
    from clbench.engine.precision import default_precision

    args = trainer_args(cfg, source)
    args.setdefault("log_every_n_steps", 1)  # the training loss per step (clbench.engine.loggers)
    precision = default_precision(cfg, source)
    if precision is not None:
        args["precision"] = precision
    if args.get("strategy") == "fsdp":
        from lightning.pytorch.strategies import ModelParallelStrategy

        args["strategy"] = ModelParallelStrategy()
    try:
        return pl.Trainer(max_epochs=max_epochs, logger=logger, callbacks=[*(callbacks or []), EvaluationLog()],
                          enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                          deterministic=cfg["train"]["deterministic"], check_val_every_n_epoch=1,
                          inference_mode=False, use_distributed_sampler=False, default_root_dir=root, **args)
    except (MisconfigurationException, ValueError, TypeError, RuntimeError) as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        message = lines[0] if lines[0].count("(") == lines[0].count(")") else " ".join(lines)  # no half sentence
        field = _field_of(message, args)
        raise UserError(f"Lightning refuses the Trainer settings: {message}",
                        where=f"{source}: trainer" + (f".{field}" if field else ""),
                        fix="change or remove that trainer argument; see lightning.pytorch.Trainer") from None


def shards_parameters(trainer) -> bool:
    """Whether the Trainer runs clbench's sharded path (``strategy: fsdp``)."""
    return type(trainer.strategy).__name__ == "ModelParallelStrategy"


def check_parallel_support(trainer, strategy, model, name: str, source: str) -> None:
    """Fail fast (before processes start) when the CL strategy or the model cannot run under
    the Trainer's parallelism."""
    kind = type(trainer.strategy).__name__
    if kind in _OTHER_SHARDING:
        raise UserError(f"clbench shards parameters with FSDP2, not {kind}", where=f"{source}: trainer.strategy",
                        fix="use trainer.strategy: fsdp (or ddp)")
    from clbench.engine.lightning_internals import starts_processes_per_fit

    if shards_parameters(trainer):
        from clbench.engine.sharding import block_classes

        if not strategy.supports_sharded:
            raise UserError(f"strategy '{name}' does not support sharded parameters ({kind})",
                            where=f"{source}: trainer.strategy", fix="use trainer.strategy: ddp for this method")
        try:
            block_classes(model)  # a model with no blocks to shard
        except UserError as err:
            raise UserError(err.what, where=f"{source}: trainer.strategy", fix=err.fix) from None
    if starts_processes_per_fit(trainer):  # ddp_spawn, ddp_fork, ddp_notebook
        raise UserError("this Trainer strategy starts new processes at every fit, and a run fits once per "
                        "experience: the CL strategy's state would be lost between experiences",
                        where=f"{source}: trainer.strategy", fix="use trainer.strategy: ddp (or fsdp)")
    if trainer.world_size > 1 and not strategy.supports_distributed:
        raise UserError(f"strategy '{name}' does not support data-parallel training ({trainer.world_size} processes)",
                        where=f"{source}: trainer", fix="run it on one device (trainer.devices: 1)")


def stage_steps(trainer) -> int:
    """Optimizer steps left in the stage ``fit`` is running: a schedule's length, asked for in
    ``configure_optimizers``. Every stage raises ``max_epochs`` by its own epochs
    (:func:`clbench.engine.stage.fit_stage`), so the epochs left are ``max_epochs - current_epoch``;
    Lightning's ``estimated_stepping_batches`` sets this stage's loader up and counts its batches
    (a combined loader's by its mode, ``limit_train_batches`` applied). 1 when the loader has no
    length."""
    import math

    trainer.estimated_stepping_batches  # noqa: B018 - sets num_training_batches up for this fit's loader
    batches = trainer.num_training_batches
    if not math.isfinite(batches):
        return 1
    per_epoch = max(1, math.ceil(batches / trainer.accumulate_grad_batches))
    return max(1, (trainer.max_epochs - trainer.current_epoch) * per_epoch)


def interruptible(trainer, call, *args: Any, **kwargs: Any) -> Any:
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


class SigintWatch:
    """Remembers Ctrl-C for the duration of a run (a context manager).

    Python only reports a KeyboardInterrupt raised inside a garbage-collector or ``__del__``
    callback; the watch notes every SIGINT, so :meth:`check` stops the run at the next stage
    boundary even then, and hides that report's traceback. Outside the main thread, or when the
    caller installed its own SIGINT handler, it does nothing.
    """

    def __init__(self) -> None:
        self.interrupted = False
        self._previous: tuple | None = None

    def __enter__(self) -> "SigintWatch":
        import signal
        import sys
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        handler = signal.getsignal(signal.SIGINT)
        if handler is not signal.default_int_handler:
            return self  # the caller handles SIGINT its own way
        hook = sys.unraisablehook

        def on_sigint(signum, frame):
            self.interrupted = True
            raise KeyboardInterrupt

        def unraisable(report) -> None:
            if not isinstance(report.exc_value, KeyboardInterrupt):
                hook(report)

        signal.signal(signal.SIGINT, on_sigint)
        sys.unraisablehook = unraisable
        self._previous = (handler, hook)
        return self

    def check(self) -> None:
        if self.interrupted:
            raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        import signal
        import sys

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous[0])
            sys.unraisablehook = self._previous[1]


def start_process_group(trainer, module) -> None:
    """Start the run's other processes and its process group now, as Lightning's next ``fit`` or
    ``validate`` would (it does neither twice). A resumed run needs this: its first collective
    can come before either, in a strategy's ``before_experience`` (grow broadcasts which layers
    to widen), and without the group every rank would decide alone."""
    import torch.distributed as dist

    from clbench.engine.lightning_internals import launch_processes

    if trainer.world_size == 1 or (dist.is_available() and dist.is_initialized()):
        return
    launch_processes(trainer, module)


def end_process_group(only_gloo: bool = False) -> None:
    """Destroy the DDP process group a run set up (Lightning leaves it): otherwise gloo's threads
    can be torn down mid-flight at exit ("terminate called ...", SIGABRT). After a failure only
    a gloo group is destroyed; an NCCL group may still have a collective in flight.

    The garbage collection after it is part of the fix: objects of finished collectives can sit
    in reference cycles, and if the interpreter's shutdown is what frees them, a gloo thread
    that needs the GIL to do so aborts the process (about one run in twenty of
    tests/metrics/test_metrics_ddp.py before, none in a hundred after)."""
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and (not only_gloo or dist.get_backend() == "gloo"):
        dist.destroy_process_group()
        gc.collect()
