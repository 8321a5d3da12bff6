"""A run's routing records: the Lightning callback that drives :class:`~clbench.metrics.routing.RoutingRecorder`
through every evaluation pass and every experience's training (a module of its own so that the
recorder stays importable without Lightning)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from clbench.metrics.routing import RoutingRecorder
from clbench.models.protocol import has_routing_layers


def _figures(recorder: RoutingRecorder) -> dict[str, dict[str, Any]]:
    """The recorder's figures as plain lists (for result.json), then cleared."""
    figures = {layer: {k: v.tolist() for k, v in values.items()} for layer, values in recorder.compute().items()}
    recorder.reset()
    return figures


class RoutingRecording(Callback):
    """Records a run's routing: per test column's domain in every evaluation, and per
    experience in training.

    ``column_domains[j]``: test column j's domain (None: not recorded); ``num_domains``: how many
    domain ids records may name. Recorders are created when routing layers first appear
    (possibly injected by a strategy after the run was built) and attach new layers at every
    fit and evaluation. The run calls :meth:`begin_stage` before each stage and reads the
    figures after each pass (:meth:`take_evaluation`, :meth:`take_training`). ``metrics``: the
    routing metrics the run's plugins declare (:func:`clbench.metrics.declare_routing`),
    computed from every evaluation pass's figures.
    A padding batch (:class:`clbench.data.datasets.Padding`) routes as usual and its records
    are dropped.
    """

    def __init__(self, column_domains: list[int | None], num_domains: int, metrics: dict | None = None):
        self.column_domains = column_domains
        self.num_domains = num_domains
        self.metrics = dict(metrics or {})  # declared routing metrics (clbench.metrics.declare_routing), by name
        self.evaluation: RoutingRecorder | None = None
        self.training: RoutingRecorder | None = None
        self.training_domain: int | None = None
        self.old_domains: set[int] = set()
        self._open: contextlib.ExitStack | None = None

    def begin_stage(self, training_domain: int | None, old_domains: set[int]) -> None:
        """A stage starts: ``training_domain`` is the domain of the experience it trains (None:
        joint training, not recorded), ``old_domains`` those of the experiences before it, whose
        test units N_eff is measured over."""
        self.training_domain = training_domain
        self.old_domains = set(old_domains)

    def _attach(self, model: nn.Module, device: torch.device) -> None:
        if not has_routing_layers(model):
            return
        if self.evaluation is None and any(d is not None for d in self.column_domains):
            self.evaluation = RoutingRecorder(num_domains=self.num_domains, compositions=True)
        if self.training is None:
            self.training = RoutingRecorder(num_domains=self.num_domains)
        for recorder in (self.evaluation, self.training):
            if recorder is not None:
                recorder.attach(model).to(device)

    def _enter(self, recorder: RoutingRecorder | None, domain: int | None, discard: bool = False) -> None:
        if recorder is None or domain is None:
            return
        from clbench.models.routing_channel import discarded

        self._open = contextlib.ExitStack()
        self._open.enter_context(recorder.domain(domain))
        if discard:
            self._open.enter_context(discarded())

    def _leave(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None

    # Lightning hooks -------------------------------------------------------------------------
    def on_train_start(self, trainer, module) -> None:
        self._attach(module.model, module.device)

    def on_validation_epoch_start(self, trainer, module) -> None:
        self._attach(module.model, module.device)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self._enter(self.training, self.training_domain)

    def on_before_backward(self, trainer, module, loss) -> None:
        self._leave()  # the forward is recorded; a backward that recomputes it (checkpointing) is not

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self._leave()

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0) -> None:
        from clbench.data.datasets import Padding

        domain = self.column_domains[dataloader_idx] if self.column_domains else None
        self._enter(self.evaluation, domain, discard=isinstance(batch, Padding))

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._leave()

    def on_exception(self, trainer, module, exception) -> None:
        self._leave()

    # figures ---------------------------------------------------------------------------------
    def take_evaluation(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float]], dict[str, float | None]]:
        """The pass just finished: (per-layer utilization figures, per-layer N_eff over the old
        domains' units, each declared routing metric's value); cleared for the next pass. Every
        process calls it (figures are synced). All empty when nothing was recorded."""
        if self.evaluation is None:
            return {}, {}, {}
        from clbench.metrics.declared import RoutingPass

        compositions = self.evaluation.compositions(sorted(self.old_domains)) if self.old_domains else {}
        figures = _figures(self.evaluation)
        routing = RoutingPass(utilization=figures, compositions=compositions, domains=tuple(self.column_domains))
        values = {}
        for name, spec in self.metrics.items():
            value = spec.compute(routing)
            values[name] = None if value is None else float(value)
        return figures, compositions, values

    def take_training(self) -> dict[str, dict[str, Any]]:
        """The routing of the training since the last call (per layer), cleared."""
        return {} if self.training is None else _figures(self.training)
