"""Name -> factory lookup for strategies, benchmarks and models.

A name resolves, in this order, to:

1. something registered in this process with :func:`register` (a decorator, for code that is
   imported before the run starts);
2. an entry point in the group ``clbench.<kind>`` (built-ins are declared this way in
   ``pyproject.toml``, and third-party packages ship plugins the same way);
3. an import path: ``package.module:Name``, ``package.module.Name`` or ``path/to/file.py:Name``
   (a file outside any package works, so a strategy can live in the user's own folder).

Listing reads entry-point metadata only, so ``clbench list`` never imports torch. An exception
raised while importing or building a plugin is reported at the plugin's own line
(:func:`plugin_failure`), and :func:`plugin_source` names the file a plugin's code came from,
with its hash, so a result made with it can be reproduced.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable

from clbench.errors import UserError, did_you_mean

KINDS = ("strategies", "benchmarks", "models", "objectives")
SINGULAR = {"strategies": "strategy", "benchmarks": "benchmark", "models": "model", "objectives": "objective"}

_registered: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str) -> Callable[[Any], Any]:
    """Decorator: make ``obj`` reachable as ``name`` for ``kind`` in this process."""
    if kind not in KINDS:
        raise ValueError(f"unknown registry kind {kind!r}; expected one of {KINDS}")

    def wrap(obj: Any) -> Any:
        _registered[kind][name] = obj
        return obj

    return wrap


@functools.lru_cache(maxsize=None)
def _entry_points(kind: str) -> dict[str, Any]:
    """Read once per process: each read scans every installed distribution's metadata."""
    return {ep.name: ep for ep in entry_points(group=f"clbench.{kind}")}


def available(kind: str) -> dict[str, str]:
    """Short name -> import target (``module:attr``), without importing anything."""
    names = {name: ep.value for name, ep in _entry_points(kind).items()}
    for name, obj in _registered[kind].items():
        names[name] = f"{obj.__module__}:{obj.__qualname__}"
    return dict(sorted(names.items()))


def looks_like_path(name: str) -> bool:
    return ":" in name or "." in name or "/" in name


def display_name(class_path: Any) -> Any:
    """How tables name a component: a short name as it is, an import path or a file by the class
    or function it names (``my_pkg.methods:SI`` and ``path/to/si.py:SI`` both show as ``SI``)."""
    if not isinstance(class_path, str) or not looks_like_path(class_path):
        return class_path
    return class_path.rsplit(":", 1)[1] if ":" in class_path else class_path.rpartition(".")[2]


# The harness's own code, by where it lives (not by package name: a user's own `strategies`
# package is the user's code).
HARNESS_PACKAGES = ("clbench", "clbench.strategies", "clbench.benchmarks")


@functools.lru_cache(maxsize=None)
def _harness_roots() -> tuple[Path, ...]:
    roots = []
    for name in HARNESS_PACKAGES:
        spec = importlib.util.find_spec(name)
        roots += [Path(p).resolve() for p in (spec.submodule_search_locations or [])] if spec else []
    return tuple(roots)


def is_harness_file(filename: str | Path | None) -> bool:
    """Whether a source file is part of the harness (clbench and its built-in plugins)."""
    if not filename or str(filename).startswith("<"):
        return False
    path = Path(filename).resolve()
    return any(path.is_relative_to(root) for root in _harness_roots())


def _is_harness_module(module_name: str) -> bool:
    return is_harness_file(_origin(module_name))


def is_plugin(obj: Any) -> bool:
    """Whether ``obj`` (a class or function) comes from outside the harness's own code."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return not is_harness_file(getattr(module, "__file__", None))


def _module_name(path: Path) -> str:
    """A stable module name per file (the same in every process, unlike ``hash()``)."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    return f"clbench_user_{path.stem}_{digest}"


