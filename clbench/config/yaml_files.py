"""Reading a config's YAML: YAML 1.2 core-schema scalars, a key given twice refused, nesting bounded.

PyYAML reads YAML 1.1, where ``017`` is octal, ``1:00`` sexagesimal and ``yes`` a boolean; configs
and overrides are read by YAML 1.2's core schema instead (``017`` is 17, ``1:00`` text), so a value
means what the YAML spec in use today says. :func:`read_yaml` words every failure as one line
naming the file; :func:`load_yaml_text` is the parser itself (overrides use it too).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from clbench.errors import UserError


class DuplicateKey(Exception):
    """A mapping key given twice; the caller words it for its file or the command line."""

    def __init__(self, key: Any, line: int):
        super().__init__(key, line)
        self.key, self.line = key, line


# No config needs more than a handful of levels; a value nested thousands deep (a generated or
# hostile file) would exhaust Python's recursion limit in the YAML parser or in any code that walks
# the config, and end in a RecursionError traceback.
MAX_DEPTH = 64


class TooDeep(Exception):
    """A value nested more than :data:`MAX_DEPTH` levels; ``steps`` is where (keys and list indices)."""

    def __init__(self, steps: list, line: int | None = None):
        super().__init__(steps, line)
        self.steps, self.line = list(steps), line

    def error(self, where: str) -> UserError:
        at = f" (line {self.line})" if self.line else ""
        field = f"{where}: {_path_text(self.steps)}" if self.steps else where
        return UserError(f"nested more than {MAX_DEPTH} levels deep{at}", where=field,
                         fix="a config needs a few levels of mappings and lists: flatten the value")


def _path_text(steps: list) -> str:
    """``["strategy", "init_args", "x", 0, 0, ...]`` -> ``strategy.init_args.x[0][0]...`` (first 6 steps)."""
    text = ""
    for step in steps[:6]:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else str(step))
    return text + ("..." if len(steps) > 6 else "")


def check_depth(value: Any, where: str) -> None:
    """Refuse a mapping or list nested deeper than :data:`MAX_DEPTH` (walked without recursion)."""
    stack = [(value, [])]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise TooDeep(path).error(where)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, (list, tuple)) else ()
        stack.extend((child, path + [key]) for key, child in items)


# YAML 1.2's core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), exactly, for every
# YAML the harness reads. PyYAML implements YAML 1.1, which reads `017` as 15 (octal), `1:00` as
# 60 (base 60), `0b1000000` as 64, `1_0` as 10, `yes`/`no`/`on`/`off` as booleans, `1e-3` (no
# dot) as text and `2024-01-02` as a date: a value a person wrote would reach the run as another
# one without a word. Under the core schema `017` is the integer 17, `0o17` is 15, `0x1f` is 31,
# and `1:00`, `0b1000000`, `1_0`, `yes` and dates are text, which a typed field then refuses by
# name. Non-finite floats are `.inf`, `-.inf` and `.nan` (read as floats and refused where a
# field must be finite). Merge keys (`<<`, YAML 1.1) are kept: they change no scalar's value.
_CORE = {
    "tag:yaml.org,2002:null": (r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    "tag:yaml.org,2002:bool": (r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    "tag:yaml.org,2002:int": (r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    "tag:yaml.org,2002:float": (r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+0123456789.")),
}
_KEPT = ("tag:yaml.org,2002:merge",)


def _core_int(loader, node) -> int:
    """An int as the core schema writes it (decimal with any leading zeros, ``0o``, ``0x``)."""
    import yaml

    text = loader.construct_scalar(node)
    if re.fullmatch(r"[-+]?[0-9]+", text):
        return int(text, 10)
    if re.fullmatch(r"0o[0-7]+|0x[0-9a-fA-F]+", text):
        return int(text[2:], 8 if text[1] == "o" else 16)
    raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not a YAML 1.2 integer", node.start_mark)


@functools.lru_cache(maxsize=1)
def _strict_loader():
    """YAML's safe loader resolving plain scalars by YAML 1.2's core schema (see above), and
    refusing a key given twice in one mapping (plain YAML keeps the last silently, so a
    forgotten earlier value would decide the run). Merge keys (``<<``) may still be overridden:
    that is what they are for. Every YAML the harness reads (configs, overrides, suites) goes
    through it."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        # Resolvers are a class-level table keyed by first character; build this class's own
        # table from the core schema so plain yaml.SafeLoader stays as it is.
        yaml_implicit_resolvers = {
            first: [(tag, regexp) for tag, regexp in resolvers if tag in _KEPT]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

        def compose_node(self, parent, index):
            # Count the levels while composing: PyYAML's composer recurses once per level.
            path = self.__dict__.setdefault("_clbench_path", [])
            if parent is not None:
                path.append(index if isinstance(index, int) else getattr(index, "value", "(key)"))
            try:
                if len(path) > MAX_DEPTH:
                    raise TooDeep(path, self.peek_event().start_mark.line + 1)
                return super().compose_node(parent, index)
            finally:
                if parent is not None:
                    path.pop()

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable (complex) key: YAML itself refuses it later
                    continue
                if duplicate:
                    raise DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    # Insertion order is resolution order: an int is tried before a float.
    for tag, (pattern, first) in _CORE.items():
        StrictLoader.add_implicit_resolver(tag, re.compile(pattern), first)
    StrictLoader.add_constructor("tag:yaml.org,2002:int", _core_int)
    return StrictLoader


def load_yaml_text(text: str) -> Any:
    """``yaml.safe_load`` with YAML 1.2 core-schema scalars, raising :class:`DuplicateKey` for a key
    given twice and :class:`TooDeep` for a value nested more than :data:`MAX_DEPTH` levels."""
    import yaml

    return yaml.load(text, Loader=_strict_loader())


def read_yaml(path: str | Path) -> dict:
    """A YAML mapping from ``path``, or a one-line :class:`UserError`."""
    import yaml

    path = Path(path)
    if not path.exists():
        raise UserError(f"config file {path} does not exist", fix="check the path given to --config")
    if path.is_dir():
        raise UserError(f"config path {path} is a directory", fix="give a .yaml file")
    try:
        data = load_yaml_text(path.read_text())
    except DuplicateKey as err:
        raise UserError(f"key '{err.key}' is given twice (again at line {err.line})", where=str(path),
                        fix="keep one of them") from None
    except TooDeep as err:
        raise err.error(str(path)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserError(f"malformed YAML{at}: {problem}", where=str(path), fix="fix the YAML syntax") from None
    except UnicodeDecodeError:
        raise UserError("not a text file", where=str(path), fix="give a UTF-8 YAML file") from None
    if data is None:  # an empty file, or comments only: most likely the wrong file or a failed save
        raise UserError("the file is empty", where=str(path),
                        fix="write the settings as 'key: value' lines (see configs/examples/)")
    if not isinstance(data, dict):
        raise UserError(f"top level is a {type(data).__name__}, expected a mapping", where=str(path),
                        fix="write the config as 'key: value' lines")
    return data
