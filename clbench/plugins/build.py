"""Build a run's components from a resolved config.

``init_args`` are checked against the target's signature before it is called
(:func:`clbench.config.init_args.check_init_args`).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Callable

from pydantic import Field

from clbench import registry
from clbench.errors import UserError, did_you_mean
from clbench.config.init_args import check_init_args
from clbench.config.validation import argument_path
from clbench.plugins.supplied import MODEL_ARGS


def locate_error(err: UserError, source: str) -> UserError:
    """Prefix the config file to an error a component raised about one of its own fields.

    Builders only know their field (``benchmark.init_args.min_size``); the user needs the file
    too. Errors about something else (a dataset path) keep their own ``where``.
    """
    if err.where and err.where.split(".")[0] in ("benchmark", "model", "strategy", "train", "objective"):
        err.where = f"{source}: {err.where}"
        err.args = (err.one_line(),)
    return err


def call_plugin(target: Callable, args: dict, where: str, source: str, **provided: Any) -> Any:
    """``target(**provided, **args)``; an exception raised by a plugin's own code (not the
    harness's: that is a bug and keeps its traceback) becomes a one-line error at its line."""
    check_init_args(target, args, where, provided=tuple(provided))
    try:
        return target(**provided, **args)
    except UserError as err:
        raise locate_error(err, source) from None
    except (Exception, SystemExit) as err:
        if not registry.is_plugin(target):
            raise
        try:
            path = inspect.getsourcefile(target)
        except TypeError:  # a builtin or C extension: no file of its own
            path = None
        name = getattr(target, "__qualname__", repr(target))
        raise registry.plugin_failure(err, where=where.removesuffix(".init_args"), doing=f"building {name}",
                                      path=path) from None


def _strategy_class(cfg: dict, source: str):
    from clbench.strategy import Strategy

    spec = cfg["strategy"]
    where = f"{source}: strategy.class_path"
    target = registry.resolve("strategies", spec["class_path"], where=where)
    if not (inspect.isclass(target) and issubclass(target, Strategy)):
        raise UserError(f"'{spec['class_path']}' is not a clbench Strategy subclass", where=where,
                        fix="subclass clbench.strategy.Strategy")
    from clbench.plugins.hooks import check_signatures

    check_signatures(target, where)  # hooks the harness cannot call, before anything is built
    return target


def preflight(cfg: dict, source: str, *, here: bool = True) -> None:
    """Resolve every component and check every ``init_args`` before anything is built.

    Building a stream can take minutes (decoding a dataset); a typo in the strategy's
    arguments should not wait for it. Only imports the components' modules; unknown names were
    already refused when the config was resolved (:func:`clbench.config.load.resolve_config`), before
    anything was imported. ``here``: the run will use this machine's CPUs, so
    ``train.num_workers`` must fit them. A suite checks each grid point with this same function
    (:func:`clbench.leaderboard.suite.preflight`).
    """
    if here:
        from clbench.limits import check_workers

        check_workers(cfg["train"]["num_workers"], where=f"{source}: train.num_workers")
    _optimizer_path(cfg, source)
    objective, what = known_objective(cfg, source)
    if cfg.get("objective"):
        check_init_args(objective, cfg["objective"]["init_args"], f"{source}: {argument_path('objective')}")
    provided = MODEL_ARGS if objective is None else objective.model_args
    for key, kind, given in (("benchmark", "benchmarks", ()), ("model", "models", provided)):
        target = registry.resolve(kind, cfg[key]["class_path"], where=f"{source}: {key}.class_path")
        check_init_args(target, cfg[key]["init_args"], f"{source}: {argument_path(key)}", provided=given)
    strategy = _strategy_class(cfg, source)
    check_init_args(strategy, cfg["strategy"]["init_args"], f"{source}: {argument_path('strategy')}")
    if objective is not None:
        check_requirements(cfg, strategy, objective, what, source)
        check_lengths(cfg, objective, what, source)
    optimizer_factory(cfg, source)
    scheduler_factory(cfg, source)


