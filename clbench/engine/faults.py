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

The injection is a Lightning callback, :class:`KillAt`: the Trainer's hooks reach the points
inside training and evaluation. The two writes happen outside the Trainer, so the runner calls
:func:`before_checkpoint_write` and :func:`before_result_write` there, which look for that
callback on the Trainer and return at once when it is absent. The variable is read once, when
a run builds its Trainer (:func:`callbacks`); unset (always, outside tests), no callback is
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

import lightning.pytorch as pl

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


class KillAt(pl.Callback):
    """Dies at ``point``: at a training step or evaluation batch through the Trainer's hooks,
    halfway through a checkpoint or result write when the runner announces one."""

    def __init__(self, point: KillPoint) -> None:
        self.point = point
        self.steps = 0
        self.training = False

    def on_train_start(self, trainer, pl_module) -> None:
        self.training = pl_module.experience == self.point.stage

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.point.where == "step" and self.training:
            if self.steps == self.point.step:
                die()
            self.steps += 1

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.point.where == "eval" and self.training:
            die()


def callbacks() -> list:
    """The Trainer callbacks the environment asks for: ``[KillAt]`` under ``CLBENCH_TEST_KILL_AT``,
    else none."""
    point = kill_point()
    return [] if point is None else [KillAt(point)]


def _kill_at(trainer) -> KillPoint | None:
    found = [c.point for c in trainer.callbacks if isinstance(c, KillAt)]
    return found[0] if found else None


def before_checkpoint_write(trainer, stage: int, path: Path, write: Callable[[Any], None]) -> None:
    """The checkpoint after experience ``stage`` is about to be written to ``path`` by ``write``
    (given a binary handle): die halfway through it if that is the kill point."""
    point = _kill_at(trainer)
    if point is not None and point.where == "checkpoint" and point.stage == stage:
        interrupted_write(path, write)


def before_result_write(trainer, path: Path, write: Callable[[Any], None]) -> None:
    """``result.json`` is about to be written: die halfway through it if that is the kill point."""
    point = _kill_at(trainer)
    if point is not None and point.where == "result":
        interrupted_write(path, write)
