"""The output directory of a run: what may be written where, and when a run replaces another.

A finished run (``result.json``) is never clobbered without ``--overwrite``, an unfinished one
(``checkpoint.pt``) is continued with ``--resume`` or replaced with ``--overwrite``. With
``--overwrite`` the new run writes into a staging folder beside the old files
(``<output>/.staging``) and the two are swapped only once the new run has succeeded: a new run
that fails leaves the previous result, checkpoint and logs as they were; one that is killed
can be continued there with ``--resume``. A run that fails leaves no empty output directory
behind.

One run at a time per folder: while a run works in ``<output>`` it holds the lease
``<output>/.clbench-run.lock`` (:class:`clbench.lease.Lease`, the lock of a leaderboard's grid
points). A second ``clbench run`` into the same folder is refused at once (exit 2, naming the
holder) and changes nothing; a killed run's lock is taken over by the next run (its pid is
gone). Only the launching process locks: the extra processes of a multi-process run (other
ranks) find their rank in the environment and share the folder with it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from clbench.errors import UserError

RESULT = "result.json"
CHECKPOINT = "checkpoint.pt"
TENSORBOARD = "tensorboard"
LOGS = "logs"  # where loggers other than TensorBoard wrote before each had its own folder
CSV, MLRUNS, WANDB = "csv", "mlruns", "wandb"  # the short-named loggers' folders (clbench.engine.loggers)
PREDICTIONS = "predictions"
MODEL = "model"  # the trained weights others load (clbench.engine.saved)
STAGING = ".staging"
RUN_LOCK = ".clbench-run.lock"
# Set to a rank by torchrun (RANK), srun (SLURM_PROCID) and Lightning's own launcher (LOCAL_RANK, NODE_RANK).
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK")
_REPLACED = ".replaced"
# What a run owns in its directory (anything else there is the user's and left alone).
RUN_FILES = (RESULT, CHECKPOINT, TENSORBOARD, CSV, MLRUNS, WANDB, LOGS, PREDICTIONS, MODEL)


def launched_as_rank_zero() -> bool:
    """Whether this process is a run's first (or only) process, from what launchers set."""
    return all(os.environ.get(key, "0") == "0" for key in RANK_VARIABLES)


def check_output(output: Path | None, *, resume: bool, overwrite: bool) -> None:
    """Refuse a clobber or an impossible resume. Creates and deletes nothing."""
    if output is None:
        if resume:
            raise UserError("nothing to resume without an output directory", where="--resume",
                            fix="give the interrupted run's --output")
        return
    if resume and overwrite:
        raise UserError("--resume continues the run in --output, --overwrite starts it again", where="--resume",
                        fix="pass one of them, not both")
    if output.exists() and not output.is_dir():
        raise UserError(f"output path {output} is a file", where="--output", fix="give a directory path")
    if not resume and not overwrite:
        if (output / RESULT).exists():
            raise UserError(f"{output} already holds a finished run ({RESULT})", where="--output",
                            fix="choose another --output, or pass --overwrite to replace it")
        if (output / CHECKPOINT).exists():
            raise UserError(f"{output} holds an unfinished run ({CHECKPOINT})", where="--output",
                            fix="pass --resume to continue it, or --overwrite to start again")
    if resume and not (output / CHECKPOINT).exists() and not (output / STAGING / CHECKPOINT).exists():
        if (output / RESULT).exists():
            raise UserError(f"the run in {output} is already complete", where="--resume",
                            fix=f"read {output / RESULT}; nothing to resume")
        raise UserError(f"no checkpoint to resume in {output}", where="--resume",
                        fix="run without --resume to start it, or point --output at the interrupted run")


def remove_leftovers(path: Path, *, resuming: bool) -> None:
    """Remove what a crashed earlier attempt left in the run folder ``path`` (never before the
    new run is built): half-written files always; without a resume, its logs."""
    from clbench.io import remove_stale_temporaries

    for name in (CHECKPOINT, RESULT):
        remove_stale_temporaries(path, name)
    if not resuming:
        tensorboard = path / TENSORBOARD
        for stale in (*tensorboard.glob("events.out.tfevents.*"), tensorboard / "hparams.yaml"):
            stale.unlink(missing_ok=True)
        (path / CSV / "metrics.csv").unlink(missing_ok=True)  # other loggers keep runs apart
        shutil.rmtree(path / MODEL, ignore_errors=True)  # weights of the crashed attempt's experiences


