"""One grid point in a process of its own: what ``leaderboard run --launcher local`` starts per cell.

::

    python -m clbench.leaderboard.worker --suite S --output DIR --hash H [--seen C] [--force] --report FILE
                                         [--parent PID]

It calls :func:`~clbench.leaderboard.cell.run_cell` (the serial run's own steps: lock,
recover, resume or run, entry) and writes what happened as JSON to ``--report``. A process of
its own per cell means a segfault, an out-of-memory kill or a hung CUDA context ends that cell
only; the launcher sees no report and records the death (exit 0: handled, 2: bad input,
130: interrupted).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

PARENT_POLL_SECONDS = 1.0


def _interrupt(signum, frame):  # SIGTERM stops a cell the way Ctrl-C does: checkpoint kept, lock released
    raise KeyboardInterrupt


def watch_parent(interval: float = PARENT_POLL_SECONDS, parent: int | None = None) -> threading.Thread:
    """Interrupt this process (as Ctrl-C does) once the launcher that started it is gone.

    The launcher stops its workers on Ctrl-C and SIGTERM, but a launcher killed with SIGKILL
    (the OOM killer, ``kill -9``) runs nothing: its workers, in sessions of their own, would go
    on unattended. When the parent dies the worker is re-parented, so a changed parent pid is
    the sign; checked once a second by a daemon thread, portable where ``PR_SET_PDEATHSIG`` is not.
    ``parent``: the launcher's pid as it passed it, so a launcher killed while this process was
    still starting is noticed too (the current parent's pid otherwise).
    """
    parent = os.getppid() if parent is None else parent
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        # A launcher started with SIGINT ignored (``nohup ... &``) passes that on to its workers,
        # and an ignored SIGINT would stop neither this watch nor the launcher's own Ctrl-C.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, name="clbench-parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clbench.leaderboard.worker")
    parser.add_argument("--suite", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--hash", required=True)
    parser.add_argument("--seen", default=None, help="content hash of the entry the launcher saw")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--report", required=True)
    parser.add_argument("--parent", type=int, default=None, help="the launcher's pid (default: the parent's)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)

    from clbench.errors import exit_status
    from clbench.io import write_json
    from clbench.quiet import route_dependency_warnings

    route_dependency_warnings()

    def cell() -> int:
        watch_parent(parent=args.parent)  # inside: a launcher already gone interrupts at once
        from clbench.leaderboard.cell import run_cell

        write_json(args.report, run_cell(args.suite, args.output, args.hash, seen=args.seen, force=args.force))
        return 0

    return exit_status(cell, "clbench: interrupted (the cell's checkpoint is kept)")


if __name__ == "__main__":
    sys.exit(main())
