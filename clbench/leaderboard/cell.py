"""One grid point of a suite: recover, resume or run it, and write its entry.

The steps of one point, under its lock (held by the caller, or taken by :func:`run_cell`):

* its working folder ``DIR/runs/<hash>/`` holds a finished ``result.json`` for the same hash
  (the process stopped between the runner's write and the entry's): turn it into the entry
  without rerunning;
* it holds a checkpoint: continue the run from it (``resume=True``); a checkpoint the runner
  cannot resume from (an older schema, unreadable) is discarded and the run starts over;
* it holds anything else: stale, removed, the run starts over; otherwise: run it.

A run that raises is recorded as a ``failed`` entry with its one-line error; a full or
read-only disk stops the grid instead. :func:`run_cell` is a launcher's whole cell (one
process or cluster job per point), :func:`rerun` is what ``leaderboard verify`` reruns, and
:func:`record_death` writes the failed entry of a point whose process died before it could.
The loop over a whole suite is :mod:`clbench.leaderboard.execute`.
"""

from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from clbench.errors import Unwritable, UserError, unwritable
from clbench.leaderboard.entries import entry_from_result, entry_path, failed_entry, read_entry, write_entry
from clbench.leaderboard.lock import CellLock
from clbench.leaderboard.suite import RunSpec, Suite
from clbench.metrics.score_registry import result_percent
from clbench.results.record import Status

RUNS_DIR = "runs"
POLL_SECONDS = 1.0  # how often a process waiting for another's grid points looks again


@dataclass
class SuiteOutcome:
    """What a call to :func:`run_suite` did, by config hash."""

    total: int
    skipped: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)  # finished by another process meanwhile
    submitted: list[str] = field(default_factory=list)  # cluster jobs still queued or running on return


def _one_line_error(err: BaseException) -> str:
    if isinstance(err, UserError):
        return err.one_line()
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


def _recover(workdir: Path, spec: RunSpec) -> dict | None:
    """The finished result left in ``workdir`` for this very config, if there is one."""
    from clbench.received import read_json

    path = workdir / "result.json"
    if not path.is_file():
        return None
    try:
        result = read_json(path, fix="")  # a pipe or a device in its place is not read
    except UserError:
        return None
    if not isinstance(result, dict) or result.get("status") != Status.OK or result.get("config_hash") != spec.hash:
        return None
    return result


def _finish_workdir(workdir: Path) -> None:
    """Drop what the entry now holds; keep TensorBoard logs if there are any."""
    (workdir / "result.json").unlink(missing_ok=True)
    try:
        if workdir.is_dir() and not any(workdir.iterdir()):
            workdir.rmdir()
    except OSError:  # another process may be creating or removing files here
        pass


def _run_or_resume(spec: RunSpec, workdir: Path, source: str, fresh: bool) -> tuple[dict, bool]:
    """Run (or resume, unless ``fresh``) one grid point in ``workdir``; returns (result, resumed)."""
    from clbench.engine.runner import CHECKPOINT, run

    if not fresh and (workdir / CHECKPOINT).is_file():
        try:
            return run(spec.config, workdir, source=source, resume=True, progress=False), True
        except UserError as err:
            # An unusable checkpoint (damaged, or made under another thread count or kernel level) is started over.
            if err.where not in ("--resume", "--threads", "--cpu-kernels"):  # a real failure of the run
                raise
    if workdir.exists():
        shutil.rmtree(workdir)
    return run(spec.config, workdir, source=source, progress=False), False


def point_threads(suite: Suite, spec: RunSpec) -> int:
    """The torch threads a grid point runs with: the suite's ``threads``, else the rule ``clbench
    run`` and ``clbench.run`` use by default (:func:`clbench.limits.decide_threads`), so a suite's
    entry and a single run of its config give the same R."""
    from clbench.limits import decide_threads

    return decide_threads(suite.threads, spec.config["trainer"], where=f"{suite.path}: threads")


def run_point(spec: RunSpec, suite: Suite, output: Path, *, force: bool, env: dict, outcome: SuiteOutcome,
              console, threads: int | None = None) -> str:
    """Recover, resume or run one grid point (its lock held by the caller), write its entry; returns a note.

    Under ``threads`` torch threads (default: :func:`point_threads`), the suite's CPU kernel level
    (:func:`pin_kernels`) and its precision where the config sets none; the entry records all three."""
    from clbench.engine.precision import pinned
    from clbench.limits import torch_threads

    pin_kernels(suite.cpu_kernels, str(suite.path))
    with torch_threads(threads or point_threads(suite, spec)), pinned(suite.precision):
        return _run_point(spec, suite, output, force=force, env=env, outcome=outcome, console=console)


def pin_kernels(level: str, where: str) -> bool:
    """Compute at the suite's CPU kernel level (:mod:`clbench.cpu_kernels`), if this process
    still can: the ``clbench`` command and worker processes pin before torch is imported, so their
    entries hold the suite's level; a process that used torch before (a notebook) keeps its own,
    which its entries record truthfully. Whether the level holds; a level this CPU lacks is refused."""
    from clbench import cpu_kernels

    return cpu_kernels.pin_level(cpu_kernels.check_level(level, where=f"{where}: cpu_kernels"))


