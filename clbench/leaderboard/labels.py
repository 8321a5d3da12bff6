"""Row and table labels: a method or stream named once, its variants told apart by what they set."""

from __future__ import annotations

from typing import Any

from clbench.config.load import canonical_json


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: canonical_json(node)}


def _short(path: str) -> str:
    return path.replace(".init_args", "").removesuffix(".class_path")


def _plain(value: str) -> str:
    """A flattened JSON value for a label: strings without quotes."""
    return value[1:-1] if value.startswith('"') and value.endswith('"') else value


def disambiguate(labels: list[str], configs: list[dict], component: str) -> list[str]:
    """Append ``field=value`` for the fields that differ between items sharing a label.

    A field an item does not set is left out of its label rather than shown as missing (the
    item runs with the component's default), and the fields of the labelled ``component`` drop
    its name: ``ewc`` beside ``ewc (gamma=1.0, mode=online)``, not
    ``ewc (strategy.gamma=—, strategy.mode=—)``. Labels stay distinct: two items that set the
    same fields to the same values are one item."""
    out = list(labels)
    for label in set(labels):
        idx = [i for i, lab in enumerate(labels) if lab == label]
        if len(idx) < 2:
            continue
        flat = [_flatten(configs[i]) for i in idx]
        keys = sorted(set().union(*flat))
        varying = sorted((k for k in keys if len({f.get(k) for f in flat}) > 1),
                         key=lambda k: (not k.startswith(component + "."), k))  # the component's own first
        for i, f in zip(idx, flat):
            parts = [f"{_short(k).removeprefix(component + '.')}={_plain(f[k])}" for k in varying if k in f]
            out[i] = f"{label} ({', '.join(parts)})" if parts else label
    return out