def known_objective(cfg: dict, source: str) -> tuple[type | None, str | None]:
    """The run's objective class where it is known before the stream is built (the config names
    it, or the benchmark declares it as ``benchmark.objective = "<name>"``), and how to name it in
    an error; ``(None, None)`` for a stream that says its objective only once built. Its
    ``model_args`` are the arguments the harness gives the model (else any of
    :data:`~clbench.plugins.supplied.MODEL_ARGS`, checked exactly once the stream is built)."""
    if cfg.get("objective"):
        name = cfg["objective"]["class_path"]
        return _objective_class(name, f"{source}: objective.class_path"), f"objective '{name}'"
    benchmark = (cfg.get("benchmark") or {}).get("class_path")
    if benchmark is None:  # a config that builds a Trainer alone (the perf scripts'): no stream, no objective
        return None, None
    declared = getattr(registry.resolve("benchmarks", benchmark, where=f"{source}: benchmark.class_path"),
                       "objective", None)
    if isinstance(declared, str):
        return _objective_class(declared, f"{source}: benchmark"), f"benchmark '{benchmark}' (objective {declared})"
    return None, None


def check_requirements(cfg: dict, strategy: type, objective: type, what: str, source: str) -> None:
    """Refuse a strategy whose ``requires`` the objective does not provide (``provides``):
    checked in :func:`preflight` where the objective is known before the stream is built, and
    again once it is built."""
    from clbench.strategy import REQUIREMENTS

    missing = sorted(set(strategy.requires) - set(objective.provides))
    if missing:
        name = cfg["strategy"]["class_path"]
        raise UserError(f"strategy '{name}' requires {REQUIREMENTS[missing[0]]}, which {what} does not give",
                        where=f"{source}: strategy.class_path",
                        fix=f"use another strategy, or a benchmark/objective that gives {missing[0]}")


def check_lengths(cfg: dict, objective: type, what: str, source: str) -> None:
    """Refuse ``train.group_by_length`` where the objective gives its samples no length
    (:meth:`clbench.objectives.base.Objective.lengths`); checked again once the stream is built."""
    from clbench.objectives.base import Objective

    if cfg["train"].get("group_by_length") and objective.lengths is Objective.lengths:
        raise UserError(f"{what} gives its samples no length to group batches by",
                        where=f"{source}: train.group_by_length", fix="remove it")


def build_benchmark(cfg: dict, source: str):
    spec = cfg["benchmark"]
    where = f"{source}: benchmark.class_path"
    target = registry.resolve("benchmarks", spec["class_path"], where=where)
    scenario = call_plugin(target, spec["init_args"], f"{source}: {argument_path('benchmark')}", source)
    _check_stream(scenario, spec["class_path"], where)
    return scenario


def _check_stream(scenario: Any, name: str, where: str) -> None:
    """What the runner reads of a stream: ``train_stream`` and ``test_stream``, each a sequence
    of experiences, the training one not empty (an Avalanche scenario, or
    :func:`clbench.data.streams.build_scenario`'s)."""
    fix = "return an Avalanche scenario, e.g. from clbench.data.streams.build_scenario (see docs/datasets.md)"
    try:
        sizes = [len(getattr(scenario, part)) for part in ("train_stream", "test_stream")]
    except (AttributeError, TypeError):
        raise UserError(f"benchmark '{name}' returned a {type(scenario).__name__}, not a stream with "
                        "train_stream and test_stream", where=where, fix=fix) from None
    if not sizes[0]:
        raise UserError(f"benchmark '{name}' returned a stream without experiences", where=where, fix=fix)


def _objective_class(name: str, where: str):
    from clbench.objectives.base import Objective

    target = registry.resolve("objectives", name, where=where)
    if not (inspect.isclass(target) and issubclass(target, Objective)):
        raise UserError(f"'{name}' is not a clbench Objective subclass", where=where,
                        fix="subclass clbench.objectives.Objective")
    return target


