"""Rich progress for a continual run: experience k of T, epoch, loss.

Lightning's own bars know nothing of experiences, so this small callback owns the display. It
redraws at most ten times a second and reads the loss only when it redraws, so it adds no
device synchronisation to ordinary steps.
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
        self._last = 0.0
        self._loss = float("nan")

    def start_stage(self, position: int, name: str, epochs: int, first_epoch: int) -> None:
        self.stage_label = f"exp {position + 1}/{self.num_stages} {name}"
        self.epochs_per_stage = epochs
        self.first_epoch = first_epoch

    def _describe(self, trainer: pl.Trainer) -> str:
        epoch = trainer.current_epoch - self.first_epoch + 1
        return f"{self.stage_label} · epoch {epoch}/{self.epochs_per_stage} · loss {self._loss:.4f}"

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
        now = time.monotonic()
        if now - self._last < self.refresh_s:
            return
        self._last = now
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._loss = float(loss)
        self.progress.update(self.task, completed=batch_idx + 1, description=self._describe(trainer))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=trainer.num_training_batches, description=self._describe(trainer))

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()
            self.task = None
