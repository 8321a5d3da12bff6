"""``leaderboard run --launcher slurm``: each missing grid point is one task of a SLURM job array.

Submission goes through submitit (``AutoExecutor(cluster="slurm")``; ``--launcher
submitit-local`` swaps in its local executor, to try the whole path on one machine). Each task
calls :class:`CellJob`, i.e. :func:`~clbench.leaderboard.cell.run_cell`: the serial run's own
steps under the cell's lock, so cluster jobs, serial runs and other launchers sharing the
directory never run a cell twice. ::

    DIR/slurm/                    submitit's folder: sbatch scripts, pickles, <job>_<task>_log.out/.err
    DIR/slurm/cells/<hash>.json   which job runs that cell ({job_id, cluster, seen, submitted_at})

Every launch first *collects*: a recorded job still queued or running is left alone (its cell is
not submitted again); one that ended is settled: its cell wrote its entry, or (timeout, node
failure, out of memory, cancelled) the launcher writes a ``failed`` entry saying how the job
ended. Then the cells still missing (and failed ones with ``--retry-failed``) are submitted. A
job that times out or is preempted is requeued by submitit (up to 3 times) and resumes its run
from the checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import submitit
from submitit.helpers import Checkpointable, DelayedSubmission

from clbench.errors import UserError
from clbench.leaderboard.cell import RUNS_DIR, SuiteOutcome, record_death, run_cell
from clbench.leaderboard.execute import plan_suite
from clbench.leaderboard.launch import COUNTED, CellStatus, last_line
from clbench.leaderboard.lock import LOCK_SUFFIX
from clbench.leaderboard.suite import RunSpec, Suite, preflight

LAUNCH_DIR = "slurm"
RECORDS_DIR = "cells"
CLUSTERS = {"slurm": "slurm", "submitit-local": "local"}
DEFAULT_TIMEOUT_MIN = 60
POLL_SECONDS = {"slurm": 15.0, "local": 0.5}
# sacct states of a job that may still run its cell (UNKNOWN: sacct does not list it yet)
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "COMPLETING",
          "CONFIGURING", "SIGNALING", "STAGE_OUT", "STOPPED", "READY", "PREEMPTED", "UNKNOWN"}


class CellJob(Checkpointable):
    """What a job runs: one grid point by hash. On timeout or preemption it is requeued and resumes."""

    def __call__(self, cwd: str, suite_path: str, output: str, digest: str, seen: str | None, force: bool) -> dict:
        os.chdir(cwd)
        return run_cell(suite_path, output, digest, seen=seen, force=force)

    def checkpoint(self, cwd, suite_path, output, digest, seen, force) -> DelayedSubmission:
        # the requeued task continues the run from its checkpoint, even under --force
        return DelayedSubmission(self, cwd, suite_path, output, digest, seen, False)


def cluster_options(suite: Suite, cli: dict) -> dict:
    """The suite's ``launcher.slurm`` with the command line's options laid over it."""
    options = dict(suite.launcher.get("slurm", {}))
    options["additional"] = {**options.get("additional", {}), **(cli.get("additional") or {})}
    options.update({k: v for k, v in cli.items() if v is not None and k != "additional"})
    return options


def make_executor(folder: str | Path, options: dict, *, cluster: str, suite: Suite) -> submitit.AutoExecutor:
    """The submitit executor for ``cluster`` ("slurm" or "local") with the suite's and the command line's options."""
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    except RuntimeError:  # submitit looks for srun
        raise UserError("no SLURM here (srun is not on PATH)", where="--launcher slurm",
                        fix="run it on a cluster login node, or use --launcher local") from None
    setup = list(options.get("setup") or [])
    if suite.threads:
        setup.insert(0, f"export OMP_NUM_THREADS={suite.threads}")
    params = {"name": f"clbench-{suite.name}", "timeout_min": options.get("timeout_min", DEFAULT_TIMEOUT_MIN),
              "cpus_per_task": options.get("cpus_per_task", suite.threads),
              "gpus_per_node": options.get("gpus_per_node") or None,
              "mem_gb": options.get("mem_gb"), "slurm_partition": options.get("partition"),
              "slurm_additional_parameters": options.get("additional") or None, "slurm_setup": setup or None,
              "slurm_array_parallelism": options.get("jobs")}
    try:
        executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    except (ValueError, NameError, AssertionError) as err:
        raise UserError(f"submitit refused the options: {str(err).splitlines()[0]}", where="--launcher slurm",
                        fix="check launcher.slurm in the suite and the --slurm-option values") from None
    return executor


def run_cluster(suite: Suite, output: str | Path, *, launcher: str = "slurm", options: dict | None = None,
                wait: bool = True, progress: bool = True, retry_failed: bool = False, force: bool = False,
                allow_dirty: bool = False, console=None) -> SuiteOutcome:
    """Collect finished jobs, submit the cells still missing, and (``wait``) follow them to the end."""
    from rich.console import Console

    return _Cluster(suite, Path(output), CLUSTERS[launcher], options or {}, console or Console()).run(
        wait=wait, progress=progress, retry_failed=retry_failed, force=force, allow_dirty=allow_dirty)


class _Cluster:
    def __init__(self, suite: Suite, output: Path, cluster: str, options: dict, console):
        self.suite, self.output, self.cluster, self.options, self.console = suite, output, cluster, options, console
        self.folder = output / LAUNCH_DIR
        self.records = self.folder / RECORDS_DIR
        self.env: dict | None = None
        self.outcome: SuiteOutcome | None = None
        self.executor: submitit.AutoExecutor | None = None

    def run(self, *, wait: bool, progress: bool, retry_failed: bool, force: bool, allow_dirty: bool = False) \
            -> SuiteOutcome:
        earlier = SuiteOutcome(total=len(self.suite.runs))
        active = self._collect(earlier) if self.records.is_dir() else {}

        def ready(todo: list[RunSpec]) -> None:  # before the manifest is written: a refusal leaves nothing
            if any(s.hash not in active for s in todo):
                preflight(self.suite, here=False)  # the jobs run on the cluster's nodes, not here
                self.executor = make_executor(self.folder, self.options, cluster=self.cluster, suite=self.suite)

        outcome, todo, seen = plan_suite(self.suite, self.output, retry_failed=retry_failed, force=force,
                                         allow_dirty=allow_dirty, console=self.console, ready=ready)
        settled, again = {h for name in COUNTED for h in getattr(earlier, name)}, {s.hash for s in todo}
        for name in COUNTED:  # jobs of an earlier launch that ended since (not those resubmitted now)
            getattr(outcome, name).extend(h for h in getattr(earlier, name) if h not in again)
        outcome.skipped = [h for h in outcome.skipped if h not in settled]
        self.outcome = outcome
        tracked = {s.hash: active[s.hash] for s in todo if s.hash in active}
        if tracked:
            self.console.print(f"{len(tracked)} cells are still queued or running in earlier jobs: not submitted "
                               "again")
        new = [s for s in todo if s.hash not in active]
        if new:
            tracked.update(self._submit(new, seen, force=force))
        if not tracked:
            return outcome
        if not wait:
            outcome.submitted.extend(tracked)
            self.console.print(f"not waiting: {len(tracked)} cells queued or running; rerun the same command to "
                               "collect them (it submits nothing twice)")
            return outcome
        self._wait(tracked, progress=progress)
        return outcome

    def _submit(self, specs: list[RunSpec], seen: dict[str, str], *, force: bool) -> dict:
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        executor = self.executor or make_executor(self.folder, self.options, cluster=self.cluster, suite=self.suite)
        n = len(specs)
        args = ([os.getcwd()] * n, [str(self.suite.path)] * n, [str(self.output)] * n, [s.hash for s in specs],
                [seen.get(s.hash) for s in specs], [force] * n)
        try:
            jobs = executor.map_array(CellJob(), *args)
        except (FailedJobError, FailedSubmissionError, OSError) as err:
            text = " ".join(str(err).split())[:300]
            raise UserError(f"submitting {n} jobs failed: {text}", where=f"--launcher {self.cluster}",
                            fix="check the partition and the other options against 'sinfo' and 'sbatch --help'") \
                from None
        self.records.mkdir(parents=True, exist_ok=True)
        from clbench.io import write_json

        tracked = {}
        for spec, job in zip(specs, jobs):
            record = {"job_id": job.job_id, "cluster": self.cluster, "seen": seen.get(spec.hash),
                      "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            write_json(self.records / f"{spec.hash}.json", record)
            tracked[spec.hash] = (spec, record, job)
        ids = [job.job_id for job in jobs]
        shown = ", ".join(ids) if len(ids) <= 6 else f"{ids[0]} … {ids[-1]}"
        self.console.print(f"submitted {n} cells as jobs {shown}; logs in {self.folder}", highlight=False)
        return tracked

    def _job(self, record: dict):
        cls = submitit.LocalJob if record.get("cluster") == "local" else submitit.SlurmJob
        return cls(folder=self.folder, job_id=str(record["job_id"]))

    def _collect(self, outcome: SuiteOutcome) -> dict:
        """Settle the recorded jobs that ended; return the ones still queued or running, by hash."""
        from rich.markup import escape

        specs = {s.hash: s for s in self.suite.runs}
        jobs = {}
        for path in sorted(self.records.glob("*.json")):
            if path.stem not in specs:
                continue  # a cell of another suite sharing the directory: its own launches settle it
            try:
                record = json.loads(path.read_text())
                jobs[path.stem] = (specs[path.stem], record, self._job(record))
            except (OSError, ValueError, KeyError):
                path.unlink(missing_ok=True)  # a record cut short: the entry (or its absence) decides
        self._refresh()
        active = {}
        for digest, item in jobs.items():
            settled = self._settle(*item)
            if settled is None:
                active[digest] = item
            else:
                getattr(outcome, settled[0]).append(digest)
                self.console.print(f"{escape(item[0].label())} · job {item[2].job_id}: {settled[1]}", highlight=False)
        return active

    def _refresh(self) -> None:
        """One sacct call for every SLURM job this process follows (none registered: no call)."""
        submitit.SlurmJob.watcher.update()

    def _state(self, spec: RunSpec, job) -> str:
        if isinstance(job, submitit.LocalJob):
            state = job.state
            if state.startswith("NO PROCESS"):  # started by an earlier launcher: its lock says if it still runs
                lock = self.output / RUNS_DIR / f"{spec.hash}{LOCK_SUFFIX}"
                return "RUNNING" if lock.exists() else "ENDED"
        else:
            state = submitit.SlurmJob.watcher.get_state(job.job_id, mode="cache")
        return (state.split() or ["UNKNOWN"])[0].upper()

    def _settle(self, spec: RunSpec, record: dict, job) -> tuple[str, str] | None:
        """(status, note) for a job that ended, its entry settled and its record removed; None while it runs."""
        if not job.paths.result_pickle.exists():
            state = self._state(spec, job)
            if state in ACTIVE and not (state == "UNKNOWN" and self._lost(record)):
                return None
            if not job.paths.result_pickle.exists():  # it may have finished between the two looks
                why = f"job {job.job_id} ended ({state}) without writing its entry"
                detail = last_line(job.paths.stderr)
                return self._died(spec, record, why + (f": {detail}" if detail else ""), job)
        try:
            summary = job.results()[0]
        except Exception as err:  # noqa: BLE001 - the job's own exception, pickled back by submitit
            return self._died(spec, record, f"job {job.job_id} failed: {_trace_line(err)}", job)
        self._forget(spec, job, keep_logs=summary["status"] == "failed")
        return summary["status"], summary["note"]

    def _lost(self, record: dict) -> bool:
        """A job sacct still does not know an hour after submission (accounting purged, or never there)."""
        try:
            submitted = time.mktime(time.strptime(record["submitted_at"][:19], "%Y-%m-%dT%H:%M:%S"))
        except (KeyError, ValueError):
            return True
        return time.time() - submitted > 3600

    def _died(self, spec: RunSpec, record: dict, why: str, job) -> tuple[str, str]:
        from rich.markup import escape

        from clbench.results.assemble import environment

        if self.env is None:
            self.env = environment()
        status = record_death(self.output, spec, self.suite.name, why, seen=record.get("seen"), env=self.env)
        self._forget(spec, job, keep_logs=True)
        return status, (f"[red]failed[/]: {escape(why)}" if status == "failed" else "its entry is there")

    def _forget(self, spec: RunSpec, job, *, keep_logs: bool) -> None:
        """Drop a settled job's record and pickles, and its logs unless its cell failed."""
        paths = job.paths
        for path in (paths.submitted_pickle, paths.result_pickle) + (() if keep_logs else (paths.stdout, paths.stderr)):
            path.unlink(missing_ok=True)
        (self.records / f"{spec.hash}.json").unlink(missing_ok=True)
        for folder in (self.records, self.folder):
            try:
                folder.rmdir()
            except OSError:  # not empty: other jobs' files, or logs kept for reading
                break

    def _wait(self, tracked: dict, *, progress: bool) -> None:
        status = CellStatus(self.console, len(tracked), progress=progress)
        finished, failed, last = 0, 0, None
        try:
            while tracked:
                if self.cluster == "slurm":
                    self._refresh()
                for digest in list(tracked):
                    spec, record, job = tracked[digest]
                    settled = self._settle(spec, record, job)
                    if settled is None:
                        continue
                    del tracked[digest]
                    getattr(self.outcome, settled[0]).append(digest)
                    finished += 1
                    failed += settled[0] == "failed"
                    status.cell(finished, self._running(tracked), failed, spec.label(), settled[1])
                running = self._running(tracked)
                status.show(finished, running, failed)
                if tracked and (running, len(tracked)) != last and status.bar is None:
                    self.console.print(f"{finished} done, {running} running, {len(tracked) - running} queued, "
                                       f"{failed} failed", highlight=False)
                last = (running, len(tracked))
                if tracked:
                    time.sleep(POLL_SECONDS[self.cluster])
        except KeyboardInterrupt:
            self.console.print(f"stopped waiting; {len(tracked)} cells are still queued or running in their jobs "
                               "(they go on); rerun the same command to collect them")
            raise
        finally:
            status.stop()

    def _running(self, tracked: dict) -> int:
        runs = self.output / RUNS_DIR
        return sum((runs / f"{h}{LOCK_SUFFIX}").exists() for h in tracked)


def _trace_line(err: BaseException) -> str:
    """The exception line of the traceback submitit pickled back (its message wraps it in dashes)."""
    parts = str(err).split("----------------------")
    trace = parts[1] if len(parts) > 2 else str(err)
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    return (lines[-1] if lines else type(err).__name__)[:300]
