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
import hashlib
import json
from pathlib import Path
from typing import Any

from clbench.config.yaml_files import MAX_DEPTH, DuplicateKey, TooDeep, check_depth, load_yaml_text, read_yaml
from clbench.errors import UserError

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
    if cfg["train"].get("group_by_length") is False:  # off, as when left out: the same config, the same hash
        del cfg["train"]["group_by_length"]
    _check_names(cfg, source)


def _check_names(cfg: dict, source: str) -> None:
    """Refuse an unknown short name, or a plugin file that does not exist, from entry-point
    metadata and the file system alone: before torch and the libraries load (seconds), so a typo
    answers at once. What the named component accepts is checked once it is imported."""
    from clbench import registry

    for key, kind in (("benchmark", "benchmarks"), ("model", "models"), ("strategy", "strategies"),
                      ("objective", "objectives")):
        if cfg.get(key) is None:
            continue  # an optional component (objective) left out
        registry.check_name(kind, cfg[key].get("class_path"), where=f"{source}: {key}.class_path")


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
