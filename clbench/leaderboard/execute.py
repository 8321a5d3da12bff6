"""Run a suite into a leaderboard directory: what is missing, nothing twice, safe to interrupt.

::

    DIR/suite.json               which hashes the suite is made of (its manifest)
    DIR/entries/<hash>.json      one finished run each (ok or failed), written atomically
    DIR/runs/<hash>/             a run's working folder while it runs (checkpoint, TensorBoard)

For every grid point, task order by task order (every method's run of one order before the
next order's, :func:`orders_first`, so a grid stopped halfway leaves whole pairs):

* its entry exists (and verifies): skip it; ``retry_failed`` reruns ``failed`` ones;
* its working folder holds a finished ``result.json`` for the same hash (the process stopped
  between the runner's write and the entry's): turn it into the entry without rerunning;
* its working folder holds a checkpoint: continue the run from it (``resume=True``), so an
  interrupted suite loses at most the experience in progress; a checkpoint the runner cannot
  resume from (an older schema, unreadable) is discarded and the run starts over;
* its working folder holds anything else: stale, removed, the run starts over;
* otherwise: run it.

``force`` skips the first three steps: every grid point runs again from scratch.

Several processes may run one suite into one directory at the same time (two terminals, or a
cluster launcher's jobs on a shared filesystem): a grid point is worked on only under its lock
(:mod:`~clbench.leaderboard.lock`, ``DIR/runs/<hash>.lock``). A point locked by another process
is passed over and waited for once the rest of the grid is done; if its entry is there by
then, it counts as done by another process, and if that process died, the point is taken
over (resumed from its checkpoint). An entry that changed since this process first looked
(with ``force`` or ``retry_failed`` too) was written by another process and is not redone.

The steps of one grid point (recover, resume or run, write the entry) are
:mod:`~clbench.leaderboard.cell`'s, which also runs one point by hash for the launchers that
give each grid point a process (or a cluster job) of its own (:mod:`~clbench.leaderboard.launch`,
:mod:`~clbench.leaderboard.slurm`).

All runs of ``run_suite`` share one process, so torch and Lightning are imported once. A run that raises is
recorded as a ``failed`` entry with its one-line error and the suite goes on; Ctrl-C stops
the suite and keeps every entry written so far. A failed run's working folder is removed, so
``--retry-failed`` starts it over. After an entry is written the working
folder's ``result.json`` is removed (the entry holds everything in it), so deleting an entry
reruns that run; TensorBoard logs, when the suite enables them, stay in the folder.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from clbench.errors import UserError
from clbench.leaderboard.cell import POLL_SECONDS, RUNS_DIR, SuiteOutcome, run_point
from clbench.leaderboard.entries import check_entry_names, entry_path, read_entry
from clbench.leaderboard.layout import check_layout
from clbench.leaderboard.lock import CellLock
from clbench.leaderboard.manifest import MANIFEST
from clbench.leaderboard.suite import RunSpec, Suite, preflight
from clbench.results.record import Status


def _check_writable(output: Path) -> None:
    """Create ``output`` if needed and make sure we can write there (a private probe file: no races)."""
    if output.exists() and not output.is_dir():
        raise UserError(f"output path {output} is a file", where="--output", fix="give a directory path")
    try:
        output.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".clbench-write-test.", dir=output)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UserError(f"cannot write to {output}: {err.strerror}", where="--output",
                        fix="choose a writable directory") from None


def _manifest_holds(output: Path, suite: Suite) -> bool:
    """Whether ``output``'s manifest already records this suite's grid (its ``source``, the path
    the suite was read from, may be written from another working directory)."""
    from clbench.leaderboard.manifest import read_manifest

    on_disk = read_manifest(output)
    ours = suite.manifest()
    return on_disk is not None and all(on_disk.get(key) == value for key, value in ours.items() if key != "source")


def _wanted(entry: dict, retry_failed: bool) -> bool:
    """Whether an existing entry still leaves its grid point to be run."""
    return retry_failed and entry["status"] == Status.FAILED


def plan_suite(suite: Suite, output: str | Path, *, retry_failed: bool = False, force: bool = False,
               allow_dirty: bool = False, console=None,
               ready=None) -> tuple[SuiteOutcome, list[RunSpec], dict[str, str]]:
    """Check ``output``, write the manifest and say what is left: (outcome so far, to do, entries seen).

    ``seen`` maps each grid point that has an entry to that entry's content hash as read now,
    so whoever runs the point later can tell an entry another process wrote meanwhile. With
    grid points to run, a folder of clbench's own repository is refused from a tree with
    uncommitted changes unless ``allow_dirty`` (:func:`check_clean`), and ``ready(todo)`` checks
    what running them needs (every cell's config, the cluster); nothing is written if either refuses.
    """
    from rich.console import Console

    from clbench.io import write_json

    console = console or Console()
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise UserError(f"output path {output} is a file", where="--output", fix="give a directory path")
    check_layout(output)  # README.md a folder, runs a file, ...: before anything is written
    check_entry_names(output)  # a stray or renamed file in entries/ is reported before anything runs
    outcome = SuiteOutcome(total=len(suite.runs))
    todo: list[RunSpec] = []
    seen: dict[str, str] = {}  # content hash of each entry as first read, to tell another process's writes
    for spec in orders_first(suite.runs):
        path = entry_path(output, spec.hash)
        if path.exists():
            entry = read_entry(path)  # refuses tampered or newer entries, with the fix
            seen[spec.hash] = entry["content_hash"]
            if not force and not _wanted(entry, retry_failed):
                outcome.skipped.append(spec.hash)
                continue
        todo.append(spec)
    if todo and not allow_dirty:
        check_clean(output)
    if ready is not None:
        ready(todo)
    if todo or not _manifest_holds(output, suite):  # a complete leaderboard on a read-only disk still shows its table
        _check_writable(output)
        write_json(output / MANIFEST, suite.manifest())
    console.print(f"suite [bold]{suite.name}[/]: {len(suite.runs)} runs, {len(outcome.skipped)} already done, "
                  f"{len(todo)} to run → {output}")
    return outcome, todo, seen


def orders_first(runs: list[RunSpec]) -> list[RunSpec]:
    """``runs`` regrouped so that every method's run of one task order and seed precedes the next order's.

    A suite expands method by method; run in that order, a grid stopped halfway (a time limit, the
    end of a sitting) leaves task orders that only one method has run, and a paired comparison can
    use none of them. Which grid point runs when changes no result.
    """
    group: dict[tuple[str, str, int], int] = {}
    for spec in runs:
        group.setdefault((spec.benchmark, spec.order, spec.seed), len(group))
    return sorted(runs, key=lambda spec: (group[(spec.benchmark, spec.order, spec.seed)], spec.index))


def check_clean(output: str | Path) -> None:
    """Refuse to write entries into a folder of clbench's own repository from uncommitted code.

    "Of clbench's own repository": ``output`` (or its nearest existing parent) is in the git work
    tree the running clbench package was imported from, where its entries could be committed
    beside code that never made them. "Uncommitted code": a tracked code file of that tree
    (:data:`clbench.results.provenance.CODE_PATHS`) changed, staged or not; the leaderboard's own files
    (entries, pages) are no code. Folders elsewhere (a scratch folder, a test's temporary folder,
    another repository) and clbench installed without git are not checked; their entries still
    record ``env.git_dirty``.
    """
    from clbench.results.provenance import code_repo, repo_of, uncommitted_files

    repo = code_repo()
    if repo is None or repo_of(output) != repo:
        return
    changed = uncommitted_files(repo)
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise UserError(f"{output} is in clbench's repository and the working tree has uncommitted changes to "
                        f"tracked code ({shown}): its entries could not be traced to the code that made them",
                        where="--output", fix="commit or stash the changes, or pass --allow-dirty to write entries "
                                              "marked as made from uncommitted code")


def run_suite(suite: Suite, output: str | Path, *, progress: bool = True, retry_failed: bool = False,
              force: bool = False, allow_dirty: bool = False, console=None) -> SuiteOutcome:
    """Run every grid point of ``suite`` that has no entry in ``output``; see the module notes.

    ``force`` reruns every grid point from scratch (after a code change: an entry's name says
    which config it ran, not which code); each entry is replaced only when its new run ends.
    """
    from rich.console import Console

    console = console or Console()
    output = Path(output)
    outcome, todo, seen = plan_suite(suite, output, retry_failed=retry_failed, force=force, allow_dirty=allow_dirty,
                                     console=console, ready=lambda todo: preflight(suite) if todo else None)
    if not todo:
        return outcome
    _Grid(suite, output, outcome, console, progress=progress, force=force, seen=seen).run(todo)
    return outcome


class _Grid:
    """The loop over the grid points still to do, each under its lock."""

    def __init__(self, suite: Suite, output: Path, outcome: SuiteOutcome, console, *, progress: bool, force: bool,
                 seen: dict[str, str]):
        self.suite, self.output, self.outcome, self.console = suite, output, outcome, console
        self.progress, self.force, self.seen = progress, force, seen
        self.k = 0
        self.total = 0
        self.bar = self.task = None

    def run(self, todo: list[RunSpec]) -> None:
        from rich.markup import escape
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from clbench.results.assemble import environment

        self.env = environment()
        self.total = len(todo)
        if self.progress and self.console.is_terminal:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("", total=len(todo))
        try:
            waiting: list[tuple[RunSpec, CellLock]] = []
            for spec in todo:
                lock = CellLock(self.output / RUNS_DIR, spec.hash)
                if lock.try_acquire():
                    self._cell(spec, lock)
                else:
                    waiting.append((spec, lock))
                    self.console.print(f"{escape(spec.label())} · in progress in {escape(lock.holder())}; "
                                       "coming back to it at the end", highlight=False)
            while waiting:  # grid points other processes are working on: wait for them, take over the dead
                for item in list(waiting):
                    if item[1].try_acquire():
                        waiting.remove(item)
                        self._cell(*item)
                if waiting:
                    time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            o = self.outcome
            done = len(o.ran) + len(o.resumed) + len(o.recovered) + len(o.failed)
            again = ("rerun without --force to keep every entry now on disk (older ones included), or with it to "
                     "start over") if self.force else "rerun the same command to continue"
            self.console.print(f"interrupted after {done} of {self.total} runs; finished entries are kept; {again}")
            raise
        finally:
            if self.bar is not None:
                self.bar.stop()

    def _done_elsewhere(self, spec: RunSpec) -> bool:
        """Whether another process wrote this grid point's entry since this one first looked."""
        path = entry_path(self.output, spec.hash)
        return path.exists() and read_entry(path)["content_hash"] != self.seen.get(spec.hash)

    def _cell(self, spec: RunSpec, lock: CellLock) -> None:
        """Run (resume, recover) one grid point; ``lock`` is held and released here."""
        from rich.markup import escape

        try:
            self.k += 1
            head = f"run {self.k} of {self.total}"
            if self.bar is not None:
                self.bar.update(self.task, description=f"{head}: {escape(spec.label())}")
            if self._done_elsewhere(spec):
                self.outcome.elsewhere.append(spec.hash)
                note = "finished by another process"
            else:
                note = self._execute(spec)
            self.console.print(f"{head}: {escape(spec.label())} · {note}", highlight=False)
            if self.bar is not None:
                self.bar.advance(self.task)
        finally:
            lock.release()

    def _execute(self, spec: RunSpec) -> str:
        return run_point(spec, self.suite, self.output, force=self.force, env=self.env, outcome=self.outcome,
                          console=self.console)