class OutputDir:
    """Where one run writes: ``output`` itself, or its staging folder under ``--overwrite``.

    ``open()`` takes the folder's lock and creates what is needed, ``commit()`` makes a staged
    run the directory's run, ``abandon()`` (on failure) removes what this run created and
    nothing else; both let go of the lock.
    """

    def __init__(self, output: Path, *, resume: bool, overwrite: bool):
        self.output = output
        self.resume, self.overwrite = resume, overwrite
        self.created = not output.exists()
        self.lock = None
        self.staged = self.fresh_staging = False
        self.path = output

    def _plan(self) -> None:
        """Where to write, decided once the folder is ours (a run that just ended changed it)."""
        output = self.output
        replacing = self.overwrite and any((output / name).exists() for name in RUN_FILES)
        # An interrupted replacement resumes in its staging folder, the old run still in place.
        continuing = (self.resume and (output / STAGING / CHECKPOINT).exists()
                      and not (output / CHECKPOINT).exists())
        self.staged = replacing or continuing
        self.fresh_staging = replacing
        self.path = output / STAGING if self.staged else output

    def _lock(self) -> None:
        """Hold the folder's lock (launching process only), or refuse: it is another run's."""
        from clbench.lease import Lease

        if not launched_as_rank_zero():
            return
        lock = Lease(self.output / RUN_LOCK)
        if not lock.try_acquire():
            holder = lock.holder()
            self._remove_if_empty()
            raise UserError(f"{self.output} is in use by another clbench run ({holder})", where="--output",
                            fix="wait for that run to finish, or choose another --output")
        self.lock = lock
        try:
            check_output(self.output, resume=self.resume, overwrite=self.overwrite)  # it may have just finished
        except UserError:
            self._unlock()
            raise

    def open(self) -> Path:
        try:
            self.output.mkdir(parents=True, exist_ok=True)
            self._lock()
            self._plan()
            if self.staged and (self.path.is_file() or self.path.is_symlink()):
                self._unlock()
                raise UserError(f"{self.path} is a file, where clbench keeps a replacing run until it succeeds",
                                where="--output", fix="move or delete that file, then run again")
            if self.fresh_staging:
                shutil.rmtree(self.path, ignore_errors=True)  # left by an earlier replacement that died
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".clbench-write-test-{os.getpid()}"  # one per process: DDP ranks open at once
            probe.write_text("")
            probe.unlink(missing_ok=True)
        except OSError as err:
            self.abandon()
            raise UserError(f"cannot write to {self.output}: {err.strerror}", where="--output",
                            fix="choose a writable directory") from None
        return self.path

    def commit(self) -> None:
        """Swap a staged run in: the old run's files move aside, the new ones in, the old go."""
        try:
            if self.staged:
                aside = self.output / _REPLACED
                shutil.rmtree(aside, ignore_errors=True)
                aside.mkdir()
                for name in RUN_FILES:
                    if (self.output / name).exists():
                        (self.output / name).rename(aside / name)
                for name in RUN_FILES:
                    if (self.path / name).exists():
                        (self.path / name).rename(self.output / name)
                shutil.rmtree(self.path, ignore_errors=True)
                shutil.rmtree(aside, ignore_errors=True)
        finally:
            self._unlock()

    def close(self) -> None:
        """A process that does not commit (another rank) is done with the folder."""
        self._unlock()

    def abandon(self) -> None:
        """After a failure: drop a staged run; remove the directory if this run created it and
        it holds nothing worth keeping (an interrupted run's checkpoint is kept)."""
        try:
            if self.staged:
                if not (self.path / CHECKPOINT).exists():
                    shutil.rmtree(self.path, ignore_errors=True)
                return
            if self.created and self.output.is_dir() and not (self.output / CHECKPOINT).exists():
                leftovers = [p for p in self.output.rglob("*") if p.is_file() and p.name != RUN_LOCK]
                if all(p.relative_to(self.output).parts[0] in (TENSORBOARD, CSV, MLRUNS, WANDB, LOGS)
                       for p in leftovers):  # only logs
                    for child in self.output.iterdir():
                        if child.name != RUN_LOCK:
                            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
                    self._unlock()
                    self._remove_if_empty()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _remove_if_empty(self) -> None:
        if self.created:
            try:
                self.output.rmdir()
            except OSError:  # not empty (another run's lock or files), or already gone
                pass
