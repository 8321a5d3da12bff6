"""Leaderboard entries: one JSON file per run, named by the hash of its resolved config.

An entry is the runner's result (``result.json``, see :mod:`clbench.engine.runner`) with the fields a
leaderboard needs on top: ``entry_schema``, ``status``/``error``, ``harness`` (version and git
commit), ``execution`` (torch threads), ``suite``, ``created_at`` and ``content_hash``. A
failed run keeps the same identifying fields (config, hash, names, seed, order, environment)
and the one-line error, so a table can count it and a rerun can find it. The full field list
is in ``docs/leaderboard.md``.

The hash names a *config*, not the code that ran it: after changing a strategy's code, rerun
with ``clbench leaderboard run --force`` (the entry's ``harness.git_commit`` says which code
produced it).

Two hashes protect an entry. The file name is ``config_hash`` (sha256 of the resolved config
without ``logging``), so the same config always lands in the same file and a suite knows what
is done without reading results. ``content_hash`` is the sha256 of the entry's canonical JSON
without ``content_hash`` itself, so an edited score, matrix or config is detected when the
entry is read. A hash only catches accidental damage, though (whoever edits a score can
recompute it), so readers also recompute every score from the stored R matrices and refuse an
entry whose scores differ (:mod:`~clbench.leaderboard.rescore`). Readers refuse entries written
by a newer schema instead of misreading them, and a file in ``entries/`` that is not named
``<config_hash>.json`` is reported, never silently skipped.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from clbench.config.load import SCHEMA_VERSION, canonical_json, config_hash, order_label
from clbench.errors import UserError
from clbench.leaderboard.layout import check_layout
from clbench.results.record import Status

if TYPE_CHECKING:
    from clbench.leaderboard.schema import Entry

ENTRY_SCHEMA = 1
ENTRIES_DIR = "entries"
# The fields an entry has, and their types: clbench.leaderboard.schema.
ENTRY_NAME = re.compile(r"^[0-9a-f]{64}\.json$")


def entries_dir(root: str | Path) -> Path:
    return Path(root) / ENTRIES_DIR


def entry_path(root: str | Path, digest: str) -> Path:
    return entries_dir(root) / f"{digest}.json"


def content_hash(entry: dict) -> str:
    """sha256 of the entry's canonical JSON, ``content_hash`` left out."""
    body = {k: v for k, v in entry.items() if k != "content_hash"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def _harness(env: dict) -> dict:
    from clbench import __version__

    return {"version": __version__, "git_commit": env.get("git_commit")}


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _seal(entry: dict) -> dict:
    entry["content_hash"] = content_hash(entry)
    return entry


def _execution() -> dict:
    """How the process ran (not part of the config, but it can change the last bits of a result)."""
    import torch

    return {"torch_threads": torch.get_num_threads()}


def entry_from_result(result: dict, *, suite: str | None = None) -> dict:
    """An ``ok`` entry from a runner result (the result's fields are kept as they are)."""
    if result.get("status") != Status.OK:
        raise ValueError(f"result status is {result.get('status')!r}, expected 'ok'")
    if config_hash(result["config"]) != result["config_hash"]:
        raise ValueError("result config_hash does not match its config")
    entry = {"entry_schema": ENTRY_SCHEMA, "status": Status.OK, "error": None, "harness": _harness(result["env"]),
             "execution": _execution(), "suite": suite, "created_at": _now()}
    entry.update({k: v for k, v in result.items() if k not in entry})
    return _seal(entry)


def failed_entry(cfg: dict, error: str, *, env: dict, wall_seconds: float, suite: str | None = None) -> dict:
    """A ``failed`` entry: what was run, where, and the one-line error."""
    return _seal({
        "entry_schema": ENTRY_SCHEMA,
        "status": Status.FAILED,
        "error": " ".join(str(error).split()),
        "harness": _harness(env),
        "execution": _execution(),
        "suite": suite,
        "created_at": _now(),
        "benchmark": {"name": cfg["benchmark"]["class_path"], "init_args": cfg["benchmark"]["init_args"]},
        "model": {"name": cfg["model"]["class_path"], "init_args": cfg["model"]["init_args"]},
        "strategy": {"name": cfg["strategy"]["class_path"], "params": cfg["strategy"]["init_args"]},
        "seed": cfg["seed"],
        "order": cfg["order"],
        "order_label": order_label(cfg["order"]),
        "config": cfg,
        "config_hash": config_hash(cfg),
        "env": env,
        "compute": {"wall_seconds": round(wall_seconds, 3)},
    })


def write_entry(root: str | Path, entry: dict) -> Path:
    """Write ``entry`` atomically to ``root/entries/<config_hash>.json``."""
    from clbench.io import write_json

    path = entry_path(root, entry["config_hash"])
    write_json(path, entry)
    return path


def verify_entry(entry: Any, where: str) -> dict:
    """``entry`` if it is a well-formed, untampered entry this version can read; else a UserError."""
    return verified_entry(entry, where).document


def verified_entry(entry: Any, where: str) -> Entry:
    """:func:`verify_entry`'s checks; the entry as its typed model (:mod:`clbench.leaderboard.schema`)."""
    rerun = "delete it and rerun 'clbench leaderboard run' to regenerate it"
    if not isinstance(entry, dict) or "entry_schema" not in entry:
        raise UserError("not a clbench leaderboard entry (no entry_schema)", where=where,
                        fix="keep only entry files in the entries folder")
    schema = entry["entry_schema"]
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise UserError(f"invalid entry_schema {schema!r}", where=where, fix=rerun)
    if schema > ENTRY_SCHEMA:
        raise UserError(f"entry schema {schema} is newer than this clbench reads ({ENTRY_SCHEMA})", where=where,
                        fix="upgrade clbench to read it")
    result_schema = entry.get("schema")
    if isinstance(result_schema, int) and result_schema > SCHEMA_VERSION:
        raise UserError(f"result schema {result_schema} is newer than this clbench reads ({SCHEMA_VERSION})",
                        where=where, fix="upgrade clbench to read it")
    from clbench.leaderboard.schema import validate_entry

    typed = validate_entry(entry, where, rerun)  # every field there, of its type (clbench.leaderboard.schema)
    if content_hash(entry) != entry["content_hash"]:
        raise UserError("content hash mismatch: the entry was modified after it was written", where=where, fix=rerun)
    if not isinstance(entry["config"], dict) or config_hash(entry["config"]) != entry["config_hash"]:
        raise UserError("config does not match its config_hash", where=where, fix=rerun)
    if entry["status"] == Status.OK:
        from clbench.leaderboard.rescore import check_scores

        check_scores(entry, where)
    return typed


def _read_json(path: Path) -> Any:
    """A regular file's JSON, of bounded size and nesting (:mod:`clbench.received`), or a UserError."""
    from clbench.received import read_json

    return read_json(path, fix="delete it and rerun 'clbench leaderboard run' to regenerate it")


def read_entry(path: str | Path) -> dict:
    """Read and verify one entry file (its name must be its config hash); its JSON."""
    return read_typed_entry(path).document


def read_typed_entry(path: str | Path) -> Entry:
    """:func:`read_entry`, as the entry's typed model."""
    path = Path(path)
    entry = verified_entry(_read_json(path), str(path))
    _check_name(path, entry.document)
    return entry


def _check_name(path: Path, entry: Any) -> None:
    if not isinstance(entry, dict) or "entry_schema" not in entry:
        raise UserError("not a clbench leaderboard entry (no entry_schema)", where=str(path),
                        fix=f"keep only entry files in {path.parent}")
    digest = entry.get("config_hash") if isinstance(entry, dict) else None
    if path.stem != digest:
        shown = f" {digest[:12]}..." if isinstance(digest, str) else ""
        raise UserError(f"file name does not match its config_hash{shown}", where=str(path), fix=_rename_hint(path))


def load_entries(root: str | Path, hashes: Iterable[str] | None = None) -> list[Entry]:
    """Every entry under ``root/entries`` (or only ``hashes``), verified and typed
    (:class:`~clbench.leaderboard.schema.Entry`), sorted by file name.

    With ``hashes`` (a suite's grid) the other entries are not read in full, but every file in
    the folder must still be an entry under its own name (:func:`check_entry_names`).
    """
    folder = entries_dir(root)
    if Path(root).exists() and not Path(root).is_dir():
        raise UserError(f"{root} is a file, not a leaderboard folder", where=str(root),
                        fix="give the folder 'clbench leaderboard run --output DIR' wrote")
    if not Path(root).is_dir():
        raise UserError(f"leaderboard directory {root} does not exist", where=str(root),
                        fix="run 'clbench leaderboard run --output DIR' first, or give the right DIR")
    check_layout(root, [ENTRIES_DIR])  # a file named entries is not "no entries/"
    if not folder.is_dir():
        raise UserError(f"no {ENTRIES_DIR}/ folder in {root}", where=str(root),
                        fix="run 'clbench leaderboard run --output DIR' first, or give the right DIR")
    names = check_entry_names(root)
    if hashes is None:
        paths = [folder / name for name in names]
    else:
        paths = [entry_path(root, h) for h in hashes if entry_path(root, h).exists()]
    return [read_typed_entry(p) for p in paths]


def check_entry_names(root: str | Path) -> list[str]:
    """The entry file names under ``root/entries``, sorted; a :class:`UserError` for any other file.

    Every file there must be an entry named ``<config_hash>.json`` after the hash it holds: a
    copy or a renamed entry would otherwise be left out of every table without a word. Entries
    of configs a suite no longer lists are checked for their name only (they are kept, not
    shown). Hidden files (an interrupted atomic write's ``.<name>.<random>.tmp``) are passed over.
    """
    if not entries_dir(root).is_dir():
        return []
    names = []
    for path in sorted(entries_dir(root).iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_dir() or not ENTRY_NAME.match(path.name):
            raise UserError("not an entry file name (entries are named <config_hash>.json, 64 hex digits)",
                            where=str(path), fix=_rename_hint(path))
        _check_name(path, _read_json(path))  # a pipe or a device under an entry's name is refused unread
        names.append(path.name)
    return names


def _rename_hint(path: Path) -> str:
    """How to fix a stray file in ``entries/``: rename it if it is an entry, else move it out."""
    try:
        entry = _read_json(path) if path.is_file() else None
    except UserError:
        entry = None
    digest = entry.get("config_hash") if isinstance(entry, dict) else None
    if not (isinstance(digest, str) and ENTRY_NAME.match(f"{digest}.json")):
        return f"move it out of {path.parent}"
    if entry_path(path.parent.parent, digest).exists():
        return f"delete it: {digest}.json holds the same run"
    return f"rename it to {digest}.json, or delete it"
