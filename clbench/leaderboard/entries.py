"""Leaderboard entries: one JSON file per run, named by the hash of its resolved config.

An entry is the runner's result (``result.json``, see :mod:`clbench.runner`) with the fields a
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
entry is read. Readers refuse entries written by a newer schema instead of misreading them.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from clbench.config import SCHEMA_VERSION, canonical_json, config_hash, order_label
from clbench.errors import UserError

ENTRY_SCHEMA = 1
ENTRIES_DIR = "entries"
STATUSES = ("ok", "failed")
# Keys every entry has, whatever its status.
COMMON_KEYS = ("entry_schema", "status", "error", "config", "config_hash", "content_hash", "harness", "execution",
               "benchmark",
               "model", "strategy", "seed", "order", "order_label", "env", "compute")
# Keys an ``ok`` entry has in addition (from the runner's result).
RESULT_KEYS = ("schema", "experiences", "r_matrix", "r_init", "scores")


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
    if result.get("status") != "ok":
        raise ValueError(f"result status is {result.get('status')!r}, expected 'ok'")
    if config_hash(result["config"]) != result["config_hash"]:
        raise ValueError("result config_hash does not match its config")
    entry = {"entry_schema": ENTRY_SCHEMA, "status": "ok", "error": None, "harness": _harness(result["env"]),
             "execution": _execution(), "suite": suite, "created_at": _now()}
    entry.update({k: v for k, v in result.items() if k not in entry})
    return _seal(entry)


def failed_entry(cfg: dict, error: str, *, env: dict, wall_seconds: float, suite: str | None = None) -> dict:
    """A ``failed`` entry: what was run, where, and the one-line error."""
    return _seal({
        "entry_schema": ENTRY_SCHEMA,
        "status": "failed",
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
    missing = [k for k in COMMON_KEYS if k not in entry]
    if entry.get("status") == "ok":
        missing += [k for k in RESULT_KEYS if k not in entry]
    if missing:
        raise UserError(f"missing field(s) {', '.join(missing)}", where=where, fix=rerun)
    if entry["status"] not in STATUSES:
        raise UserError(f"unknown status {entry['status']!r}", where=f"{where}: status", fix=rerun)
    if content_hash(entry) != entry["content_hash"]:
        raise UserError("content hash mismatch: the entry was modified after it was written", where=where, fix=rerun)
    if not isinstance(entry["config"], dict) or config_hash(entry["config"]) != entry["config_hash"]:
        raise UserError("config does not match its config_hash", where=where, fix=rerun)
    return entry


def read_entry(path: str | Path) -> dict:
    """Read and verify one entry file; its name must be its config hash."""
    path = Path(path)
    try:
        entry = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}", where=str(path),
                        fix="delete it and rerun 'clbench leaderboard run' to regenerate it") from None
    except UnicodeDecodeError:
        raise UserError("not a UTF-8 text file", where=str(path), fix="keep only entry files in the entries folder") \
            from None
    except OSError as err:
        raise UserError(f"cannot read: {err.strerror}", where=str(path), fix="check the file's permissions") from None
    entry = verify_entry(entry, str(path))
    if path.stem != entry["config_hash"]:
        raise UserError(f"file name does not match its config_hash {entry['config_hash'][:12]}...", where=str(path),
                        fix=f"rename it to {entry['config_hash']}.json or delete it")
    return entry


def load_entries(root: str | Path, hashes: Iterable[str] | None = None) -> list[dict]:
    """Every entry under ``root/entries`` (or only ``hashes``), verified, sorted by file name."""
    folder = entries_dir(root)
    if not Path(root).is_dir():
        raise UserError(f"leaderboard directory {root} does not exist", where=str(root),
                        fix="run 'clbench leaderboard run --output DIR' first, or give the right DIR")
    if not folder.is_dir():
        raise UserError(f"no {ENTRIES_DIR}/ folder in {root}", where=str(root),
                        fix="run 'clbench leaderboard run --output DIR' first, or give the right DIR")
    if hashes is None:
        paths = sorted(p for p in folder.glob("*.json") if not p.name.startswith("."))
    else:
        paths = [entry_path(root, h) for h in hashes if entry_path(root, h).exists()]
    return [read_entry(p) for p in paths]
