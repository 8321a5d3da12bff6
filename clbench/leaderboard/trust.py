"""What a received leaderboard may make ``leaderboard verify`` run: checked before anything is imported.

Verify reruns the configs recorded in a folder that someone else may have made, so they are
untrusted input like any file from outside: a ``class_path`` may name any Python file or
module (importing it runs it), and a number may ask for a billion epochs. Before an entry is
rerun, :func:`check_entry` refuses, as one line naming the entry and the field:

* a component that is not known to be installed code: every ``class_path`` in the config
  (benchmark, model, strategy, objective, optimizer, scheduler, loggers, and those inside
  arguments at any depth, e.g. a re-partitioned stream's ``source``, and a component written
  as a bare string, ``strategy: my_module:Method``) must be a name registered by an
  installed package (its ``clbench.*`` entry points, or :func:`clbench.plugins.registry.register`
  in this process), by its short name or its import path (``clbench.strategies.naive:Naive``),
  one of the harness's short names (``adam``, ``cosine``, ``csv``), a component the harness
  builds by import path only (:data:`HARNESS_PATHS`), or a class of ``torch.optim`` /
  ``torch.optim.lr_scheduler`` / ``lightning.pytorch.loggers`` for the optimizer, scheduler and
  loggers; a name given where the config names a benchmark, model, strategy or objective must be
  one of that kind. Anything else (``path/to/evil.py:Evil``, ``subprocess:run``, and a function
  of the harness that is no such component, ``clbench.io:write_json``, which would be called with
  the sender's arguments) is refused, naming the file that would run. It is decided from names
  and entry-point metadata, importing nothing; the file is found without running it
  (:func:`_would_run`; for a module of the harness, :func:`_harness_origin` imports at most its
  parent packages, installed harness code). ``clbench.load_model`` applies the same check
  (:func:`check_components`) to a received run's saved config;
* what the suite the entry claims to come from would not ask: each value of the config (every
  leaf of its nested mappings and lists) must be one the suite's grid gives at that place,
  numbers within the range of the suite's values there (``train.epochs: 1000000000`` against a
  suite of 1 epoch), text and flags equal to one of them (another data folder, another
  accelerator). The suite is the one the folder's ``suite.json`` names as its ``source``, read
  from the working directory or beside the package, as ``leaderboard run`` wrote it, and only
  if git tracks it in the working directory's repository or in clbench's (:func:`_suite_file`):
  a suite file inside the received folder, beside it (``../suite.yaml``) or anywhere else bounds
  nothing (its sender may have written it too) and is refused.

``trust_code=True`` (``--trust-code``) lifts both checks: the folder's code and configs are
then the user's own, and run as they are.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

from clbench.errors import UserError

TRUST_FIX = "pass --trust-code (trust_code=True) only if you trust the folder and its code"

# Import paths a config may give for these fields besides short names: field -> modules.
_LIBRARY_MODULES = {"train.optimizer": ("torch.optim",), "train.scheduler": ("torch.optim.lr_scheduler",),
                    "logging.loggers": ("lightning.pytorch.loggers",)}
_KIND_OF = {"benchmark": "benchmarks", "model": "models", "strategy": "strategies", "objective": "objectives"}
# Where a config may name a component by a bare string (clbench.config.load's shorthand).
_SHORTHAND = {*_KIND_OF, "train.optimizer", "train.scheduler"}
#: Components the harness builds that configs name by import path only (no entry point, so
#: ``clbench list`` does not show them), by kind. Any other import path into ``clbench`` names code
#: that is not a component (``clbench.io:write_json``) and is refused like any other module.
HARNESS_PATHS = {"models": ("clbench.strategies.moe_theory:moe_theory_model",)}


def _module_and_attr(class_path: str) -> tuple[str, str]:
    if ":" in class_path:
        module, attr = class_path.rsplit(":", 1)
    else:
        module, _, attr = class_path.rpartition(".")
    return module, attr


def _is_file_path(module: str) -> bool:
    return module.endswith(".py") or "/" in module or "\\" in module


def _would_run(class_path: str) -> str:
    """The file importing ``class_path`` would execute, found without executing anything."""
    from importlib.machinery import PathFinder

    module, _ = _module_and_attr(class_path)
    if _is_file_path(module):
        return str(Path(module).resolve())
    parts = module.split(".")
    search = None
    spec = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        try:  # PathFinder reads folders only; it never imports a parent package
            spec = PathFinder.find_spec(name, search)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return f"module {module} (not found here)"
        search = spec.submodule_search_locations
        if search is None and i < len(parts) - 1:
            return spec.origin or f"module {module}"
    return spec.origin if spec is not None and spec.has_location else f"module {module}"


def _target(value: str) -> tuple[str, str]:
    """An entry point's ``module:attr [extras]`` as ``(module, attribute)``, the form a config's
    import path is compared in (``a.b:C`` and ``a.b.C`` name the same)."""
    return _module_and_attr(value.split("[", 1)[0].replace(" ", ""))


def _components(kinds: list[str]) -> tuple[set[str], set[tuple[str, str]]]:
    """The short names and the import targets of every component of ``kinds`` this installation
    registers (entry points, :func:`~clbench.plugins.registry.register`, :data:`HARNESS_PATHS`),
    read from metadata: nothing is imported."""
    from clbench.plugins.registry import available

    names: set[str] = set()
    targets: set[tuple[str, str]] = set()
    for kind in kinds:
        registered = available(kind)
        names.update(registered)
        targets.update(_target(value) for value in [*registered.values(), *HARNESS_PATHS.get(kind, ())])
    return names, targets


def _place(field: str) -> str | None:
    """What the config names at ``field``: a registry kind, ``train.optimizer``, ``train.scheduler``,
    ``logging.loggers``, or None inside a component's arguments (any registered kind fits there)."""
    place = field.removesuffix(".class_path")
    if place in _KIND_OF:
        return _KIND_OF[place]
    if place in ("train.optimizer", "train.scheduler"):
        return place
    return "logging.loggers" if re.fullmatch(r"logging\.loggers\[\d+\]", place) else None


