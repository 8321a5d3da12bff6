"""Run configuration: YAML in, a validated plain dict out, and its content hash.

A run config names each component the way Lightning's CLI does, with ``class_path`` (a short
registered name or an import path) and ``init_args``::

    seed: 0
    benchmark: {class_path: digits-domains, init_args: {test_fraction: 0.3}}
    order: default                      # a named order, a list of experience names,
                                        # or {permutation: 3} for a seeded shuffle
    model: {class_path: cnn}
    strategy: {class_path: replay, init_args: {mem_size: 200}}
    train: {epochs: 3, batch_size: 64, optimizer: {class_path: adam, init_args: {lr: 0.001}}}
    trainer: {accelerator: cpu, devices: 1}   # passed to lightning.Trainer as is

The fields' types, ranges and defaults are pydantic models (:mod:`clbench.config.schema`),
worded as one line naming the file and the field by :mod:`clbench.config.validation`, the same
mechanism that checks every component's ``init_args`` against its signature when it is built
(:mod:`clbench.plugins.build`). Checking a config imports pydantic, never torch; importing this module
imports neither.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from clbench.errors import UserError, did_you_mean

# result.json's schema; 2 added r_stderr, r_init_stderr, r_n and scores_stderr (readers of 2 read 1).
SCHEMA_VERSION = 2

# Keys that do not change what a run computes; left out of the config hash.
NON_SEMANTIC = ("logging", "save")


def deep_merge(base: dict, update: dict) -> dict:
    """``base`` with ``update`` laid over it; mappings merge, everything else replaces.

    A component whose ``class_path`` changes is replaced whole: the old component's
    ``init_args`` mean nothing to the new one.
    """
    out = copy.deepcopy(base)
    for key, value in update.items():
        current = out.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            if "class_path" in value and value["class_path"] != current.get("class_path"):
                out[key] = copy.deepcopy(value)
            else:
                out[key] = deep_merge(current, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


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


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"strategy.init_args.mem_size=100"`` -> (["strategy", "init_args", "mem_size"], 100)."""
    import yaml

    if "=" not in text:
        raise UserError(f"override '{text}' has no '='", where="command line",
                        fix="write overrides as key.path=value, e.g. train.epochs=5")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml_text(raw) if raw != "" else None
    except DuplicateKey as err:
        raise UserError(f"key '{err.key}' is given twice", where=f"command line: {key.strip()}",
                        fix="keep one of them") from None
    except TooDeep as err:
        raise TooDeep(key.strip().split(".") + err.steps).error("command line") from None
    except yaml.YAMLError:
        value = raw
    keys = key.strip().split(".")
    if len(keys) > MAX_DEPTH:
        raise TooDeep(keys).error("command line")
    return keys, value


def _open_brackets(text: str) -> int:
    return sum(text.count(c) for c in "{[") - sum(text.count(c) for c in "}]")


def rejoin_overrides(overrides: list[str]) -> list[str]:
    """Undo a shell's split of an unquoted flow value: ``order={permutation: 3}`` arrives as
    ``order={permutation:`` and ``3}``. A word without ``=`` continues the previous override
    while that one's brackets are still open."""
    out: list[str] = []
    for word in overrides:
        if out and "=" in out[-1] and _open_brackets(out[-1].split("=", 1)[1]) > 0 and "=" not in word:
            out[-1] = f"{out[-1]} {word}"
        else:
            out.append(word)
    return out


def override_keys(overrides: list[str]) -> list[str]:
    """The dotted fields the command line sets (``train.epochs``, ``strategy``...)."""
    return [text.split("=", 1)[0].strip() for text in rejoin_overrides(overrides) if "=" in text]


