"""Run a suite into a leaderboard directory: what is missing, nothing twice, safe to interrupt.

::

    DIR/suite.json               which hashes the suite is made of (its manifest)
    DIR/entries/<hash>.json      one finished run each (ok or failed), written atomically
    DIR/runs/<hash>/             a run's working folder while it runs (checkpoint, TensorBoard)

For every grid point, in order:

* its entry exists (and verifies): skip it; ``retry_failed`` reruns ``failed`` ones;
* its working folder holds a finished ``result.json`` for the same hash (the process stopped
  between the runner's write and the entry's): turn it into the entry without rerunning;
* its working folder holds a checkpoint: continue the run from it (``resume=True``), so an
  interrupted suite loses at most the experience in progress; a checkpoint the runner cannot
  resume from (an older schema, unreadable) is discarded and the run starts over;
* its working folder holds anything else: stale, removed, the run starts over;
* otherwise: run it.

``force`` skips the first three steps: every grid point runs again from scratch.

All runs share one process, so torch and Lightning are imported once. A run that raises is
recorded as a ``failed`` entry with its one-line error and the suite goes on; Ctrl-C stops
the suite and keeps every entry written so far. A failed run's working folder is removed, so
``--retry-failed`` starts it over. After an entry is written the working
folder's ``result.json`` is removed (the entry holds everything in it), so deleting an entry
reruns that run; TensorBoard logs, when the suite enables them, stay in the folder.
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from clbench.errors import UserError
from clbench.leaderboard.entries import entry_from_result, entry_path, failed_entry, read_entry, write_entry
from clbench.leaderboard.suite import RunSpec, Suite

RUNS_DIR = "runs"
MANIFEST = "suite.json"


@dataclass
class SuiteOutcome:
    """What a call to :func:`run_suite` did, by config hash."""

    total: int
    skipped: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def read_manifest(root: str | Path) -> dict | None:
    """``DIR/suite.json`` if it is there and readable (it only orders and annotates the output)."""
    path = Path(root) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not (isinstance(data, dict) and isinstance(data.get("runs"), list) and isinstance(data.get("name"), str)):
        return None
    return data


def manifest_hashes(root: str | Path) -> list[str] | None:
    manifest = read_manifest(root)
    return [r.get("hash") for r in manifest["runs"] if isinstance(r, dict)] if manifest else None


def _one_line_error(err: BaseException) -> str:
    if isinstance(err, UserError):
        return err.one_line()
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


def _recover(workdir: Path, spec: RunSpec) -> dict | None:
    """The finished result left in ``workdir`` for this very config, if there is one."""
    path = workdir / "result.json"
    if not path.is_file():
        return None
    try:
        result = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None
    if not isinstance(result, dict) or result.get("status") != "ok" or result.get("config_hash") != spec.hash:
        return None
    return result


def _finish_workdir(workdir: Path) -> None:
    """Drop what the entry now holds; keep TensorBoard logs if there are any."""
    (workdir / "result.json").unlink(missing_ok=True)
    if workdir.is_dir() and not any(workdir.iterdir()):
        workdir.rmdir()
        parent = workdir.parent
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


def _execute(spec: RunSpec, workdir: Path, source: str, fresh: bool) -> tuple[dict, bool]:
    """Run (or resume, unless ``fresh``) one grid point in ``workdir``; returns (result, resumed)."""
    from clbench.runner import CHECKPOINT, run

    if not fresh and (workdir / CHECKPOINT).is_file():
        try:
            return run(spec.config, workdir, source=source, resume=True, progress=False), True
        except UserError as err:
            if err.where != "--resume":  # a real failure of the run, not an unusable checkpoint
                raise
    if workdir.exists():
        shutil.rmtree(workdir)
    return run(spec.config, workdir, source=source, progress=False), False


def run_suite(suite: Suite, output: str | Path, *, progress: bool = True, retry_failed: bool = False,
              force: bool = False, console=None) -> SuiteOutcome:
    """Run every grid point of ``suite`` that has no entry in ``output``; see the module notes.

    ``force`` reruns every grid point from scratch (after a code change: an entry's name says
    which config it ran, not which code); each entry is replaced only when its new run ends.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from clbench.io import write_json
    from clbench.leaderboard.suite import preflight
    from clbench.runner import environment, prepare_output

    console = console or Console()
    output = Path(output)
    prepare_output(output, resume=False, overwrite=True)  # a directory we can write to
    outcome = SuiteOutcome(total=len(suite.runs))
    todo: list[RunSpec] = []
    for spec in suite.runs:
        path = entry_path(output, spec.hash)
        if path.exists() and not force:
            entry = read_entry(path)  # refuses tampered or newer entries, with the fix
            if not (retry_failed and entry["status"] == "failed"):
                outcome.skipped.append(spec.hash)
                continue
        todo.append(spec)
    write_json(output / MANIFEST, suite.manifest())
    console.print(f"suite [bold]{suite.name}[/]: {len(suite.runs)} runs, {len(outcome.skipped)} already done, "
                  f"{len(todo)} to run → {output}")
    if not todo:
        return outcome
    preflight(suite)
    import torch

    env = environment()
    source = str(suite.path)
    bar = None
    if progress and console.is_terminal:
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console, transient=True)
        bar.start()
        task = bar.add_task("", total=len(todo))
    threads_before = torch.get_num_threads()
    if suite.threads:
        torch.set_num_threads(suite.threads)
    try:
        for k, spec in enumerate(todo, 1):
            head = f"run {k} of {len(todo)}"
            if bar is not None:
                bar.update(task, description=f"{head}: {escape(spec.label())}")
            workdir = output / RUNS_DIR / spec.hash
            start = time.perf_counter()
            recovered = None if force else _recover(workdir, spec)
            if recovered is not None:
                entry = entry_from_result(recovered, suite=suite.name)
                outcome.recovered.append(spec.hash)
                note = "recovered from its finished working folder"
            else:
                try:
                    result, resumed = _execute(spec, workdir, source, fresh=force)
                except Exception as err:  # noqa: BLE001 - one broken run must not stop the grid
                    message = _one_line_error(err)
                    entry = failed_entry(spec.config, message, env=env, wall_seconds=time.perf_counter() - start,
                                         suite=suite.name)
                    outcome.failed.append(spec.hash)
                    if not isinstance(err, UserError):
                        console.print(traceback.format_exc(), markup=False, highlight=False, style="dim")
                    shutil.rmtree(workdir, ignore_errors=True)  # a retry starts over
                    note = f"[red]failed[/]: {escape(message)}"
                else:
                    entry = entry_from_result(result, suite=suite.name)
                    (outcome.resumed if resumed else outcome.ran).append(spec.hash)
                    acc = entry["scores"].get("acc")
                    note = (f"acc {100 * acc:.1f}%" if isinstance(acc, (int, float)) else "done") + \
                        f" in {time.perf_counter() - start:.1f}s" + (" (resumed)" if resumed else "")
            write_entry(output, entry)
            _finish_workdir(workdir)
            console.print(f"{head}: {escape(spec.label())} · {note}", highlight=False)
            if bar is not None:
                bar.advance(task)
    except KeyboardInterrupt:
        done = len(outcome.ran) + len(outcome.resumed) + len(outcome.recovered) + len(outcome.failed)
        again = ("rerun without --force to keep every entry now on disk (older ones included), or with it to "
                 "start over") if force else "rerun the same command to continue"
        console.print(f"interrupted after {done} of {len(todo)} runs; finished entries are kept; {again}")
        raise
    finally:
        torch.set_num_threads(threads_before)
        if bar is not None:
            bar.stop()
    return outcome