def build_objective(cfg: dict, stream_spec, source: str):
    """The config's ``objective`` if it names one, else the stream's (``StreamSpec.objective``)."""
    spec = cfg.get("objective") or {"class_path": stream_spec.objective, "init_args": {}}
    where = f"{source}: objective" if cfg.get("objective") else f"{source}: benchmark (its objective)"
    target = _objective_class(spec["class_path"], f"{where}.class_path" if cfg.get("objective") else where)
    args = dict(spec.get("init_args") or {})
    if spec["class_path"] == stream_spec.objective:  # the stream's own arguments, the config's on top
        args = {**stream_spec.objective_args, **args}
    return call_plugin(target, args, f"{where}.init_args", source)


def build_model(cfg: dict, stream_spec, source: str, objective=None, *, check_size: bool = True):
    """The model, given the arguments the objective derives from the stream (classification:
    ``num_classes`` and ``input_shape``); first checked to fit this machine's memory
    (:func:`clbench.models.footprint.check_fits`), so a mistyped size is one line, not the allocator's.
    ``check_size=False``: the same config's model was built already (a reference model's rebuild)."""
    from clbench.models.footprint import check_fits

    if objective is None:
        from clbench.objectives.classification import Classification

        objective = Classification()
    spec = cfg["model"]
    target = registry.resolve("models", spec["class_path"], where=f"{source}: model.class_path")
    where, provided = f"{source}: {argument_path('model')}", objective.model_kwargs(stream_spec)
    check_init_args(target, spec["init_args"], where, provided=tuple(provided))
    if check_size:
        check_fits(target, spec["init_args"], provided, cfg.get("trainer"), where=where)
    return call_plugin(target, spec["init_args"], where, source, **provided)


def build_strategy(cfg: dict, source: str):
    return call_plugin(_strategy_class(cfg, source), cfg["strategy"]["init_args"], f"{source}: {argument_path('strategy')}",
                 source)


# Short optimizer names; anything else is an import path (torch.optim.SGD, my.module:MyOpt).
OPTIMIZERS = {"adam": "torch.optim.Adam", "adamw": "torch.optim.AdamW", "sgd": "torch.optim.SGD",
              "rmsprop": "torch.optim.RMSprop"}


def _optimizer_path(cfg: dict, source: str) -> str:
    name = cfg["train"]["optimizer"]["class_path"]
    path = OPTIMIZERS.get(name.lower(), name)
    if "." not in path and ":" not in path:
        raise UserError(f"unknown optimizer '{name}'", where=f"{source}: train.optimizer.class_path",
                        fix=did_you_mean(name, OPTIMIZERS) + ", or an import path like torch.optim.SGD")
    return path


def optimizer_factory(cfg: dict, source: str) -> Callable:
    spec = cfg["train"]["optimizer"]
    where = f"{source}: train.optimizer"
    target = registry.load_import_path(_optimizer_path(cfg, source), f"{where}.class_path")
    args = dict(spec["init_args"])
    check_init_args(target, args, f"{where}.init_args", provided=("params",))
    lr = args.get("lr")
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and not 0 <= lr < float("inf"):
        raise UserError(f"the learning rate must be a finite number >= 0, got {lr}", where=f"{where}.init_args.lr",
                        fix="give a rate such as 0.001")
    # Build it once over a dummy parameter, so a value the optimizer itself refuses (a negative
    # eps, betas outside [0, 1)...) is reported before training, not in the middle of it.
    import torch

    try:
        target([torch.nn.Parameter(torch.zeros(1))], **args)
    except (ValueError, TypeError) as err:  # a value outside the range, or of a type the annotation let through
        raise UserError(f"the optimizer refuses its arguments: {err}", where=f"{where}.init_args",
                        fix="check the values under train.optimizer.init_args") from None
    except Exception:  # noqa: BLE001 - an optimizer that needs real parameters: its own call reports it
        pass
    return lambda params: build_optimizer(target, args, params)


def build_optimizer(target, args: dict, params) -> Any:
    """``target(params, **args)``, with torch's fused step where :func:`fuses_on_cuda` says so."""
    params = list(params)
    if fuses_on_cuda(target, args, params):
        return target(params, **args, fused=True)
    return target(params, **args)


