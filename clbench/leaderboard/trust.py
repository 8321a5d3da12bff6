"""What a received leaderboard may make ``leaderboard verify`` run: checked before anything is imported.

Verify reruns the configs recorded in a folder that someone else may have made, so they are
untrusted input like any file from outside: a ``class_path`` may name any Python file or
module (importing it runs it), and a number may ask for a billion epochs. Before an entry is
rerun, :func:`check_entry` refuses, as one line naming the entry and the field:

* a component that is not known to be installed code (:mod:`clbench.plugins.trusted`): every
  ``class_path`` at any depth, and every component written as a bare string, must be a
  registered component of an installed package or one of the harness's own names, decided from
  names and entry-point metadata, importing nothing; anything else is refused, naming the file
  that would run. ``clbench.load_model`` applies the same check to a received run's saved config;
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

import json
import math
from pathlib import Path
from typing import Any, Iterator

from clbench.errors import UserError
from clbench.plugins.trusted import TRUST_FIX, check_components


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
