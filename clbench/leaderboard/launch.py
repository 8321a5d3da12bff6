"""``leaderboard run --launcher local --jobs N``: N grid points at once, each in a worker process.

Each grid point still to do runs in ``python -m clbench.leaderboard.worker`` (a fresh process:
a segfault, an out-of-memory kill or a wedged GPU ends that cell only), which goes through the
serial run's own steps (:func:`~clbench.leaderboard.cell.run_cell`: the cell's lock, recover,
resume or run, the entry). So a serial run, another launcher or a cluster job sharing the
directory never runs a cell twice. A worker that dies without writing its entry gets a
``failed`` entry saying how it died (its working folder stays: ``--retry-failed`` resumes it
from its checkpoint); its output is kept in ``DIR/logs/<hash>.log``.

Workers get ``OMP_NUM_THREADS`` and torch's thread count from the grid point's threads (the
suite's ``threads``, else ``clbench run``'s ``auto``: :func:`~clbench.leaderboard.cell.point_threads`), and with
GPUs present one GPU each (``CUDA_VISIBLE_DEVICES``, round-robin over the visible ones).
Ctrl-C (or SIGTERM) stops the launcher: running cells are interrupted the same way (their
checkpoints stay) and rerunning continues.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from clbench.leaderboard.cell import RUNS_DIR, SuiteOutcome, point_threads, record_death
from clbench.leaderboard.execute import plan_suite
from clbench.leaderboard.lock import LOCK_SUFFIX
from clbench.leaderboard.suite import RunSpec, Suite, preflight

LOGS_DIR = "logs"
POLL_SECONDS = 0.2
STOP_SECONDS = 60.0  # how long interrupted workers get to stop before they are killed
COUNTED = ("ran", "resumed", "recovered", "failed", "elsewhere")


def default_jobs(suite: Suite) -> int:
    """One worker per GPU when there are GPUs, else as many as the usable CPUs hold at the runs'
    threads (:func:`~clbench.leaderboard.cell.point_threads`; ``base.trainer`` is every point's)."""
    from clbench.limits import usable_cpus

    gpus = _gpu_ids()
    if gpus:
        return len(gpus)
    return max(1, usable_cpus() // point_threads(suite, suite.runs[0]))


def _gpu_ids() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return [v.strip() for v in visible.split(",") if v.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def died(returncode: int) -> str:
    """How a worker process ended, in words."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}" + (" (out of memory?)" if -returncode == signal.SIGKILL else "")
    return f"exited with status {returncode}"


def last_line(path: Path, limit: int = 300) -> str:
    """The last non-empty line of a log, for a failed entry's one-line reason."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


class CellStatus:
    """Cells done / running / failed: a transient bar on a terminal, and one line per finished cell."""

    def __init__(self, console, total: int, *, progress: bool):
        self.console, self.total = console, total
        self.bar = self.task = None
        if progress and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("", total=total)

    def show(self, finished: int, running: int, failed: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=finished,
                            description=f"{running} running · {failed} failed")

    def cell(self, finished: int, running: int, failed: int, label: str, note: str) -> None:
        from rich.markup import escape

        self.show(finished, running, failed)
        self.console.print(f"{finished} of {self.total} done ({running} running, {failed} failed): "
                           f"{escape(label)} · {note}", highlight=False)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@dataclass
class _Worker:
    spec: RunSpec
    proc: subprocess.Popen
    slot: int
    report: Path
    log: Path
    start: float = field(default_factory=time.perf_counter)


def run_local(suite: Suite, output: str | Path, *, jobs: int, progress: bool = True, retry_failed: bool = False,
              force: bool = False, allow_dirty: bool = False, console=None) -> SuiteOutcome:
    """Run every grid point of ``suite`` missing from ``output``, ``jobs`` worker processes at a time."""
    from rich.console import Console

    console = console or Console()
    output = Path(output)
    outcome, todo, seen = plan_suite(suite, output, retry_failed=retry_failed, force=force, allow_dirty=allow_dirty,
                                     console=console, ready=lambda todo: preflight(suite) if todo else None)
    if todo:
        _Local(suite, output, outcome, console, jobs=jobs, force=force, seen=seen).run(todo, progress=progress)
    return outcome


class _Local:
    """The pool: start workers while slots are free, read their reports, record the dead."""

    def __init__(self, suite: Suite, output: Path, outcome: SuiteOutcome, console, *, jobs: int, force: bool,
                 seen: dict[str, str]):
        self.suite, self.output, self.outcome, self.console = suite, output, outcome, console
        self.jobs, self.force, self.seen = jobs, force, seen
        self.running: list[_Worker] = []
        self.gpus = _gpu_ids()

    def run(self, todo: list[RunSpec], *, progress: bool) -> None:
        from clbench.results.assemble import environment

        self.env = environment()
        runs = self.output / RUNS_DIR
        queue = sorted(todo, key=lambda s: (runs / f"{s.hash}{LOCK_SUFFIX}").exists())  # busy elsewhere: last
        self.status = CellStatus(self.console, len(todo), progress=progress)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
        reports = Path(tempfile.mkdtemp(prefix="clbench-cells."))
        try:
            while queue or self.running:
                while queue and len(self.running) < self.jobs:
                    self._start(queue.pop(0), reports)
                for worker in [w for w in self.running if w.proc.poll() is not None]:
                    self.running.remove(worker)
                    self._finish(worker)
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            self._stop()
            done = sum(len(getattr(self.outcome, name)) for name in COUNTED)
            self.console.print(f"interrupted after {done} of {len(todo)} runs; finished entries are kept; "
                               "rerun the same command to continue")
            raise
        except BaseException:  # e.g. an entry refused on reading: leave no worker running unattended
            self._stop()
            raise
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            self.status.stop()
            for path in reports.iterdir():
                path.unlink()
            reports.rmdir()

    def _start(self, spec: RunSpec, reports: Path) -> None:
        slot = min(set(range(self.jobs)) - {w.slot for w in self.running})
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(point_threads(self.suite, spec))
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot % len(self.gpus)]
        report = reports / f"{spec.hash}.json"
        command = [sys.executable, "-m", "clbench.leaderboard.worker", "--suite", str(self.suite.path),
                   "--output", str(self.output), "--hash", spec.hash, "--report", str(report),
                   "--parent", str(os.getpid())]
        if spec.hash in self.seen:
            command += ["--seen", self.seen[spec.hash]]
        if self.force:
            command.append("--force")
        log = self.output / LOGS_DIR / f"{spec.hash}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:  # its own session: Ctrl-C reaches the launcher, which stops each worker once
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        self.running.append(_Worker(spec, proc, slot, report, log))
        self._show()

    def _finish(self, worker: _Worker) -> None:
        from rich.markup import escape

        from clbench.limits import torch_threads

        spec, log = worker.spec, worker.log
        try:
            summary = json.loads(worker.report.read_text())
            status, note = summary["status"], summary["note"]
        except (OSError, ValueError, KeyError):  # no report: the worker died (or its input was refused)
            why = f"worker process {died(worker.proc.returncode)}"
            detail = last_line(log)
            if detail:
                why += f": {detail}"
            with torch_threads(point_threads(self.suite, spec)):  # its failed entry records the point's threads
                status = record_death(self.output, spec, self.suite.name, why, seen=self.seen.get(spec.hash),
                                      env=self.env, wall_seconds=time.perf_counter() - worker.start)
            note = f"[red]failed[/]: {escape(why)}" if status == "failed" else "finished by another process"
        getattr(self.outcome, status).append(spec.hash)
        if status == "failed":
            note += f" (log: {escape(str(log))})"
        else:
            log.unlink(missing_ok=True)
            try:
                log.parent.rmdir()
            except OSError:  # other logs are still there
                pass
        finished = sum(len(getattr(self.outcome, name)) for name in COUNTED)
        self.status.cell(finished, len(self.running), len(self.outcome.failed), spec.label(), note)

    def _show(self) -> None:
        finished = sum(len(getattr(self.outcome, name)) for name in COUNTED)
        self.status.show(finished, len(self.running), len(self.outcome.failed))

    def _stop(self) -> None:
        """Interrupt every running worker once, give them time to stop, then kill what is left."""
        for worker in self.running:
            if worker.proc.poll() is None:
                _signal_group(worker.proc, signal.SIGINT)
        deadline = time.monotonic() + STOP_SECONDS
        for worker in self.running:
            try:
                worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(worker.proc, signal.SIGKILL)
                worker.proc.wait()
            worker.log.unlink(missing_ok=True)  # not a failure: the rerun writes a new one
        self.running.clear()


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Signal a worker's process group (its session: the worker and every process it started)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass
