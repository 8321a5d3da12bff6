"""Rich progress for a continual run: experience k of T, epoch, loss; plain lines when the
output is not a terminal (:class:`LineProgress`).

Lightning's own bars know nothing of experiences, so this small callback owns the display. It
redraws at most ten times a second and reads the loss only when it redraws (and at the end of
an epoch), so it adds no device synchronisation to ordinary steps. Until an experience's first
step has a loss, none is shown: not NaN, and not the previous experience's.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ContinualProgress(pl.Callback):
    def __init__(self, num_stages: int, console: Console | None = None, refresh_s: float = 0.1):
        self.console = console or Console(stderr=True)
        self.num_stages = num_stages
        self.refresh_s = refresh_s
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=False)
        self.task = None
        self.stage_label = ""
        self.epochs_per_stage = 1
        self.first_epoch = 0
        self._last = float("-inf")
        self._loss: float | None = None
        self._latest = None  # the last step's loss, read (synchronised) only when shown

    def start_stage(self, position: int, name: str, epochs: int, first_epoch: int) -> None:
        self.stage_label = f"exp {position + 1}/{self.num_stages} {name}"
        self.epochs_per_stage = epochs
        self.first_epoch = first_epoch
        self._loss = self._latest = None
        self._last = float("-inf")  # the stage's first step redraws at once

    def _describe(self, trainer: pl.Trainer) -> str:
        epoch = trainer.current_epoch - self.first_epoch + 1
        loss = "—" if self._loss is None else f"{self._loss:.4f}"
        return f"{self.stage_label} · epoch {epoch}/{self.epochs_per_stage} · loss {loss}"

    def _read_loss(self) -> None:
        if self._latest is not None:
            self._loss = float(self._latest)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("", total=None)
        total = trainer.num_training_batches
        self.progress.reset(self.task, total=total if total != float("inf") else None,
                            description=self._describe(trainer))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.task is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._latest = loss.detach() if hasattr(loss, "detach") else loss  # no graph kept alive
        now = time.monotonic()
        if now - self._last < self.refresh_s:
            return
        self._last = now
        self._read_loss()
        self.progress.update(self.task, completed=batch_idx + 1, description=self._describe(trainer))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.task is not None:
            self._read_loss()
            self.progress.update(self.task, completed=trainer.num_training_batches, description=self._describe(trainer))

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()
            self.task = None


def _clock(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "—"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class LineProgress(pl.Callback):
    """Progress as plain lines, for output that is not a terminal (a file, a pipe, a batch job's
    log), where a live bar draws nothing until it ends: a line when a stage or an evaluation
    starts, at every ``percent`` of its batches, and, from a background thread, at least every
    ``every_s`` seconds while one runs (a batch of LLM generation can take minutes), each with the
    elapsed time and an estimate of what is left. ``every_s`` defaults to
    ``CLBENCH_PROGRESS_EVERY_S`` or 60."""

    def __init__(self, num_stages: int, console: Console | None = None, every_s: float | None = None,
                 percent: int = 10):
        import os
        import threading

        self.console = console or Console(stderr=True, soft_wrap=True)
        self.num_stages = num_stages
        self.every_s = float(os.environ.get("CLBENCH_PROGRESS_EVERY_S", 60)) if every_s is None else every_s
        self.percent = percent
        self.stage_label = ""
        self.epochs_per_stage = 1
        self.first_epoch = 0
        self._lock = threading.Lock()
        self._phase: str | None = None  # "train" or "eval" while one runs
        self._total = self._done = 0
        self._started = self._printed = 0.0
        self._next_percent = percent
        self._latest = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name="clbench-progress", daemon=True)

    def start_stage(self, position: int, name: str, epochs: int, first_epoch: int) -> None:
        self.stage_label = f"exp {position + 1}/{self.num_stages} {name}"
        self.epochs_per_stage, self.first_epoch = epochs, first_epoch
        self._latest = None
        self._print(f"{self.stage_label}: training, {epochs} epoch(s)")

    def _print(self, text: str) -> None:
        with self._lock:
            self._printed = time.monotonic()
            self.console.print(text, markup=False, highlight=False)

    def _begin(self, phase: str, total: Any) -> None:
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()
        with self._lock:
            self._phase = phase
            self._total = int(total) if total not in (None, float("inf")) else 0
            self._done = 0
            self._started = time.monotonic()
            self._next_percent = self.percent

    def _line(self, trainer: pl.Trainer | None = None) -> str:
        elapsed = time.monotonic() - self._started
        share = self._done / self._total if self._total else None
        eta = elapsed * (1 - share) / share if share else None
        if self._phase == "train":
            epoch = (trainer.current_epoch if trainer is not None else self._epoch) - self.first_epoch + 1
            loss = "" if self._latest is None else f" · loss {float(self._latest):.4f}"
            what = f"{self.stage_label} · epoch {epoch}/{self.epochs_per_stage} · train"
        else:
            loss, what = "", f"{self.stage_label or 'untrained'} · evaluating"
        of = f"{self._done}/{self._total} batches ({100 * share:.0f}%)" if self._total else f"{self._done} batches"
        return f"{what} {of}{loss} · elapsed {_clock(elapsed)} · eta {_clock(eta)}"

    def _advance(self, trainer: pl.Trainer) -> None:
        self._done += 1
        self._epoch = trainer.current_epoch
        if self._total and 100 * self._done >= self._next_percent * self._total:
            while self._next_percent * self._total <= 100 * self._done:
                self._next_percent += self.percent
            self._print(self._line(trainer))

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self.every_s / 4, 5.0)):
            if self._phase is not None and time.monotonic() - self._printed >= self.every_s:
                self._print(self._line())

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self._epoch = trainer.current_epoch
            self._begin("train", trainer.num_training_batches)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._phase != "train":
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._latest = loss.detach() if hasattr(loss, "detach") else loss
        self._advance(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._phase = None

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self._begin("eval", sum(trainer.num_val_batches))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self._phase == "eval":
            self._advance(trainer)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self._phase == "eval":
            self._phase = None
            self._print(f"{self.stage_label or 'untrained'} · evaluated {self._done} batches in "
                        f"{_clock(time.monotonic() - self._started)}")

    def close(self) -> None:
        self._stop.set()
        self._phase = None
