"""What one evaluation pass returns.

An evaluation pass is Lightning validation over the test columns. Its figures come back as an
:class:`Evaluation`: the columns' metrics (R's cells among them), the per-class recalls where a
metric keeps them, and the routing recorded on the way (:class:`clbench.metrics.routing_recording.RoutingRecording`).
:class:`EvaluationLog`, a callback every Trainer of a run has (:func:`clbench.engine.trainer.make_trainer`),
collects one per pass, so the runner reads return values rather than attributes the module
left behind; passes run inside ``fit`` (``train.eval_every_epoch``) are collected the same way.
:mod:`clbench.engine.stage` runs the passes and reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.callbacks import Callback

from clbench.engine.state import ColumnValues


@dataclass
class Evaluation:
    """One pass over the test columns.

    ``values``: what each evaluated set measured (:class:`ColumnValues`).
    ``recalls``: per column, each class's recall where a metric keeps them (G-mean), else None.
    ``routing``: per MoE layer, the pass's utilization figures ({} without routing layers).
    ``compositions``: per MoE layer, N_eff over the old domains' units ({} when none).
    ``routing_metrics``: each declared routing metric's value ({} without routing layers).
    """

    values: ColumnValues
    recalls: list[list[float | None] | None] = field(default_factory=list)
    routing: dict[str, dict[str, Any]] = field(default_factory=dict)
    compositions: dict[str, dict[str, float]] = field(default_factory=dict)
    routing_metrics: dict[str, float | None] = field(default_factory=dict)


class EvaluationLog(Callback):
    """Collects an :class:`Evaluation` at the end of every validation pass (on every process)."""

    def __init__(self) -> None:
        self.records: list[Evaluation] = []

    def on_validation_epoch_end(self, trainer, module) -> None:
        from clbench.metrics.routing_recording import RoutingRecording

        values, recalls = module.compute_columns()
        recording = next((c for c in trainer.callbacks if isinstance(c, RoutingRecording)), None)
        routing, compositions, routing_metrics = recording.take_evaluation() if recording is not None else ({}, {}, {})
        self.records.append(Evaluation(values, recalls, routing, compositions, routing_metrics))

    def take(self) -> list[Evaluation]:
        """The passes collected since the last call, oldest first."""
        records, self.records = self.records, []
        return records


def evaluation_log(trainer) -> EvaluationLog:
    """The trainer's :class:`EvaluationLog` (every Trainer :func:`make_trainer` builds has one)."""
    for callback in trainer.callbacks:
        if isinstance(callback, EvaluationLog):
            return callback
    raise RuntimeError("this Trainer has no EvaluationLog: build it with clbench.engine.trainer.make_trainer")
