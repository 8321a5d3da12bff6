"""Check a value read from YAML against a Python type annotation, with pydantic.

Every component's ``init_args`` (strategies, models, benchmarks, objectives, the optimizer's
and the scheduler's own signatures, Lightning's Trainer) is checked here, one parameter at a
time, against the annotation in its signature: containers element by element (``["x", 2.5]``
is not a ``list[int]``), ``Literal`` and ``Union`` against every allowed form, and constraints
declared in the signature (``Annotated[int, Field(ge=1)]``). Whole files are checked the same
way against pydantic models of their fields (:func:`check_fields`: the run config's
:mod:`clbench.config.schema`, a suite's :class:`~clbench.leaderboard.suite_file.SuiteFile`): a
model's own rules that no type says (an unknown key, a seed listed twice) raise :func:`refuse`
with their words and fix. pydantic does the checking; this module only chooses the rules and
words the first problem as one line.

The rules, for values that come from YAML:

* Strict scalars: no value is converted. ``"0.1"`` is not a float, ``true`` is neither an int nor
  a float (``lr: true`` would otherwise train with a rate of 1.0); an int is a float.
* YAML has lists, not tuples: a list is accepted for a ``tuple[...]`` (its items stay strict),
  and a string for a ``Path``.
* Floats are finite: ``nan`` and ``inf`` are refused for every float parameter (rates, sizes,
  coefficients), unless its annotation says ``Annotated[float, AllowInfNan(True)]``.
* An annotation pydantic cannot build a check for (an unresolvable forward reference) accepts
  anything, as an unannotated parameter does.

The value passed to the component is the one from the config, unchanged: validation decides,
it does not convert.

What one parameter's annotation cannot say (two arguments that do not go together, an argument
that does not fit the data or the model) the component refuses with :class:`ArgumentError`,
which words the field path (``strategy.init_args.top_k``) in one place.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from collections.abc import Callable as AbcCallable
from pathlib import PurePath
from typing import Annotated, Any, Literal, Union

from typing_extensions import is_typeddict

from clbench.errors import UserError, closest

# The config sections a plugin's arguments live under.
Component = Literal["benchmark", "model", "strategy", "objective"]

# pydantic error types that say "the type is right, the value is out of range"
_CONSTRAINTS = {
    "greater_than": "must be > {gt}", "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}", "less_than_equal": "must be <= {le}",
    "multiple_of": "must be a multiple of {multiple_of}", "finite_number": "must be a finite number",
    "too_short": "needs at least {min_length} item(s)", "too_long": "takes at most {max_length} item(s)",
    "string_too_short": "needs at least {min_length} character(s)",
    "string_too_long": "takes at most {max_length} character(s)",
    "string_pattern_mismatch": "must match {pattern}",
}
# pydantic error type -> the expected form, as a config author reads it
_EXPECTED = {
    "int_type": "int", "int_from_float": "int", "int_parsing": "int", "float_type": "float",
    "float_parsing": "float", "string_type": "str", "bool_type": "bool", "bool_parsing": "bool",
    "list_type": "list", "tuple_type": "list", "set_type": "list", "frozen_set_type": "list",
    "sequence_str": "list", "iterable_type": "list", "dict_type": "mapping", "none_required": "null",
    "path_type": "path", "callable_type": "callable", "model_type": "mapping", "model_attributes_type": "mapping",
}


def argument_path(component: Component, field: str = "") -> str:
    """Where argument ``field`` of the config's ``component`` sits: ``strategy.init_args.top_k``
    (without a field, the component's ``init_args`` as a whole)."""
    return f"{component}.init_args" + (f".{field}" if field else "")


class ArgumentError(UserError):
    """A plugin's refusal of one of its ``init_args`` that its signature cannot declare.

    Each argument's own type and range belong in the signature (``Annotated[int, Field(ge=1)]``,
    ``Literal[...]``) and are checked before the plugin is called; this is for the rest: arguments
    that do not go together (``top_k`` above ``num_experts``) and an argument that does not fit
    the data or the model it meets (``min_size`` x experiences above the samples, a layer index
    beyond the depth). ``component`` is the config section, ``field`` the argument, with a path
    below it where the value is a mapping (``config.vocab_size``), or empty for the arguments as a
    whole. The builder prefixes the config file (:func:`clbench.plugins.build.locate_error`).
    """

    def __init__(self, component: Component, field: str, what: str, fix: str | None = None):
        self.component, self.field = component, field
        super().__init__(what, where=argument_path(component, field), fix=fix)

    def nested(self, under: str) -> ArgumentError:
        """This error about a plugin built from argument ``under`` of another plugin of the same
        component (a Dirichlet stream's ``source``): the field becomes ``under.init_args.field``."""
        return ArgumentError(self.component, f"{under}.init_args" + (f".{self.field}" if self.field else ""),
                             self.what, self.fix)


class Invalid(Exception):
    """A value that does not fit its annotation: ``path`` (``[0]``, ``.key``) below the field,
    ``what`` is wrong, in words; ``limit`` when the type is right and the value out of range;
    ``fix`` when the rule that refused it words its own fix (:func:`refuse`)."""

    def __init__(self, path: str, what: str, limit: bool = False, fix: str | None = None):
        super().__init__(f"{path}: {what}")
        self.path, self.what, self.limit, self.fix = path, what, limit, fix


def refuse(what: str, fix: str, at: Any = None):
    """The error a validator of a model raises for a rule that types cannot say (an unknown key,
    two seeds alike): ``what`` and ``fix`` in words, ``at`` a key below the validated value.
    Raise it from a ``model_validator`` or an ``AfterValidator``; :func:`check_value` words it."""
    from pydantic_core import PydanticCustomError

    return PydanticCustomError("refused", "{what}", {"what": what, "fix": fix, "at": at})


def _yaml_form(annotation: Any) -> Any:
    """``annotation`` with tuples accepting lists and paths accepting strings (YAML has neither)."""
    from pydantic import Strict

    if annotation is tuple or typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        inner = tuple[tuple(a if a is Ellipsis else _yaml_form(a) for a in args)] if args else tuple
        return Annotated[inner, Strict(False)]
    if isinstance(annotation, type) and issubclass(annotation, PurePath):
        return Annotated[annotation, Strict(False)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if not args or origin in (Literal, AbcCallable, type):
        return annotation
    if origin is Annotated:
        return Annotated[(_yaml_form(args[0]), *annotation.__metadata__)]
    if origin is Union or origin is types.UnionType:
        return Union[tuple(_yaml_form(a) for a in args)]
    try:
        return origin[tuple(_yaml_form(a) for a in args)]
    except TypeError:  # a generic that cannot be re-subscripted this way: checked as written
        return annotation


_RULES = {"strict": True, "arbitrary_types_allowed": True, "allow_inf_nan": False}


def mapping_argument(cls: type) -> type:
    """Mark a ``TypedDict`` that declares a mapping argument (``augment: {hue: 0.1}``): its
    values are checked by this module's rules and a key it does not declare is refused."""
    from pydantic import ConfigDict

    cls.__pydantic_config__ = ConfigDict(extra="forbid", **_RULES)
    return cls


def distinct(items: list) -> list:
    """For ``Annotated[list[...], AfterValidator(distinct)]``: a list argument that names each
    item once (sessions, domains, tasks)."""
    if len(set(items)) != len(items):
        raise ValueError("must list each item once")
    return items


@functools.lru_cache(maxsize=1024)
def _adapter(annotation: Any):
    from pydantic import BaseModel, ConfigDict, TypeAdapter

    if (isinstance(annotation, type) and issubclass(annotation, BaseModel)) or is_typeddict(annotation):
        return TypeAdapter(annotation)  # a model carries its own rules (model_config, mapping_argument)
    try:
        return TypeAdapter(_yaml_form(annotation), config=ConfigDict(**_RULES))
    except Exception:  # noqa: BLE001 - pydantic cannot check it (forward reference...): accept anything
        return None


_FIRST_STEP = re.compile(r"^(?:\.[^.\[]*|\[[^\]]*\])?")


def _step(key: Any) -> str:
    return f".{key}" if isinstance(key, str) else f"[{key!r}]"


def _real_path(value: Any, error: dict) -> tuple[str, Any, bool]:
    """The error's place in ``value`` as ``[0].key`` text, the value there, and whether it is a
    mapping's key. pydantic's location also names union branches (``'float'``,
    ``'is-instance[Tensor]'``, a model's class name); those are not places in the value and are
    skipped. A missing field, and the key a :func:`refuse` names, are places below the value."""
    path, current, key = "", value, None
    loc = tuple(error["loc"])
    for step in loc:
        if step == "[key]":
            return path, key, True
        if isinstance(current, dict) and not isinstance(step, (list, dict)) and step in current:
            path += f".{step}" if isinstance(step, str) else f"[{step!r}]"
            key, current = step, current[step]
        elif isinstance(current, (list, tuple)) and isinstance(step, int) and 0 <= step < len(current):
            path += f"[{step}]"
            current = current[step]
    at = (error.get("ctx") or {}).get("at")
    if error["type"] == "missing" and loc:
        path, current = path + _step(loc[-1]), None
    elif at is not None:  # a key of a mapping, even when it is not a string
        path, current = f"{path}.{at}", current.get(at) if isinstance(current, dict) else None
    return path, current, False


def _expected(error: dict) -> str:
    kind = error["type"]
    if kind == "literal_error":
        return "one of " + error["ctx"]["expected"].replace(" or ", ", ")
    if kind == "is_instance_of":
        return error["ctx"]["class"]
    return _EXPECTED.get(kind, error["msg"].removeprefix("Input should be ").removeprefix("a valid "))


def _literal_values(error: dict) -> list[str]:
    """The names a ``literal_error`` allows (pydantic words them ``'a', 'b' or 'c'``)."""
    import ast

    text = error["ctx"]["expected"].replace(" or ", ", ")
    try:
        values = ast.literal_eval(f"[{text}]")
    except (ValueError, SyntaxError):
        return []
    return [v for v in values if isinstance(v, str)]


def check_value(value: Any, annotation: Any) -> None:
    """Raise :class:`Invalid` unless ``value`` fits ``annotation`` (see the module's rules)."""
    if annotation is Any or annotation is typing.Any:
        return
    try:
        adapter = _adapter(annotation)
    except TypeError:  # an unhashable annotation: build it uncached
        adapter = _adapter.__wrapped__(annotation)
    if adapter is None:
        return
    from pydantic import ValidationError

    try:
        adapter.validate_python(value)
    except ValidationError as err:
        errors = err.errors(include_url=False)
        placed = [(_real_path(value, e), e) for e in errors]
        # A union's branch that refused the value as a whole (bool, for a mapping) gives way to
        # one that went inside it (the mapping's own key).
        placed = [item for item in placed if item[0][0]] or placed
        # The first field with a problem (a model reports them in field order), and in it the
        # deepest place: in a union, the branch whose container the value matched.
        first = _FIRST_STEP.match(placed[0][0][0]).group(0)
        placed = [item for item in placed if _FIRST_STEP.match(item[0][0]).group(0) == first]
        deepest = max(placed, key=lambda item: (len(item[0][0]), item[0][2]))[0]
        group = [e for place, e in placed if place == deepest]
        path, here, is_key = deepest
        refused = [e for e in group if e["type"] == "refused"]
        if refused:
            raise Invalid(path, refused[0]["ctx"]["what"], fix=refused[0]["ctx"]["fix"]) from None
        if group[0]["type"] == "missing":
            raise Invalid(path, f"missing '{group[0]['loc'][-1]}'") from None
        limits = [e for e in group if e["type"] in _CONSTRAINTS]
        failed = [e for e in group if e["type"] == "value_error"]  # an AfterValidator's refusal (distinct)
        if failed and not limits:
            raise Invalid(path, f"{failed[0]['ctx']['error']}, got {here!r}", limit=True) from None
        if limits:
            error = limits[0]
            bounds = {k: int(v) if isinstance(v, float) and v.is_integer() else v  # "> 0", not "> 0.0"
                      for k, v in error.get("ctx", {}).items()}
            raise Invalid(path, f"{_CONSTRAINTS[error['type']].format(**bounds)}, got {here!r}", limit=True) from None
        extra = [e for e in group if e["type"] == "extra_forbidden"]  # a key a TypedDict does not declare
        if extra:
            raise Invalid(path, f"unknown key {extra[0]['loc'][-1]!r}") from None
        expected = " or ".join(dict.fromkeys(_expected(e) for e in group))
        names = [v for e in group if e["type"] == "literal_error" for v in _literal_values(e)]
        hint = closest(here, names) if isinstance(here, str) and names else None  # a misspelt name
        raise Invalid(path, f"expected {expected}{' as a key' if is_key else ''}, got {type(here).__name__} {here!r}"
                      + (f"; did you mean {hint!r}?" if hint else "")) from None


def check_fields(data: Any, model: Any, where: str, field: str = "") -> None:
    """Check a file's ``data`` (a config, a suite; or its section ``field``) against its pydantic
    ``model``; the first problem is a one-line :class:`~clbench.errors.UserError` at
    ``<where>: <field path>``."""
    try:
        check_value(data, model)
    except Invalid as err:
        below = err.path.removeprefix(".")
        field = f"{field}{err.path}" if field else below
        fix = err.fix or fix_for(field, annotation_at(model, below))
        raise UserError(err.what, where=f"{where}: {field}" if field else where, fix=fix) from None


def annotation_at(annotation: Any, path: str) -> Any:
    """The annotation of the field at ``path`` (``train.optimizer``, ``seeds[1]``) below a model,
    with the constraints its ``Field`` declares; ``Any`` where the path leaves the models."""
    from pydantic import BaseModel

    for step in re.findall(r"[^.\[\]]+", path):
        annotation = _strip(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and step in annotation.model_fields:
            info = annotation.model_fields[step]
            extras = (*info.metadata, info) if info.description else tuple(info.metadata)
            annotation = Annotated[(info.annotation, *extras)] if extras else info.annotation
        elif typing.get_origin(annotation) is list and step.isdigit():
            annotation = typing.get_args(annotation)[0]
        else:
            return Any
    return annotation


def _strip(annotation: Any) -> Any:
    """``annotation`` without its constraints and, in a union, its model (or list) branch."""
    from pydantic import BaseModel

    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            arg = _strip(arg)
            if (isinstance(arg, type) and issubclass(arg, BaseModel)) or typing.get_origin(arg) is list:
                return arg
    return annotation


def fix_for(name: str, annotation: Any) -> str:
    """How to fix a bad value of parameter ``name``: ``give lr a value of type float | Tensor``,
    ``set policy to one of 'reservoir', 'class_balanced'``, ``set flag to true or false``."""
    if _strip(annotation) is bool:
        return f"set {name} to true or false"
    said = _description(annotation)
    if said:
        return f"give {name} {said}"
    text = describe(annotation)
    named = any(typing.get_origin(a) is Literal for a in (typing.get_args(annotation) or (annotation,)))
    return f"set {name} to {text}" if named or text.startswith("one of ") else f"give {name} a value of type {text}"


def _description(annotation: Any) -> str | None:
    """The words a ``Field(description=...)`` in an ``Annotated`` gives for what a value may be."""
    if typing.get_origin(annotation) is Annotated:
        for meta in annotation.__metadata__:
            if getattr(meta, "description", None):
                return meta.description
    return None


def describe(annotation: Any) -> str:
    """An annotation as a config author reads it: ``float | Tensor``, ``list[int]``, ``int >= 1``."""
    if annotation is type(None):
        return "null"
    if is_typeddict(annotation):
        return f"mapping of {', '.join(annotation.__annotations__)}"
    if annotation is dict or (isinstance(annotation, type) and hasattr(annotation, "model_fields")):
        return "mapping"  # a section of a file (a pydantic model)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is dict and args and args[0] is str and args[1] is Any:
        return "mapping"
    said = _description(annotation)
    if said:
        return said
    if origin is Annotated:
        bounds = {}
        for meta in annotation.__metadata__:
            for item in getattr(meta, "metadata", [meta]):  # a pydantic Field holds its constraints
                bounds.update({attr: getattr(item, attr) for attr in ("ge", "gt", "le", "lt")
                               if getattr(item, attr, None) is not None})
        low = [(k, v) for k, v in bounds.items() if k in ("ge", "gt")]
        high = [(k, v) for k, v in bounds.items() if k in ("le", "lt")]
        base = describe(args[0])
        if low and high:
            (lk, lv), (hk, hv) = low[0], high[0]
            return f"{base} in {'[' if lk == 'ge' else '('}{lv}, {hv}{']' if hk == 'le' else ')'}"
        signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
        return " ".join([base, *(f"{signs[k]} {v}" for k, v in low + high)])
    if origin is Union or origin is types.UnionType:
        choices = [a for a in args if typing.get_origin(a) is Literal]
        if choices and all(a is type(None) or a in choices for a in args):  # names, or null
            names = ", ".join(repr(v) for a in choices for v in typing.get_args(a))
            return f"one of {names}" + (", or null" if type(None) in args else "")
        return " | ".join(", ".join(repr(v) for v in typing.get_args(a)) if typing.get_origin(a) is Literal
                          else describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if args:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else describe(a) for a in args)}]"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