def _allowed(class_path: Any, field: str) -> bool:
    from clbench.config.schema import LOGGER_SHORT_NAMES
    from clbench.plugins.build import OPTIMIZERS, SCHEDULERS
    from clbench.plugins.registry import KINDS

    if not isinstance(class_path, str) or not class_path:
        return True  # not a name: the config's own checks refuse it, nothing is imported
    place = _place(field)
    module, attr = _module_and_attr(class_path)
    if place in _LIBRARY_MODULES:
        short = {"train.optimizer": OPTIMIZERS, "train.scheduler": SCHEDULERS, "logging.loggers": LOGGER_SHORT_NAMES}
        given = class_path.lower() if place == "train.optimizer" else class_path
        return given in short[place] or (module in _LIBRARY_MODULES[place] and attr.isidentifier())
    names, targets = _components([place] if place in KINDS else list(KINDS))
    return class_path in names or (module, attr) in targets


def _harness_origin(module: str) -> str | None:
    """The file of ``module`` if it is the harness's own (finding it imports its parent packages,
    which are the harness's: never the module itself, nor anything else)."""
    from clbench.plugins.registry import is_harness_file

    if module != "clbench" and not module.startswith("clbench."):
        return None
    if not all(part.isidentifier() for part in module.split(".")):
        return None
    try:
        spec = importlib.util.find_spec(module)
    except Exception:  # noqa: BLE001 - it only words the refusal: the file is then named as any other
        return None
    origin = spec.origin if spec is not None and spec.has_location else None
    return origin if is_harness_file(origin) else None


