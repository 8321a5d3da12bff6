"""Which components a config someone sent may name: installed code only, decided before anything
is imported.

Every ``class_path`` in a config (benchmark, model, strategy, objective, optimizer, scheduler,
loggers, and those inside arguments at any depth, e.g. a re-partitioned stream's ``source``, and
a component written as a bare string, ``strategy: my_module:Method``) must be a name registered
by an installed package (its ``clbench.*`` entry points, or :func:`clbench.registry.register` in
this process), by its short name or its import path (``clbench.strategies.naive:Naive``), one of
the harness's short names (``adam``, ``cosine``, ``csv``), a component the harness builds by
import path only (:data:`HARNESS_PATHS`), or a class of ``torch.optim`` /
``torch.optim.lr_scheduler`` / ``lightning.pytorch.loggers`` for the optimizer, scheduler and
loggers; a name given where the config names a benchmark, model, strategy or objective must be
one of that kind. Anything else is refused, naming the file that would run. It is decided from
names and entry-point metadata; the file is found without running it (:func:`_would_run`; for a
module of the harness, :func:`_harness_origin` imports at most its parent packages).

``leaderboard verify`` (:mod:`clbench.leaderboard.trust`) and ``clbench.load_model``
(:mod:`clbench.engine.restore`) both apply :func:`check_components`.
"""

from __future__ import annotations

import importlib.util
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
    registers (entry points, :func:`~clbench.registry.register`, :data:`HARNESS_PATHS`),
    read from metadata: nothing is imported."""
    from clbench.registry import available

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
    from clbench.registry import KINDS

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
    from clbench.registry import is_harness_file

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