def apply_overrides(cfg: dict, overrides: list[str]) -> dict:
    """``cfg`` with the command line's ``key.path=value`` settings laid over it.

    Changing a component's ``class_path`` drops the ``init_args`` the config gave the old
    component (as :func:`deep_merge` does), so ``strategy.class_path=ewc`` does not hand a
    replay buffer's size to EWC; ``init_args`` set on the command line are kept, in any order.
    """
    cfg = copy.deepcopy(cfg)
    parsed = [parse_override(text) for text in rejoin_overrides(overrides)]
    for keys, value in parsed:
        if keys[-1] == "class_path" and len(keys) > 1:
            node = cfg
            for key in keys[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get("class_path") != value:
                node["init_args"] = {}
    for keys, value in parsed:
        node = cfg
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[keys[-1]] = value
    return cfg


def blame_overrides(err: UserError, source: str, overrides: list[str] | None) -> UserError:
    """Name the command line, not the config file, in an error about a field an override set.

    Components check their ``init_args`` after the config is resolved and only know the file
    (``cfg.yaml: strategy.init_args.mem_size``); a value that came from the command line is
    blamed on it (``command line: strategy.init_args.mem_size``).
    """
    prefix = f"{source}: "
    if not overrides or not err.where or not err.where.startswith(prefix):
        return err
    field = err.where[len(prefix):]
    if any(field == key or field.startswith((key + ".", key + "[")) for key in override_keys(overrides)):
        err.where = f"command line: {field}"
        err.args = (err.one_line(),)
    return err


def _shorthand(cfg: dict) -> dict:
    """Allow ``strategy: replay`` for ``strategy: {class_path: replay}``."""
    cfg = dict(cfg)
    for key in ("benchmark", "model", "strategy", "objective"):
        if isinstance(cfg.get(key), str):
            cfg[key] = {"class_path": cfg[key], "init_args": {}}
    train = cfg.get("train")
    for key in ("optimizer", "scheduler"):
        if isinstance(train, dict) and isinstance(train.get(key), str):
            train = cfg["train"] = {**train, key: {"class_path": train[key], "init_args": {}}}
    return cfg


def resolve_config(raw: dict, *, source: str = "config", overrides: list[str] | None = None) -> dict:
    """Defaults + ``raw`` + overrides, validated. ``source`` names the file in errors.

    The file is checked on its own (:class:`~clbench.config.schema.RunConfig`) before it is
    merged, so a mistake names the file; after the overrides the merged config is checked
    again, and a mistake in a field an override set names the command line."""
    from clbench.config.schema import RunConfig, defaults
    from clbench.config.validation import check_fields

    if not isinstance(raw, dict):
        raise UserError("top level must be a mapping", where=source)
    check_depth(raw, source)  # a mapping from the Python API never went through the YAML parser
    raw = _shorthand(raw)
    check_fields(raw, RunConfig, source)
    cfg = deep_merge(defaults(), raw)
    # A new class_path without init_args must not inherit the default's init_args.
    for key in ("benchmark", "model", "strategy"):
        if key in raw and "init_args" not in raw[key]:
            cfg[key]["init_args"] = {}
    try:
        if overrides:
            cfg = _shorthand(apply_overrides(cfg, overrides))
            check_fields(cfg, RunConfig, source)
        _complete(cfg, source)
    except UserError as err:  # about a field an override set: the command line is to blame
        raise blame_overrides(err, source, overrides) from None
    return cfg


def _complete(cfg: dict, source: str) -> None:
    """Fill empty ``init_args`` and check what the file alone cannot say (registered names)."""
    # (not the optimizer's: its init_args stay as written, as the config hash has always seen them)
    for component in (cfg["benchmark"], cfg["model"], cfg["strategy"], cfg.get("objective"),
                      cfg["train"].get("scheduler")):
        if component is not None:
            component["init_args"] = component.get("init_args") or {}
    _check_names(cfg, source)


def _check_names(cfg: dict, source: str) -> None:
    """Refuse an unknown short name, or a plugin file that does not exist, from entry-point
    metadata and the file system alone: before torch and the libraries load (seconds), so a typo
    answers at once. What the named component accepts is checked once it is imported."""
    from clbench.plugins import registry

    for key, kind in (("benchmark", "benchmarks"), ("model", "models"), ("strategy", "strategies"),
                      ("objective", "objectives")):
        if cfg.get(key) is None:
            continue  # an optional component (objective) left out
        name = cfg[key].get("class_path")
        where = f"{source}: {key}.class_path"
        if not isinstance(name, str) or not name:
            raise UserError(f"expected a {registry.SINGULAR[kind]} name or import path, got {name!r}", where=where,
                            fix=f"run 'clbench list {kind}' for the names")
        if name in registry.available(kind):
            continue
        if not registry._looks_like_path(name):
            raise UserError(f"unknown {registry.SINGULAR[kind]} '{name}'", where=where,
                            fix=did_you_mean(name, registry.available(kind)))
        file = name.rsplit(":", 1)[0]
        if file.endswith(".py") and not Path(file).is_file():
            raise UserError(f"file {file} does not exist", where=where,
                            fix="give an existing .py file as 'path/to/file.py:ClassName'")


def check_order(order: Any, where: str) -> None:
    """A run's ``order`` (or one of a suite's ``orders``): a name, a list of experience names or
    ``{permutation: <seed >= 0>}`` (:func:`clbench.config.schema.order_problem`, the rule the
    config's own check uses). ``where`` names the file and field in errors."""
    from clbench.config.schema import order_problem

    problem = order_problem(order)
    if problem:
        raise UserError(problem[0], where=where, fix=problem[1])


def load_config(path: str | Path, overrides: list[str] | None = None) -> dict:
    return resolve_config(read_yaml(path), source=str(path), overrides=overrides)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(cfg: dict) -> str:
    """sha256 of the resolved config, without the keys that do not change results."""
    semantic = {k: v for k, v in cfg.items() if k not in NON_SEMANTIC}
    return hashlib.sha256(canonical_json(semantic).encode()).hexdigest()


def order_label(order: Any) -> str:
    """A short human label for an order setting (used in tables and entry names)."""
    if isinstance(order, str):
        return order
    if isinstance(order, dict):
        return f"perm{order['permutation']}"
    return "custom:" + hashlib.sha1(canonical_json(order).encode()).hexdigest()[:8]