def fuses_on_cuda(target, args: dict, params: list) -> bool:
    """Whether to build ``target`` with ``fused=True``: it has torch's fused kernel, every
    parameter it gets is a floating-point CUDA tensor, and the config chose none of ``fused``,
    ``foreach`` and ``differentiable`` itself.

    On CUDA, torch's Adam, AdamW and SGD default to the multi-tensor (``foreach``) step, several
    kernel launches per parameter group and step; the fused kernel updates each tensor list in
    one (torch's optimizer documentation orders their speed fused > foreach > for-loop). It rounds the last bits
    differently, so only CUDA gets it: on a CPU, where committed entries are made, torch's
    default step is kept. Our choice, measured by ``perf/gpu_report.py`` (part ``lm_train``).
    """
    if any(key in args for key in ("fused", "foreach", "differentiable")):
        return False
    try:
        if "fused" not in inspect.signature(target).parameters:
            return False
    except (TypeError, ValueError):
        return False
    groups = [p["params"] if isinstance(p, dict) else p for p in params]  # tensors or parameter groups
    tensors = [t for g in groups for t in ([g] if hasattr(g, "is_cuda") else g)]
    return bool(tensors) and all(t.is_cuda and t.is_floating_point() for t in tensors)


# Learning-rate schedules stepped every optimizer step, over one experience's steps.
SCHEDULERS = ("constant", "linear", "cosine")
Fraction = Annotated[float, Field(ge=0, le=1)]


def scheduler_factory(cfg: dict, source: str) -> Callable | None:
    """``train.scheduler: {class_path: cosine, init_args: {warmup_steps | warmup_ratio, min_lr_ratio}}``.

    Each experience gets its own schedule over its own optimizer steps (the optimizer is built
    afresh per experience too), as sequential fine-tuning of language models does: linear
    warm-up from 0, then constant, linear decay or cosine decay to ``min_lr_ratio`` of the
    base rate. Built from torch's ``LinearLR``/``CosineAnnealingLR``/``ConstantLR`` chained
    with ``SequentialLR``. An import path names any other ``torch.optim.lr_scheduler`` class,
    called as ``cls(optimizer, **init_args)``.
    """
    spec = (cfg.get("train") or {}).get("scheduler")
    if not spec:
        return None
    where = f"{source}: train.scheduler"
    name, args = spec["class_path"], dict(spec.get("init_args") or {})
    if name not in SCHEDULERS:
        if "." not in name and ":" not in name:
            raise UserError(f"unknown scheduler '{name}'", where=f"{where}.class_path",
                            fix=did_you_mean(name, SCHEDULERS) + ", or an import path such as "
                                "torch.optim.lr_scheduler.StepLR")
        target = registry.load_import_path(name, f"{where}.class_path")
        check_init_args(target, args, f"{where}.init_args", provided=("optimizer",))
        return lambda optimizer, total_steps: target(optimizer, **args)
    check_init_args(_warmup_schedule, args, f"{where}.init_args", provided=("optimizer", "total_steps", "kind"))
    return lambda optimizer, total_steps: _warmup_schedule(optimizer, total_steps, kind=name, **args)


def _warmup_schedule(optimizer, total_steps: int, kind: str, warmup_steps: Annotated[int, Field(ge=0)] = 0,
                     warmup_ratio: Fraction = 0.0, min_lr_ratio: Fraction = 0.0):
    from torch.optim import lr_scheduler as S

    warmup = min(total_steps, warmup_steps or round(warmup_ratio * total_steps))
    rest = max(1, total_steps - warmup)
    if kind == "cosine":
        base = optimizer.param_groups[0]["lr"]
        after = S.CosineAnnealingLR(optimizer, T_max=rest, eta_min=base * min_lr_ratio)
    elif kind == "linear":
        after = S.LinearLR(optimizer, start_factor=1.0, end_factor=min_lr_ratio, total_iters=rest)
    else:
        after = S.ConstantLR(optimizer, factor=1.0, total_iters=0)
    if not warmup:
        return after
    # LinearLR cannot start at exactly 0: the first step uses 1/(warmup+1) of the rate.
    ramp = S.LinearLR(optimizer, start_factor=1.0 / (warmup + 1), end_factor=1.0, total_iters=warmup)
    return S.SequentialLR(optimizer, [ramp, after], milestones=[warmup])
