"""This machine's CPUs and what a setting may ask of them: processes and torch threads.

A config or a suite may be written on a cluster node and run on a laptop; the settings that
start processes or threads (``train.num_workers``, a suite's ``threads``, ``--threads``) are
checked where they take effect, against the CPUs this process may use: torch threads at most
one per CPU (beyond, they only wait for each other), data-loader workers at most a few per CPU
(:func:`most_workers`; beyond, a loader forks until the machine is unusable: 100000 workers).

One rule decides a run's torch threads, whoever starts it (:func:`decide_threads`): ``clbench
run --threads``, ``clbench.run(threads=...)`` and a suite's ``threads`` all take a number or
``auto`` (the default, :func:`auto_threads`), so one config gives the same CPU result however it
is run (the order of floating-point reductions depends on the thread count). CPUs are counted
here only (:func:`usable_cpus`), and torch's setting is changed only through
:func:`torch_threads`, which restores it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

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


#: Below this many cores, one torch thread: on a small CPU that also does other work, extra
#: intra-op threads spin waiting for a core (a digits run was up to 30x slower with two).
FEW_CORES = 4
AUTO = "auto"


def usable_cores() -> int:
    """Cores this process may use: :func:`usable_cpus`, and no more than the physical cores where
    psutil tells them from hyper-threads (two threads on one core's hyper-threads only contend)."""
    cores = usable_cpus()
    try:
        import psutil  # optional

        physical = psutil.cpu_count(logical=False)
    except ImportError:
        physical = None
    return max(1, min(cores, physical) if physical else cores)


def local_processes(trainer: dict | None) -> int:
    """Processes a run starts on this machine (one per device under data parallelism)."""
    devices = (trainer or {}).get("devices")
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    return 1


def auto_threads(trainer: dict | None, cores: int | None = None) -> int:
    """1 on fewer than :data:`FEW_CORES` cores, else the cores shared among the local processes."""
    cores = usable_cores() if cores is None else cores
    if cores < FEW_CORES:
        return 1
    return max(1, cores // local_processes(trainer))


def decide_threads(request: int | str | None, trainer: dict | None, *, where: str, field: str = "threads") -> int:
    """The torch threads a run uses: ``request`` if it is a number (checked by :func:`check_threads`,
    the error naming ``where``), else (``"auto"`` or ``None``, unset) :func:`auto_threads` of the
    config's ``trainer`` section."""
    if request is None or request == AUTO:
        return auto_threads(trainer)
    return check_threads(request, where=where, field=field)


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Torch's intra-op threads set to ``count`` in the block (``None``: left as they are), and
    put back after it: a suite's or a library call's setting does not outlive it."""
    import torch

    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