def _run_point(spec: RunSpec, suite: Suite, output: Path, *, force: bool, env: dict, outcome: SuiteOutcome,
               console) -> str:
    from rich.markup import escape

    workdir = output / RUNS_DIR / spec.hash
    start = time.perf_counter()
    recovered = None if force else _recover(workdir, spec)
    if recovered is not None:
        entry = entry_from_result(recovered, suite=suite.name)
        outcome.recovered.append(spec.hash)
        note = "recovered from its finished working folder"
    else:
        try:
            result, resumed = _run_or_resume(spec, workdir, str(suite.path), fresh=force)
        except Unwritable:  # a full or read-only disk stops the grid; the cell's checkpoint stays for a rerun
            raise
        except Exception as err:  # noqa: BLE001 - one broken run must not stop the grid
            if unwritable(err) is not None:
                raise unwritable(err) from None
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
            percent = result_percent(entry)
            note = ((f"acc {100 * acc:.1f}%" if percent else f"acc {acc:.3g}") if isinstance(acc, (int, float))
                    else "done") + \
                f" in {time.perf_counter() - start:.1f}s" + (" (resumed)" if resumed else "")
    write_entry(output, entry)
    _finish_workdir(workdir)
    return note


def _changed(output: Path, digest: str, seen: str | None) -> dict | None:
    """The entry another process wrote since ``seen`` (its content hash then, None: no entry), if any."""
    path = entry_path(output, digest)
    if not path.exists():
        return None
    entry = read_entry(path)
    return entry if entry["content_hash"] != seen else None


def run_cell(suite_path: str | Path, output: str | Path, digest: str, *, seen: str | None = None,
             force: bool = False, console=None) -> dict:
    """Run the grid point ``digest`` of the suite at ``suite_path`` into ``output``, as ``run_suite`` would.

    Waits for the point's lock (another process may hold it), then skips the point if its entry
    changed since ``seen``; otherwise recovers, resumes or runs it and writes its entry. Returns
    ``{"hash", "status", "note"}``, status one of ran, resumed, recovered, failed, elsewhere.
    """
    from rich.console import Console

    from clbench.leaderboard.suite import load_suite
    from clbench.results.assemble import environment

    suite, output = load_suite(suite_path), Path(output)
    pin_kernels(suite.cpu_kernels, str(suite_path))  # before anything computes (the worker's first step)
    console = console or Console()
    spec = next((r for r in suite.runs if r.hash == digest), None)
    if spec is None:
        raise UserError(f"the suite has no grid point {digest[:12]}…", where=str(suite_path),
                        fix="the suite was edited after the launch: run 'clbench leaderboard run' again")
    outcome = SuiteOutcome(total=1)
    lock = CellLock(output / RUNS_DIR, digest)
    while not lock.try_acquire():  # another process works on it: wait, then see whether it finished
        time.sleep(POLL_SECONDS)
    try:
        if _changed(output, digest, seen) is not None:
            outcome.elsewhere.append(digest)
            note = "finished by another process"
        else:
            note = run_point(spec, suite, output, force=force, env=environment(), outcome=outcome,
                             console=console)
    finally:
        lock.release()
    status = next(name for name in ("ran", "resumed", "recovered", "failed", "elsewhere") if getattr(outcome, name))
    return {"hash": digest, "status": status, "note": note}


def rerun(entry: dict, scratch: Path, *, source: str) -> dict:
    """Run a recorded entry's config again into the folder ``scratch``, as its grid point runs; the new entry.

    The same steps as a suite's cell (:func:`run_point`: runner, entry, a failure recorded as a
    failed entry) under the entry's own torch thread count; what ``clbench leaderboard verify``
    compares with the committed entry (an entry that records none: the suite's rule, auto), and in
    the precision it records (one made before precision was recorded: fp32, the default then).
    Nothing outside ``scratch`` is written.
    """
    from rich.console import Console

    from clbench.results.assemble import environment

    config = entry["config"]
    spec = RunSpec(index=0, config=config, hash=entry["config_hash"], benchmark=entry["benchmark"]["name"],
                   model=entry["model"]["name"], strategy=entry["strategy"]["name"], order=entry["order_label"],
                   seed=entry["seed"])
    recorded = (entry.get("env") or {}).get("precision") or "32-true"  # entries before it was recorded: fp32
    # the caller arranged the kernel level (clbench.leaderboard.rerun): the suite's pin is not applied again
    suite = Suite(name=entry.get("suite"), description="", path=Path(source), runs=[spec], cpu_kernels="native",
                  precision=recorded)
    threads = (entry.get("execution") or {}).get("torch_threads")  # as recorded, if this machine has the CPUs
    if threads is not None:
        from clbench.limits import check_threads

        check_threads(threads, where=f"{source}: execution.torch_threads", field="execution.torch_threads")
    run_point(spec, suite, Path(scratch), force=True, env=environment(), outcome=SuiteOutcome(total=1),
              console=Console(stderr=True), threads=threads)
    return read_entry(entry_path(scratch, spec.hash))


def record_death(output: Path, spec: RunSpec, suite_name: str, why: str, *, seen: str | None, env: dict,
                 wall_seconds: float = 0.0) -> str:
    """After the process running ``spec`` died: a failed entry saying ``why``, unless an entry came meanwhile.

    Returns the status to count: ``failed``, or ``ran`` / ``failed`` / ``elsewhere`` for an entry
    the dead process (or another one) wrote. The working folder stays, so ``--retry-failed``
    resumes from its checkpoint.
    """
    entry = _changed(output, spec.hash, seen)
    if entry is not None:
        return "ran" if entry["status"] == Status.OK else "failed"
    lock = CellLock(output / RUNS_DIR, spec.hash)
    # Taken when it can be (the dead process's marker is stale at once on this host), so two
    # launchers on one host do not both write; a marker from another host stays until its lease
    # runs out, and the entry is written without it: a live holder's own entry would replace it.
    held = lock.try_acquire() or lock.try_acquire()
    try:
        if _changed(output, spec.hash, seen) is not None:
            return "elsewhere"
        write_entry(output, failed_entry(spec.config, why, env=env, wall_seconds=wall_seconds, suite=suite_name))
    finally:
        if held:
            lock.release()
    return "failed"
