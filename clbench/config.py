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

Validation is written here rather than delegated to jsonargparse because every error must be a
single line naming the file and the field, and because checking a config must not import
torch. ``init_args`` are checked against the target's signature when it is built
(:mod:`clbench.build`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from clbench.errors import UserError, did_you_mean

SCHEMA_VERSION = 1

DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "benchmark": {"class_path": "digits-domains", "init_args": {}},
    "order": "default",
    "model": {"class_path": "mlp", "init_args": {}},
    "strategy": {"class_path": "naive", "init_args": {}},
    "train": {
        "epochs": 3,
        "batch_size": 64,
        "eval_batch_size": 512,
        "optimizer": {"class_path": "adam", "init_args": {"lr": 0.001}},
        "eval_every_epoch": False,
        "num_workers": 0,
        "deterministic": True,
    },
    "metrics": {"reference_models": False},
    "trainer": {"accelerator": "cpu", "devices": 1},
    "logging": {"tensorboard": True, "progress": True},
}

# Keys that do not change what a run computes; left out of the config hash.
NON_SEMANTIC = ("logging",)

# field -> allowed python types (after YAML parsing). Sub-dicts are checked recursively.
_COMPONENT = {"class_path": (str,), "init_args": (dict, type(None))}
_TYPES: dict[str, Any] = {
    "seed": (int,),
    "benchmark": _COMPONENT,
    "order": (str, list, dict),
    "model": _COMPONENT,
    "strategy": _COMPONENT,
    "train": {
        "epochs": (int,),
        "batch_size": (int,),
        "eval_batch_size": (int,),
        "optimizer": _COMPONENT,
        "eval_every_epoch": (bool,),
        "num_workers": (int,),
        "deterministic": (bool,),
    },
    "metrics": {"reference_models": (bool,)},
    "trainer": None,  # free-form: Lightning's Trainer checks its own arguments
    "logging": {"tensorboard": (bool,), "progress": (bool,)},
}
_POSITIVE = {"train.epochs", "train.batch_size", "train.eval_batch_size"}
_NON_NEGATIVE = {"seed", "train.num_workers"}


def _type_names(types) -> str:
    return " or ".join("null" if t is type(None) else {"dict": "mapping", "list": "list"}.get(t.__name__, t.__name__)
                       for t in types)


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


def read_yaml(path: str | Path) -> dict:
    """A YAML mapping from ``path``, or a one-line :class:`UserError`."""
    import yaml

    path = Path(path)
    if not path.exists():
        raise UserError(f"config file {path} does not exist", fix="check the path given to --config")
    if path.is_dir():
        raise UserError(f"config path {path} is a directory", fix="give a .yaml file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserError(f"malformed YAML{at}: {problem}", where=str(path), fix="fix the YAML syntax") from None
    except UnicodeDecodeError:
        raise UserError("not a text file", where=str(path), fix="give a UTF-8 YAML file") from None
    if data is None:
        data = {}
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
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(cfg: dict, overrides: list[str]) -> dict:
    cfg = copy.deepcopy(cfg)
    for text in overrides:
        keys, value = parse_override(text)
        node = cfg
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[keys[-1]] = value
    return cfg


def _shorthand(cfg: dict) -> dict:
    """Allow ``strategy: replay`` for ``strategy: {class_path: replay}``."""
    cfg = dict(cfg)
    for key in ("benchmark", "model", "strategy"):
        if isinstance(cfg.get(key), str):
            cfg[key] = {"class_path": cfg[key], "init_args": {}}
    train = cfg.get("train")
    if isinstance(train, dict) and isinstance(train.get("optimizer"), str):
        cfg["train"] = {**train, "optimizer": {"class_path": train["optimizer"], "init_args": {}}}
    return cfg


def _check(node: Any, spec: Any, path: str, source: str) -> None:
    if spec is None:
        if node is not None and not isinstance(node, dict):
            raise UserError(f"expected a mapping, got {type(node).__name__}", where=f"{source}: {path}",
                            fix="write it as 'key: value' lines")
        return
    if isinstance(spec, tuple):
        # bool is an int subclass; never accept True for a count.
        ok = isinstance(node, spec) and not (isinstance(node, bool) and bool not in spec)
        if not ok:
            raise UserError(f"expected {_type_names(spec)}, got {type(node).__name__} {node!r}",
                            where=f"{source}: {path}", fix=f"set {path} to a value of type {_type_names(spec)}")
        if path in _POSITIVE and node <= 0:
            raise UserError(f"must be positive, got {node}", where=f"{source}: {path}", fix=f"set {path} >= 1")
        if path in _NON_NEGATIVE and node < 0:
            raise UserError(f"must be >= 0, got {node}", where=f"{source}: {path}", fix=f"set {path} >= 0")
        return
    if not isinstance(node, dict):
        raise UserError(f"expected a mapping, got {type(node).__name__} {node!r}", where=f"{source}: {path}",
                        fix="write it as 'key: value' lines")
    for key, value in node.items():
        sub = f"{path}.{key}" if path else key
        if key not in spec:
            raise UserError(f"unknown key '{key}'", where=f"{source}: {sub}", fix=did_you_mean(key, spec))
        _check(value, spec[key], sub, source)


def resolve_config(raw: dict, *, source: str = "config", overrides: list[str] | None = None) -> dict:
    """Defaults + ``raw`` + overrides, validated. ``source`` names the file in errors."""
    if not isinstance(raw, dict):
        raise UserError("top level must be a mapping", where=source)
    raw = _shorthand(raw)
    _check(raw, _TYPES, "", source)
    cfg = deep_merge(DEFAULTS, raw)
    # A new class_path without init_args must not inherit the default's init_args.
    for key in ("benchmark", "model", "strategy"):
        if key in raw and "init_args" not in raw[key]:
            cfg[key]["init_args"] = {}
    if overrides:
        cfg = _shorthand(apply_overrides(cfg, overrides))
        _check(cfg, _TYPES, "", "command line")
    for key in ("benchmark", "model", "strategy"):
        cfg[key]["init_args"] = cfg[key].get("init_args") or {}
        if "class_path" not in cfg[key]:
            raise UserError("missing class_path", where=f"{source}: {key}.class_path",
                            fix=f"run 'clbench list {key if key != 'strategy' else 'strategies'}'")
    _check_order(cfg["order"], source)
    return cfg


def _check_order(order: Any, source: str) -> None:
    where = f"{source}: order"
    if isinstance(order, str):
        return  # named orders are checked by the benchmark, which knows its names
    if isinstance(order, list):
        if not all(isinstance(name, str) for name in order):
            raise UserError("an explicit order is a list of experience names", where=where,
                            fix="write e.g. order: [rot0, rot90, ...]")
        duplicated = sorted({name for name in order if order.count(name) > 1})
        if duplicated:
            raise UserError(f"experience(s) {', '.join(duplicated)} appear more than once", where=where,
                            fix="list each experience exactly once")
        return
    seed = order.get("permutation")
    if set(order) != {"permutation"} or not isinstance(seed, int) or isinstance(seed, bool):
        raise UserError(f"unrecognised order {order!r}", where=where,
                        fix="use a named order, a list of names, or {permutation: <int seed>}")


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
