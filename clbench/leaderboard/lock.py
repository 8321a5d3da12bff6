"""One lock per grid point, so that several ``leaderboard run`` processes can share one directory.

``DIR/runs/<hash>.lock`` exists while a process works on that grid point (runs it, resumes it,
or turns its finished result into the entry). A second process that finds it skips the point,
goes on with the rest of the grid, and comes back at the end to wait for it: by then the
entry is usually there, and it is counted as done by another process.

The lock is :class:`clbench.lease.Lease` (filelock's ``SoftFileLease``; that module says why
it is not ``FileLock``), the same lock that keeps two ``clbench run`` out of one folder.
"""

from __future__ import annotations

from pathlib import Path

from clbench.lease import Lease

LOCK_SUFFIX = ".lock"


class CellLock(Lease):
    """The lock of one grid point: :meth:`try_acquire` never waits; :meth:`release` when done."""

    def __init__(self, runs_dir: str | Path, digest: str):
        super().__init__(Path(runs_dir) / f"{digest}{LOCK_SUFFIX}")

    def release(self) -> None:
        """Let go of the lock, and remove ``runs/`` if nothing is left in it."""
        if not self.held:
            return
        super().release()
        try:
            self.path.parent.rmdir()
        except OSError:  # not empty (other runs, other locks) or already gone
            pass
