"""The run config file's fields as pydantic models: each field's type, range and default.

:func:`clbench.config.load.resolve_config` checks a file against :class:`RunConfig` before laying
it over the defaults, and the merged config (with the command line's overrides) again; a
suite's ``base`` and every cell of its grid go through the same function, so a run and a suite
cell obey one set of rules. The models decide, they do not convert: the resolved config stays
the plain dict the file gave (its content hash names committed leaderboard entries).

The rules are those of :mod:`clbench.config.validation`: strict types (``"3"`` is not an int,
``true`` is not a count), finite floats, unknown keys refused with the closest valid one, and
the first problem worded as one line. A section's fields may all be left out (the defaults
fill them); an optional component (``objective``, ``train.scheduler``) must name its
``class_path``. What needs more than the file (a short name's registration, a named order of
the stream, a Trainer argument, a component's ``init_args``) is checked where that is known.

Importing this module imports pydantic (about 70 ms), never torch.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from clbench.errors import did_you_mean
from clbench.config.validation import refuse

Count = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
# A batch is a tensor whose first dimension is the batch size: beyond sys.maxsize Python's own
# slicing refuses it (a ValueError traceback from itertools.islice). 2^31 - 1 is far above any
# batch a machine holds, and above a whole dataset ("full batch": one batch per epoch).
BatchSize = Annotated[int, Field(ge=1, le=2**31 - 1)]


class Section(BaseModel):
    """A mapping of a file: strict values, finite floats, no key it does not know."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise refuse(f"unknown key '{key}'", did_you_mean(str(key), cls.model_fields), at=key)
        return data


class Component(Section):
    """``{class_path, init_args}``; the ``init_args`` are checked against the target's
    signature once it is imported (:func:`clbench.plugins.build.check_init_args`). In a file the
    ``class_path`` may be left out to keep the default's."""

    class_path: str = ""
    init_args: dict[str, Any] | None = None


class Named(Component):
    """A component with no default (``objective``, ``train.scheduler``): it names its class."""

    class_path: str


def order_problem(order: Any) -> tuple[str, str] | None:
    """What is wrong with a run's ``order`` (or one of a suite's ``orders``), and the fix; None
    when it is a name, a list of experience names once each, or ``{permutation: <seed >= 0>}``.
    Whether a name or an experience exists is the stream's to say (:func:`clbench.data.streams.resolve_order`)."""
    if isinstance(order, str):
        if not order:
            return ("the order is an empty name",
                    "use a named order such as default, a list of names, or {permutation: <int seed>}")
        return None
    if isinstance(order, list):
        if not order or not all(isinstance(name, str) for name in order):
            what = "an explicit order lists no experience" if not order else \
                "an explicit order is a list of experience names"
            return what, "write e.g. order: [rot0, rot90, ...]"
        duplicated = sorted({name for name in order if order.count(name) > 1})
        if duplicated:
            return f"experience(s) {', '.join(duplicated)} appear more than once", "list each experience exactly once"
        return None
    seed = order.get("permutation") if isinstance(order, dict) else None
    if not isinstance(order, dict) or set(order) != {"permutation"} or not isinstance(seed, int) \
            or isinstance(seed, bool):
        return (f"unrecognised order {order!r}",
                "use a named order, a list of names, or {permutation: <int seed>}")
    if seed < 0:
        return f"a permutation's seed must be >= 0, got {seed}", "give a seed such as {permutation: 3}"
    return None


def _order(order: Any) -> Any:
    problem = order_problem(order)
    if problem:
        raise refuse(*problem)
    return order


# A name, a list of experience names, or {permutation: seed}; its own words for each mistake.
Order = Annotated[Any, AfterValidator(_order),
                  Field(description="a named order (default, reverse), a list of experience names "
                                    "or {permutation: <seed>}")]


class Train(Section):
    """How each experience is trained and evaluated."""

    epochs: Count = 3
    batch_size: BatchSize = 64
    eval_batch_size: BatchSize = 512
    optimizer: Component = Component(class_path="adam", init_args={"lr": 0.001})
    scheduler: Named = None  # type: ignore[assignment]  # optional: a per-step learning-rate schedule
    eval_every_epoch: bool = False
    num_workers: NonNegative = 0
    deterministic: bool = True
    # optional, off when left out: batches of near-equal lengths (clbench.data.datasets.run_loader)
    group_by_length: bool = None  # type: ignore[assignment]