def _class_paths(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(field, class_path) for every ``class_path`` in a config at any depth, every component
    named by a bare string, and every logger named by a string."""
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if key == "class_path" or (here in _SHORTHAND and isinstance(item, str)):
                yield here, item
            else:
                yield from _class_paths(item, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            here = f"{path}[{i}]"
            if path == "logging.loggers" and isinstance(item, str):
                yield here, item
            else:
                yield from _class_paths(item, here)


def check_components(config: dict, where: str, *, under: str = "", doing: str = "rerunning it",
                     fix: str = TRUST_FIX) -> None:
    """Refuse a component that is not known installed code (module notes), naming the file it would
    run. ``under`` prefixes the field (the config's place in its file), ``doing`` is what would import it."""
    for field, class_path in _class_paths(config):
        if not _allowed(class_path, field):
            module, attr = _module_and_attr(class_path)
            origin = _harness_origin(module)
            runs = (f"call {attr} in {origin} with the config's arguments" if origin
                    else f"import and run {_would_run(class_path)}")
            raise UserError(f"{under}{field} is '{class_path}', which is not a registered component of an installed "
                            f"package: {doing} would {runs}", where=where, fix=fix)


# -- bounds from the suite --------------------------------------------------------------------------
def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    return json.dumps(value)[:80]


class SuiteBounds:
    """Every value a suite's grid gives, by place in the config (``train.epochs``, ``model.init_args.hidden``)."""

    def __init__(self, name: str, source: Path, configs: list[dict]):
        self.name, self.source = name, source
        self.values: dict[str, list[Any]] = {}
        for config in configs:
            for path, value in _leaves(config):
                self.values.setdefault(path, []).append(value)

    def check(self, config: dict, where: str) -> None:
        """Refuse the first value of ``config`` the suite does not give (see the module notes)."""
        suite = f"suite {self.name} ({self.source})"
        for path, value in _leaves(config):
            given = self.values.get(path)
            if given is None:
                raise UserError(f"{path} is {_shown(value)}, a field {suite} never sets", where=where, fix=TRUST_FIX)
            numbers = [v for v in given if _number(v)]
            if _number(value) and numbers:
                low, high = min(numbers), max(numbers)
                finite = isinstance(value, int) or math.isfinite(value)  # an int of 400 digits is no float
                if not (finite and low <= value <= high):
                    span = f"{_shown(low)}" if low == high else f"{_shown(low)} to {_shown(high)}"
                    raise UserError(f"{path} is {_shown(value)}, outside what {suite} asks ({span})",
                                    where=where, fix=TRUST_FIX)
                continue
            canonical = {json.dumps(v, sort_keys=True) for v in given}
            if json.dumps(value, sort_keys=True) not in canonical:
                raise UserError(f"{path} is {_shown(value)}, which {suite} never gives there", where=where,
                                fix=TRUST_FIX)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the filesystem, a NUL in it
        return False


def _suite_file(root: Path, source: str, manifest_path: Path) -> Path:
    """The suite file ``suite.json``'s ``source`` names (from the working directory or beside the
    package), if git tracks it in the working directory's repository or in clbench's own: any other
    file (inside the received folder, beside it, anywhere an archive unpacks) may have come with
    the folder, so it bounds nothing."""
    from clbench.results.provenance import code_repo, repo_of, tracked

    given = Path(source)
    beside = Path(__file__).resolve().parents[2]
    candidates = [given] if given.is_absolute() else [Path.cwd() / given, beside / given]
    found = [p for p in candidates if _is_file(p)]
    if not found:
        raise UserError(f"the suite its entries come from, {source}, is not here, so what they ask cannot be "
                        "bounded", where=str(manifest_path),
                        fix=f"run verify where {source} is (e.g. the repository's root), or {TRUST_FIX}")
    outside = [p for p in found if not p.resolve().is_relative_to(root.resolve())]
    if not outside:
        raise UserError(f"the suite its entries come from, {source}, is inside the folder being verified, so it "
                        "bounds nothing its sender could not also change", where=str(manifest_path),
                        fix=f"verify with the suite from your own checkout, or {TRUST_FIX}")
    repos = [repo_of(Path.cwd()), code_repo()]
    trusted = next((p for p in outside if tracked(p, repos)), None)
    if trusted is None:
        raise UserError(f"the suite its entries come from, {source}, is {outside[0].resolve()}, which git does not "
                        "track in the working directory's repository or in clbench's, so it may have come with the "
                        "folder and bounds nothing", where=str(manifest_path),
                        fix=f"verify from the repository where {source} is committed, or {TRUST_FIX}")
    return trusted


def suite_bounds(root: str | Path) -> SuiteBounds:
    """The bounds of the suite a leaderboard folder says its entries come from (``suite.json``'s ``source``)."""
    from clbench.leaderboard.manifest import MANIFEST, read_manifest
    from clbench.leaderboard.suite import load_suite

    root = Path(root)
    manifest_path = root / MANIFEST
    manifest = read_manifest(root)
    if manifest is None or not manifest.get("source"):
        what = "no suite.json" if manifest is None else "suite.json names no source suite"
        raise UserError(f"{what}: the suite its entries come from is not known, so what they ask cannot be bounded",
                        where=str(manifest_path if manifest is not None else root), fix=TRUST_FIX)
    path = _suite_file(root, manifest["source"], manifest_path)
    suite = load_suite(path)  # reads and checks the YAML; imports no component
    if suite.name != manifest["name"]:
        raise UserError(f"names suite {manifest['name']}, but {path} is suite {suite.name}",
                        where=str(manifest_path), fix=TRUST_FIX)
    return SuiteBounds(suite.name, path, [spec.config for spec in suite.runs])


def check_entry(entry: dict, path: Path, bounds: SuiteBounds) -> None:
    """Refuse an entry whose config names code that is not installed, or asks more than its suite."""
    where = str(path)
    if entry.get("suite") != bounds.name:
        raise UserError(f"the entry comes from suite {entry.get('suite')}, not from suite {bounds.name} "
                        f"({bounds.source}) that the folder's suite.json names", where=where, fix=TRUST_FIX)
    check_components(entry["config"], where)
    bounds.check(entry["config"], where)
