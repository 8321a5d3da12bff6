"""Rich progress for a continual run: experience k of T, epoch, loss.

Lightning's own bars know nothing of experiences, so this small callback owns the display. It
redraws at most ten times a second and reads the loss only when it redraws (and at the end of
an epoch), so it adds no device synchronisation to ordinary steps. Until an experience's first
step has a loss, none is shown: not NaN, and not the previous experience's.
"""

from __future__ import annotations

import time

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
