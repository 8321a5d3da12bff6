"""Bounds on what a setting may ask of this machine: processes and threads.

A config or a suite may be written on a cluster node and run on a laptop; the settings that
start processes or threads (``train.num_workers``, a suite's ``threads``, ``--threads``) are
checked where they take effect, against the CPUs this process may use: torch threads at most
one per CPU (beyond, they only wait for each other), data-loader workers at most a few per CPU
(:func:`most_workers`; beyond, a loader forks until the machine is unusable: 100000 workers).
"""

from __future__ import annotations

import os

from clbench.errors import UserError


def usable_cpus() -> int:
    """Logical CPUs this process may run on (its affinity set where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_threads(value, *, where: str, field: str = "threads") -> int:
    """A torch thread count: an int from 1 to :func:`usable_cpus`, or a one-line :class:`UserError`."""
    cpus = usable_cpus()
    fix = f"set {field} to a whole number from 1 to {cpus}"
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"expected int, got {type(value).__name__} {value!r}", where=where, fix=fix)
    if value < 1:
        raise UserError(f"must be >= 1, got {value}", where=where, fix=fix)
    if value > cpus:
        raise UserError(f"{value} torch threads, but this process may use {cpus} CPUs", where=where, fix=fix)
    return value


#: Data-loader workers a process may start per CPU it may use (and at least :data:`MIN_WORKERS`):
#: workers mostly wait on reading and decoding, so a config written for a cluster node (8 workers)
#: still runs on a 2-core laptop, while 100000 would fork the machine to a halt.
WORKERS_PER_CPU, MIN_WORKERS = 4, 8


def most_workers() -> int:
    return max(MIN_WORKERS, WORKERS_PER_CPU * usable_cpus())


def check_workers(value: int, *, where: str) -> None:
    """``train.num_workers`` at most :func:`most_workers` (0: load in the main process)."""
    most = most_workers()
    if value > most:
        raise UserError(f"{value} data-loader worker processes, but this process may use {usable_cpus()} CPUs "
                        f"(at most {WORKERS_PER_CPU} workers each)", where=where,
                        fix=f"set train.num_workers between 0 and {most}")
