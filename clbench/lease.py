"""A lock on a path that several processes (on one host or on many sharing a filesystem) respect.

Used for a run's output folder (:mod:`clbench.engine.outputs`: one ``clbench run`` at a time per
folder) and for a leaderboard's grid points (:mod:`clbench.leaderboard.lock`).

The lock is filelock's ``SoftFileLease`` (the ``filelock`` package, already installed with
torch), not its default ``FileLock``:

* ``FileLock`` is ``fcntl.flock`` on POSIX. On NFS that is emulated (or silently local to one
  client) depending on the server, the client and the mount options, so it cannot be trusted
  for the cluster launcher's shared filesystem.
* ``SoftFileLease`` is an *existence* lock: the marker is created with
  ``os.open(O_CREAT | O_EXCL)``, which NFSv3 and later perform atomically on the server. The
  marker records the holder's pid, host (with its pid namespace), process start time and a
  lease duration; a background thread refreshes its modification time every
  :data:`HEARTBEAT_SECONDS`.
* A stale marker is taken over: on the same host as soon as its pid is gone (a start-time
  check guards against a reused pid), on another host once the waiting process has seen it go
  unrefreshed for :data:`LEASE_SECONDS` on its own monotonic clock (so clocks that disagree
  between machines cannot expire a live lock). A process that is alive but stalled for longer
  than that loses the lease: the worst outcome for a grid point is the same point run twice,
  with the same config and seed, each run writing the same entry atomically.

Writing this by hand would repeat what filelock already gets right (replacing a stale marker
without a window where two contenders both win, markers half written by a crash, pid reuse,
containers sharing a host name).
"""

from __future__ import annotations

from pathlib import Path

from clbench.errors import UserError

# Every process that may contend for one lock must use the same lease duration.
LEASE_SECONDS = 300.0
HEARTBEAT_SECONDS = 30.0
_RETRIES = 5  # another process may remove an empty parent folder between our mkdir and our create


class Lease:
    """The lock whose marker is ``path``: :meth:`try_acquire` never waits; :meth:`release` when done."""

    def __init__(self, path: str | Path):
        from filelock import SoftFileLease

        self.path = Path(path)
        self._lock = SoftFileLease(str(self.path), lease_duration=LEASE_SECONDS,
                                   heartbeat_interval=HEARTBEAT_SECONDS)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def try_acquire(self) -> bool:
        """Take the lock if it is free (or stale); False while another live process holds it."""
        from filelock import LeaseSettingsMismatch, Timeout

        for attempt in range(_RETRIES):
            try:
                self._lock.acquire(blocking=False)
                return True
            except Timeout:
                return False
            except FileNotFoundError:
                if attempt == _RETRIES - 1:
                    raise
            except LeaseSettingsMismatch as err:
                raise UserError(f"another clbench version holds this lock with other settings: {err}",
                                where=str(self.path), fix="run every process of one directory with one clbench") \
                    from None
        return False  # pragma: no cover - the loop returns or raises

    def holder(self) -> str:
        """``pid 123 on host`` for messages; ``another process`` when the marker cannot be read."""
        owner = self._lock.owner
        if owner is None:
            return "another process"
        return f"pid {owner.pid} on {owner.hostname.split('?', 1)[0]}"

    def release(self) -> None:
        """Let go of the lock (its marker is removed); nothing when it is not held."""
        if self._lock.is_locked:
            self._lock.release()
