"""A component's ``init_args`` checked against its signature before it is called.

Unknown keys (with the closest valid one), missing required ones and values that do not fit
their annotation (:mod:`clbench.config.validation`, with pydantic: containers, ``Literal``,
``Union`` and constraints declared in the signature, such as ``Annotated[int, Field(ge=1)]``)
are one-line :class:`~clbench.errors.UserError` naming the file and field. The builders
(:mod:`clbench.plugins.build`) and a stream that wraps another (``dirichlet``) both call it.
"""

from __future__ import annotations

import inspect
import typing
from typing import Callable

from clbench.config.validation import Invalid, check_value, fix_for
from clbench.errors import UserError, did_you_mean


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
        hints = typing.get_type_hints(func, include_extras=True)
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
        if annotation is inspect.Parameter.empty or isinstance(annotation, str):
            continue  # unannotated, or a forward reference that does not resolve: anything goes
        try:
            check_value(value, annotation)
        except Invalid as err:
            what = f"{key}{err.path} {err.what}" if err.limit else err.what  # "mem_size must be >= 0, got -5"
            raise UserError(what, where=f"{where}.{key}{err.path}", fix=err.fix or fix_for(key, annotation)) from None
    missing = [n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in init_args
               and p.kind is not p.VAR_KEYWORD]
    if missing:
        raise UserError(f"missing required argument(s) {', '.join(missing)}", where=where,
                        fix=f"add {', '.join(missing)} under init_args")


