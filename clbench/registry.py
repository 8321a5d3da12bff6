"""Name -> factory lookup for strategies, benchmarks and models.

A name resolves, in this order, to:

1. something registered in this process with :func:`register` (a decorator, for code that is
   imported before the run starts);
2. an entry point in the group ``clbench.<kind>`` (built-ins are declared this way in
   ``pyproject.toml``, and third-party packages ship plugins the same way);
3. an import path: ``package.module:Name``, ``package.module.Name`` or ``path/to/file.py:Name``
   (a file outside any package works, so a strategy can live in the user's own folder).

Listing reads entry-point metadata only, so ``clbench list`` never imports torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable

from clbench.errors import UserError, did_you_mean

KINDS = ("strategies", "benchmarks", "models")
SINGULAR = {"strategies": "strategy", "benchmarks": "benchmark", "models": "model"}

_registered: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str) -> Callable[[Any], Any]:
    """Decorator: make ``obj`` reachable as ``name`` for ``kind`` in this process."""
    if kind not in KINDS:
        raise ValueError(f"unknown registry kind {kind!r}; expected one of {KINDS}")

    def wrap(obj: Any) -> Any:
        _registered[kind][name] = obj
        return obj

    return wrap


def _entry_points(kind: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=f"clbench.{kind}")}


def available(kind: str) -> dict[str, str]:
    """Short name -> import target (``module:attr``), without importing anything."""
    names = {name: ep.value for name, ep in _entry_points(kind).items()}
    for name, obj in _registered[kind].items():
        names[name] = f"{obj.__module__}:{obj.__qualname__}"
    return dict(sorted(names.items()))


def _looks_like_path(name: str) -> bool:
    return ":" in name or "." in name or "/" in name


def _load_from_file(path: Path, attr: str, where: str) -> Any:
    if not path.is_file():
        raise UserError(f"file {path} does not exist", where=where,
                        fix="give an existing .py file as 'path/to/file.py:ClassName'")
    module_name = f"clbench_user_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except SyntaxError as err:
            del sys.modules[module_name]
            raise UserError(f"syntax error in {path} at line {err.lineno}: {err.msg}", where=where,
                            fix="fix the file") from None
        except Exception:
            del sys.modules[module_name]
            raise
    module = sys.modules[module_name]
    if not hasattr(module, attr):
        raise UserError(f"{path} has no attribute '{attr}'", where=where,
                        fix=f"define {attr} in {path} or fix the name after ':'")
    return getattr(module, attr)


def _load_import_path(name: str, where: str) -> Any:
    if ":" in name:
        module_part, attr = name.rsplit(":", 1)
    else:
        module_part, _, attr = name.rpartition(".")
    if module_part.endswith(".py"):
        return _load_from_file(Path(module_part), attr, where)
    try:
        module = importlib.import_module(module_part)
    except ModuleNotFoundError as err:
        if err.name and module_part.startswith(err.name):
            raise UserError(f"cannot import module '{module_part}'", where=where,
                            fix="check the import path or install the package that provides it") from None
        raise
    if not hasattr(module, attr):
        raise UserError(f"module '{module_part}' has no attribute '{attr}'", where=where,
                        fix="check the name after the module path")
    return getattr(module, attr)


def resolve(kind: str, name: str, *, where: str | None = None) -> Any:
    """The factory (class or function) that ``name`` stands for, or a :class:`UserError`."""
    where = where or kind
    if not isinstance(name, str) or not name:
        raise UserError(f"expected a {SINGULAR[kind]} name or import path, got {name!r}", where=where,
                        fix=f"run 'clbench list {kind}' for the names")
    if name in _registered[kind]:
        return _registered[kind][name]
    eps = _entry_points(kind)
    if name in eps:
        return eps[name].load()
    if _looks_like_path(name):
        return _load_import_path(name, where)
    raise UserError(f"unknown {SINGULAR[kind]} '{name}'", where=where, fix=did_you_mean(name, available(kind)))