class Pretrain(Section):
    """``pretrain:`` (:mod:`clbench.engine.pretrain`): a held-out share of every experience, trained on
    first; exactly one of ``fraction`` and ``samples``."""

    fraction: Annotated[float, Field(gt=0, lt=1)] = None  # type: ignore[assignment]
    samples: Count = None  # type: ignore[assignment]
    epochs: Count

    @model_validator(mode="after")
    def _one_size(self) -> Pretrain:
        if len({"fraction", "samples"} & self.model_fields_set) != 1:
            raise refuse("give exactly one of fraction and samples", "write e.g. pretrain: {fraction: 0.1, epochs: 7}")
        return self


class Save(Section):
    """``save:`` (:mod:`clbench.engine.saved`): which trained weights a run keeps in ``model/``.
    Optional, and not part of the config hash (:data:`clbench.config.load.NON_SEMANTIC`)."""

    final: bool = True
    every_experience: bool = False


class Metrics(Section):
    reference_models: bool = False


#: The loggers a config may name without an import path (:mod:`clbench.engine.loggers` builds them).
LOGGER_SHORT_NAMES = {
    "tensorboard": "lightning.pytorch.loggers:TensorBoardLogger",
    "csv": "lightning.pytorch.loggers:CSVLogger",
    "mlflow": "lightning.pytorch.loggers:MLFlowLogger",
    "wandb": "lightning.pytorch.loggers:WandbLogger",
}


def _logger_name(name: str) -> str:
    if not name:
        raise refuse("a logger's name is empty", _LOGGERS)
    if name not in LOGGER_SHORT_NAMES and ":" not in name and "." not in name:
        raise refuse(f"unknown logger '{name}'", did_you_mean(name, LOGGER_SHORT_NAMES))
    return name


def _loggers_once(items: list) -> list:
    names = [item if isinstance(item, str) else item.class_path for item in items]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise refuse(f"logger '{twice[0]}' is named twice", "name each logger once")
    return items


_LOGGERS = "write e.g. loggers: [tensorboard, csv] or [{class_path: mlflow, init_args: {tracking_uri: 'file:./mlruns'}}]"
LoggerName = Annotated[str, AfterValidator(_logger_name)]  # a short name (LOGGER_SHORT_NAMES) or an import path


class Logger(Section):
    class_path: LoggerName
    init_args: dict[str, Any] | None = None


class Logging(Section):
    """Not part of the config hash (:data:`clbench.config.load.NON_SEMANTIC`). Without ``loggers``,
    TensorBoard alone if ``tensorboard`` (:func:`clbench.engine.loggers.logger_specs`)."""

    tensorboard: bool = True
    progress: bool = True
    loggers: Annotated[list[LoggerName | Logger], AfterValidator(_loggers_once)] = None  # type: ignore[assignment]


class RunConfig(Section):
    """A run config file. A ``None`` default (``objective``, ``pretrain``, ``train.scheduler``,
    ``logging.loggers``) marks an optional field: absent from the resolved config unless the
    file gives it, so configs without it keep their hashes; its type has no ``None``, so an
    explicit ``null`` is refused rather than read as "left out"."""

    seed: NonNegative = 0
    benchmark: Component = Component(class_path="digits-domains", init_args={})
    order: Order = "default"
    model: Component = Component(class_path="mlp", init_args={})
    strategy: Component = Component(class_path="naive", init_args={})
    objective: Named = None  # type: ignore[assignment]  # optional: overrides the stream's
    pretrain: Pretrain = None  # type: ignore[assignment]
    train: Train = Train()
    metrics: Metrics = Metrics()
    save: Save = None  # type: ignore[assignment]  # optional: defaults are final weights only
    # handed to lightning.Trainer, which checks its own arguments (clbench.plugins.build.preflight)
    trainer: dict[str, Any] | None = {"accelerator": "cpu", "devices": 1}
    logging: Logging = Logging()


@functools.lru_cache(maxsize=1)
def _defaults() -> dict:
    return RunConfig().model_dump(exclude_none=True)


def defaults() -> dict:
    """The resolved config of an empty file: every field's default, optional sections left out."""
    import copy

    return copy.deepcopy(_defaults())
