"""``DIR/suite.json``: which grid points make up a leaderboard directory, in suite order.

``clbench leaderboard run`` writes it (:meth:`clbench.leaderboard.suite.Suite.manifest`):
``{name, description, source, threads, runs: [{hash, strategy, benchmark, model, order,
seed, unranked?}]}`` (``unranked``: why the suite shows that point's row below the ranking,
:class:`~clbench.leaderboard.suite_file.StrategyItem`). Render and compare show exactly the
runs it lists, in its order, and say which other entries they left out and why
(:func:`left_out`). A directory without one shows every entry; a ``suite.json`` that is there
but unreadable or malformed is refused rather than passed over, since passing over it would
silently show another set of runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from clbench.errors import UserError
from clbench.received import read_json

MANIFEST = "suite.json"
UNRANKED_MAX = 400  # characters: the bound on the sentence, in the suite file and suite.json alike
_HASH = re.compile(r"^[0-9a-f]{64}$")


def _fix(path: Path) -> str:
    return (f"rewrite it with 'clbench leaderboard run --suite SUITE --output {path.parent}' (reruns nothing "
            "already done), or delete it to show every entry")


def _refuse(path: Path, what: str) -> UserError:
    return UserError(what, where=str(path), fix=_fix(path))


def unranked_problem(reason: object) -> str | None:
    """What is wrong with an ``unranked`` sentence (the suite file's or a received suite.json's),
    or None: it must be one non-empty line of at most :data:`UNRANKED_MAX` characters."""
    if not isinstance(reason, str) or not reason.strip() or len(reason.splitlines()) != 1:
        return "must be one non-empty line"
    if len(reason) > UNRANKED_MAX:
        return f"must be at most {UNRANKED_MAX} characters"
    return None


def read_manifest(root: str | Path) -> dict | None:
    """``DIR/suite.json`` checked, or None when there is none; a :class:`UserError` if it is malformed."""
    path = Path(root) / MANIFEST
    if not path.exists():
        return None
    data = read_json(path, fix=_fix(path))  # a regular file, of bounded size and depth, or refused
    if not isinstance(data, dict):
        raise _refuse(path, f"expected a JSON object, got {type(data).__name__}")
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise _refuse(path, "missing or invalid 'name'")
    for key in ("description", "source"):
        if key in data and data[key] is not None and not isinstance(data[key], str):
            raise _refuse(path, f"'{key}' must be a string")
    runs = data.get("runs")
    if not isinstance(runs, list):
        raise _refuse(path, "missing or invalid 'runs' (a list of {hash, ...})")
    seen: set[str] = set()
    for i, run in enumerate(runs):
        digest = run.get("hash") if isinstance(run, dict) else None
        if not isinstance(digest, str) or not _HASH.match(digest):
            raise _refuse(path, f"runs[{i}] has no valid 'hash' (64 hex digits)")
        if digest in seen:
            raise _refuse(path, f"runs[{i}]: hash {digest[:12]}... is listed twice")
        seen.add(digest)
        if "unranked" in run and (problem := unranked_problem(run["unranked"])):
            raise _refuse(path, f"runs[{i}].unranked {problem}")
    return data


def manifest_hashes(root: str | Path) -> list[str] | None:
    """The config hashes ``DIR/suite.json`` lists, in suite order; None without a manifest."""
    manifest = read_manifest(root)
    return [run["hash"] for run in manifest["runs"]] if manifest else None


def manifest_unranked(root: str | Path) -> dict[str, str]:
    """Config hash -> why the suite shows its row below the ranking, for each run ``suite.json``
    marks ``unranked``; empty without a manifest."""
    manifest = read_manifest(root)
    return {run["hash"]: run["unranked"] for run in manifest["runs"] if run.get("unranked")} if manifest else {}


def left_out(root: str | Path, shown: int = 3) -> str | None:
    """One line naming the entry files a manifest leaves out of the tables, and why (another suite's
    entries copied in, or configs the suite no longer lists); None when it leaves out none."""
    from clbench.leaderboard.entries import ENTRIES_DIR, check_entry_names

    hashes = manifest_hashes(root)
    if hashes is None:
        return None
    listed, name = set(hashes), read_manifest(root)["name"]
    groups: dict[str, list[str]] = {}
    for file in check_entry_names(root):
        if file.removesuffix(".json") in listed:
            continue
        try:
            suite = read_json(Path(root) / ENTRIES_DIR / file, fix="").get("suite")
        except (UserError, AttributeError):
            suite = None
        why = f"of configs suite {name} no longer lists" if suite == name else \
            f"of suite {suite}, not {name}" if suite else f"made outside suite {name}"
        groups.setdefault(why, []).append(f"{ENTRIES_DIR}/{file}")
    if not groups:
        return None
    parts = []
    for why, files in groups.items():
        more = f" and {len(files) - shown} more" if len(files) > shown else ""
        parts.append(f"{len(files)} {'entry' if len(files) == 1 else 'entries'} {why} "
                     f"({', '.join(files[:shown])}{more})")
    return f"{root}: left out of the tables, as {MANIFEST} does not list them: {'; '.join(parts)}"
