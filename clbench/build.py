"""Build a run's components from a resolved config.

``init_args`` are checked against the target's signature before it is called: unknown keys
(with the closest valid one), missing required ones and values whose type does not match a
simple annotation (int, float, bool, str, list, Optional, Literal) are reported as one-line
:class:`~clbench.errors.UserError` naming the file and field.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any, Callable

from clbench import registry
from clbench.errors import UserError, did_you_mean


def _matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits a simple annotation; unknown annotations accept anything."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple) or annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    return True


def _describe(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "")


def check_init_args(target: Callable, init_args: dict, where: str, provided: tuple[str, ...] = ()) -> None:
    """Raise a UserError unless ``target(**provided, **init_args)`` is a well-formed call."""
    if not isinstance(init_args, dict):
        raise UserError(f"init_args must be a mapping, got {type(init_args).__name__}", where=where)
    func = target.__init__ if inspect.isclass(target) else target
    signature = inspect.signature(func)
    params = {name: p for name, p in signature.parameters.items()
              if name != "self" and p.kind not in (p.VAR_POSITIONAL,)}
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind is not p.VAR_KEYWORD and n not in provided}
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # unresolvable forward references: skip type checks
        hints = {}
    for key, value in init_args.items():
        if key not in named:
            if key in provided:
                raise UserError(f"'{key}' is set by the harness, not the config", where=f"{where}.{key}",
                                fix=f"remove {key} from init_args")
            if not takes_kwargs:
                raise UserError(f"unknown argument '{key}'", where=f"{where}.{key}",
                                fix=did_you_mean(key, named) if named else "this component takes no arguments")
            continue
        annotation = hints.get(key, named[key].annotation)
        if not _matches(value, annotation):
            raise UserError(f"expected {_describe(annotation)}, got {type(value).__name__} {value!r}",
                            where=f"{where}.{key}", fix=f"give {key} a value of type {_describe(annotation)}")
    missing = [n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in init_args
               and p.kind is not p.VAR_KEYWORD]
    if missing:
        raise UserError(f"missing required argument(s) {', '.join(missing)}", where=where,
                        fix=f"add {', '.join(missing)} under init_args")


def _locate(err: UserError, source: str) -> UserError:
    """Prefix the config file to an error a component raised about one of its own fields.

    Builders only know their field (``benchmark.init_args.min_size``); the user needs the file
    too. Errors about something else (a dataset path) keep their own ``where``.
    """
    if err.where and err.where.split(".")[0] in ("benchmark", "model", "strategy", "train"):
        err.where = f"{source}: {err.where}"
        err.args = (err.one_line(),)
    return err


def _call(target: Callable, args: dict, where: str, source: str, **provided: Any) -> Any:
    check_init_args(target, args, where, provided=tuple(provided))
    try:
        return target(**provided, **args)
    except UserError as err:
        raise _locate(err, source) from None


def _strategy_class(cfg: dict, source: str):
    from clbench.strategy import Strategy

    spec = cfg["strategy"]
    where = f"{source}: strategy.class_path"
    target = registry.resolve("strategies", spec["class_path"], where=where)
    if not (inspect.isclass(target) and issubclass(target, Strategy)):
        raise UserError(f"'{spec['class_path']}' is not a clbench Strategy subclass", where=where,
                        fix="subclass clbench.strategy.Strategy")
    return target


def preflight(cfg: dict, source: str) -> None:
    """Resolve every component and check every ``init_args`` before anything is built.

    Building a stream can take minutes (decoding a dataset); a typo in the strategy's
    arguments should not wait for it. Only imports the components' modules, and names that
    are neither registered nor import paths are refused before anything is imported.
    """
    for key, kind in (("benchmark", "benchmarks"), ("model", "models"), ("strategy", "strategies")):
        name = cfg[key]["class_path"]
        if isinstance(name, str) and name not in registry.available(kind) and not registry._looks_like_path(name):
            registry.resolve(kind, name, where=f"{source}: {key}.class_path")  # raises: unknown name
    _optimizer_path(cfg, source)
    for key, kind, provided in (("benchmark", "benchmarks", ()), ("model", "models", ("num_classes", "input_shape"))):
        target = registry.resolve(kind, cfg[key]["class_path"], where=f"{source}: {key}.class_path")
        check_init_args(target, cfg[key]["init_args"], f"{source}: {key}.init_args", provided=provided)
    check_init_args(_strategy_class(cfg, source), cfg["strategy"]["init_args"], f"{source}: strategy.init_args")
    optimizer_factory(cfg, source)


def build_benchmark(cfg: dict, source: str):
    spec = cfg["benchmark"]
    target = registry.resolve("benchmarks", spec["class_path"], where=f"{source}: benchmark.class_path")
    return _call(target, spec["init_args"], f"{source}: benchmark.init_args", source)


def build_model(cfg: dict, stream_spec, source: str):
    spec = cfg["model"]
    target = registry.resolve("models", spec["class_path"], where=f"{source}: model.class_path")
    return _call(target, spec["init_args"], f"{source}: model.init_args", source,
                 num_classes=stream_spec.num_classes, input_shape=tuple(stream_spec.input_shape))


def build_strategy(cfg: dict, source: str):
    return _call(_strategy_class(cfg, source), cfg["strategy"]["init_args"], f"{source}: strategy.init_args", source)


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
    target = registry._load_import_path(_optimizer_path(cfg, source), f"{where}.class_path")
    args = dict(spec["init_args"])
    check_init_args(target, args, f"{where}.init_args", provided=("params",))
    return lambda params: target(params, **args)