def shown_path(filename: str) -> str:
    """A user's file as an error names it: relative to the working directory where it is inside
    it (``my_strategy.py``), else as given."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    except ValueError:
        return filename


def plugin_failure(err: BaseException, *, where: str, doing: str, path: str | Path | None = None) -> UserError:
    """A one-line error for an exception raised by the user's code: its own file and line
    (``my_strategy.py:12: ZeroDivisionError: division by zero``), not the harness's stack.

    The frame shown is the innermost one in ``path`` (the plugin's file) if the traceback has
    one, else the innermost one outside the harness and the Python installation.
    """
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if path is not None and Path(f.filename).resolve() == Path(path).resolve()]
    if not own:
        roots = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
        roots += list(_harness_roots())
        own = [f for f in frames if not f.filename.startswith("<")
               and not any(Path(f.filename).resolve().is_relative_to(root) for root in roots)]
    frame = (own or frames or [None])[-1]
    at = f"{shown_path(frame.filename)}:{frame.lineno}: " if frame is not None else ""
    detail = str(err) or repr(err)
    return UserError(f"{at}{type(err).__name__}: {detail}", where=where,
                     fix=f"raised while {doing}; fix the code at that line")


def _load_from_file(path: Path, attr: str, where: str) -> Any:
    if not path.is_file():
        raise UserError(f"file {path} does not exist", where=where,
                        fix="give an existing .py file as 'path/to/file.py:ClassName'")
    module_name = _module_name(path)
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
        except (Exception, SystemExit) as err:  # sys.exit() in a plugin is its failure, not the run's end
            del sys.modules[module_name]
            raise plugin_failure(err, where=where, doing=f"importing {path}", path=path) from None
    module = sys.modules[module_name]
    if not hasattr(module, attr):
        raise UserError(f"{path} has no attribute '{attr}'", where=where,
                        fix=f"define {attr} in {path} or fix the name after ':'")
    return getattr(module, attr)


def load_import_path(name: str, where: str) -> Any:
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
        if _is_harness_module(module_part):
            raise
        raise plugin_failure(err, where=where, doing=f"importing {module_part}", path=_origin(module_part)) from None
    except SyntaxError as err:
        raise UserError(f"syntax error in {err.filename} at line {err.lineno}: {err.msg}", where=where,
                        fix="fix the file") from None
    except (Exception, SystemExit) as err:
        if _is_harness_module(module_part):
            raise
        raise plugin_failure(err, where=where, doing=f"importing {module_part}", path=_origin(module_part)) from None
    if not hasattr(module, attr):
        raise UserError(f"module '{module_part}' has no attribute '{attr}'", where=where,
                        fix="check the name after the module path")
    return getattr(module, attr)


def check_name(kind: str, name: Any, *, where: str | None = None) -> None:
    """Refuse what :func:`resolve` would refuse from the name alone (not a name, an unknown short
    name, a plugin file that does not exist), importing nothing: entry-point metadata and the
    file system only, so a config's typo is answered before torch and the plugins load."""
    where = where or kind
    if not isinstance(name, str) or not name:
        raise UserError(f"expected a {SINGULAR[kind]} name or import path, got {name!r}", where=where,
                        fix=f"run 'clbench list {kind}' for the names")
    if name in _registered[kind] or name in _entry_points(kind):
        return
    if not looks_like_path(name):
        raise UserError(f"unknown {SINGULAR[kind]} '{name}'", where=where, fix=did_you_mean(name, available(kind)))
    file = name.rsplit(":", 1)[0]
    if file.endswith(".py") and not Path(file).is_file():
        raise UserError(f"file {file} does not exist", where=where,
                        fix="give an existing .py file as 'path/to/file.py:ClassName'")


def resolve(kind: str, name: str, *, where: str | None = None) -> Any:
    """The factory (class or function) that ``name`` stands for, or a :class:`UserError`."""
    where = where or kind
    check_name(kind, name, where=where)
    if name in _registered[kind]:
        return _registered[kind][name]
    eps = _entry_points(kind)
    if name in eps:
        module_part = eps[name].value.split(":")[0].strip()
        try:
            return eps[name].load()
        except (Exception, SystemExit) as err:
            if _is_harness_module(module_part):
                raise
            raise plugin_failure(err, where=where, doing=f"importing {module_part}",
                                 path=_origin(module_part)) from None
    return load_import_path(name, where)  # an import path: check_name refused anything else


def _origin(module_name: str) -> str | None:
    """The file a module is (or would be) loaded from, without running it where avoidable."""
    module = sys.modules.get(module_name)
    if module is not None:
        return getattr(module, "__file__", None)
    try:  # finding a submodule imports its parents, whose code may raise anything
        spec = importlib.util.find_spec(module_name)
    except Exception:
        return None
    return spec.origin if spec is not None and spec.has_location else None


def plugin_source(class_path: str) -> dict | None:
    """Where a plugin's code lives and a hash of it: ``{"path": <absolute file>, "sha256": <hex>}``.

    For ``path/to/file.py:Name``, that file; for an import path or a third-party entry point,
    its module's file. None for the harness's built-ins (their version is the package's) and
    for names that are not plugins (``adam``). A result records it so that an entry made with
    a plugin can be reproduced, and a changed plugin file is noticed.
    """
    if not isinstance(class_path, str) or not class_path:
        return None
    module_name = None
    for kind in KINDS:
        if class_path in _registered[kind]:
            module_name = getattr(_registered[kind][class_path], "__module__", None)
            break
        if class_path in _entry_points(kind):
            module_name = _entry_points(kind)[class_path].value.split(":")[0]
            break
    if module_name is None:
        if not looks_like_path(class_path):
            return None
        module_part = class_path.rsplit(":", 1)[0] if ":" in class_path else class_path.rpartition(".")[0]
        if module_part.endswith(".py"):
            return _file_source(Path(module_part))
        module_name = module_part
    if _is_harness_module(module_name):
        return None
    origin = _origin(module_name)
    return _file_source(Path(origin)) if origin else None


def _file_source(path: Path) -> dict | None:
    if not path.is_file():
        return None
    return {"path": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
