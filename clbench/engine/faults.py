"""Crash injection for the resume tests: ``CLBENCH_TEST_KILL_AT`` SIGKILLs a run at a chosen point.

A resumed run is only trustworthy if every place a real crash can land has been tried, so the
tests kill real ``clbench run`` processes at these points (``K`` is the 0-based position of the
experience in run order)::

    stage:K:step:N        just before training batch N of experience K (N counts from 0
                          across all of that experience's epochs)
    stage:K:eval          during the first evaluation batch after experience K's training began
    stage:K:checkpoint    halfway through writing the checkpoint after experience K: a
                          half-written temporary file is left next to the previous checkpoint
    result                halfway through writing result.json

``CLBENCH_TEST_KILL_SIGNAL=INT`` sends SIGINT (Ctrl-C) at the point instead of SIGKILL, so the
interrupt tests stop a run at a known place rather than racing a timer.

The variable is read once, when a run starts. Unset (always, outside tests), no callback is
added and nothing here runs on any path.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from clbench.errors import UserError

ENV = "CLBENCH_TEST_KILL_AT"
SIGNAL_ENV = "CLBENCH_TEST_KILL_SIGNAL"


@dataclass(frozen=True)
class KillPoint:
    where: str           # "step", "eval", "checkpoint" or "result"
    stage: int = -1
    step: int = -1


def kill_point() -> KillPoint | None:
    """The kill point the environment asks for, or None."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    parts = text.split(":")
    try:
        if parts == ["result"]:
            return KillPoint("result")
        if len(parts) == 4 and parts[0] == "stage" and parts[2] == "step":
            return KillPoint("step", int(parts[1]), int(parts[3]))
        if len(parts) == 3 and parts[0] == "stage" and parts[2] in ("eval", "checkpoint"):
            return KillPoint(parts[2], int(parts[1]))
    except ValueError:
        pass
    raise UserError(f"unrecognised kill point '{text}'", where=ENV,
                    fix="use stage:K:step:N, stage:K:eval, stage:K:checkpoint or result, or unset it")


def die() -> None:
    """SIGKILL this process: no cleanup, no ``finally`` blocks, as with an OOM kill or preemption.
    (SIGINT instead when ``CLBENCH_TEST_KILL_SIGNAL=INT``: the handler runs on return.)"""
    sys.stdout.flush()
    sys.stderr.flush()
    chosen = os.environ.get(SIGNAL_ENV, "KILL").strip().upper()
    os.kill(os.getpid(), signal.SIGINT if chosen == "INT" else signal.SIGKILL)


def interrupted_write(path: Path, write: Callable[[Any], None]) -> None:
    """Begin the atomic write of ``path`` the way :mod:`clbench.io` does, and die halfway."""
    from clbench.io import atomic_write

    buffer = io.BytesIO()
    write(buffer)
    data = buffer.getvalue()

    def half(handle) -> None:
        handle.write(data[: len(data) // 2])
        handle.flush()
        os.fsync(handle.fileno())
        die()

    atomic_write(path, half, "wb")


def callback(point: KillPoint):
    """A Lightning callback that dies at a ``step`` or ``eval`` kill point (None for others)."""
    if point.where not in ("step", "eval"):
        return None
    import lightning.pytorch as pl

    class KillAt(pl.Callback):
        def __init__(self) -> None:
            self.steps = 0
            self.training = False

        def on_train_start(self, trainer, pl_module) -> None:
            self.training = pl_module.experience == point.stage

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if point.where == "step" and self.training:
                if self.steps == point.step:
                    die()
                self.steps += 1

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
            if point.where == "eval" and self.training:
                die()

    return KillAt()
