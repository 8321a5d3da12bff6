"""The objective plugin API (see :mod:`clbench.objectives`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager

import torch
from torch import Tensor, nn

from clbench.models import routing_channel as routing

if TYPE_CHECKING:
    from torchmetrics import Metric

    from clbench.data.streams import Experience, StreamSpec
    from clbench.metrics.declared import MetricSpec


class Objective:
    """What is learned from a batch and how each test experience is scored.

    One step of training is ``inputs, targets = split(batch)`` (through the strategy's
    ``prepare_batch``), ``outputs = forward(model, inputs)``, ``loss(outputs, targets)``; the
    strategy sees the same ``inputs, targets, outputs``. Evaluation calls :meth:`evaluate` on
    every batch of a test experience with that column's metrics from :meth:`metrics`, whose
    first entry is the primary score: the R-matrix entry.

    Every score of an R matrix assumes one direction; ``higher_is_better`` gives it, and
    ``result.json``, CL scores and leaderboard tables follow it.
    """

    #: Arguments the harness passes to the model builder (:meth:`model_kwargs` gives values).
    model_args: ClassVar[tuple[str, ...]] = ()
    #: Direction of every primary metric of this objective.
    higher_is_better: ClassVar[bool] = True
    #: What this objective gives a strategy that declares :attr:`clbench.Strategy.requires`
    #: (keys of :data:`clbench.strategy.REQUIREMENTS`).
    provides: ClassVar[frozenset[str]] = frozenset()
    #: Metrics computed on every test column besides those of :meth:`metrics`, each declared with
    #: :func:`clbench.metrics.declared.declare` (its title, direction and unit); the same as
    #: :attr:`clbench.Strategy.extra_metrics`.
    extra_metrics: ClassVar[tuple["MetricSpec", ...]] = ()

    def setup(self, spec: "StreamSpec", experiences: list["Experience"]) -> None:
        """Once per run, before the model is built."""
        self.spec = spec
        self.experiences = experiences

    def model_kwargs(self, spec: "StreamSpec") -> dict[str, Any]:
        """Values of :attr:`model_args` for this stream."""
        return {}

    def collate(self, train: bool) -> Callable | None:
        """The ``collate_fn`` of training (``train``) or test loaders (None: PyTorch's default)."""
        return None

    def lengths(self, dataset: Any) -> list[int] | None:
        """Each training sample's length, what ``train.group_by_length`` groups batches by; None:
        this objective's samples have none (the setting is refused)."""
        return None

    def attach(self, model: nn.Module) -> None:
        """Once the model is built (and for every reference model): what the objective needs of
        it, such as a language model's tokenizer."""

    # -- training -------------------------------------------------------------------------
    def split(self, batch: Any) -> tuple[Any, Any]:
        """``(inputs, targets)`` of what the loader yields."""
        return batch[0], batch[1]

    def join(self, parts: list[tuple[Any, Any]]) -> tuple[Any, Any]:
        """One ``(inputs, targets)`` from several (a replay batch joined to the current one)."""
        return torch.cat([inputs for inputs, _ in parts]), torch.cat([targets for _, targets in parts])

    def forward(self, model: nn.Module, inputs: Any) -> Any:
        return model(inputs)

    def loss(self, outputs: Any, targets: Any) -> Tensor:
        """The task loss, averaged over the batch."""
        raise NotImplementedError

    def loss_of(self, model: nn.Module, inputs: Any, targets: Any) -> Tensor:
        """The task loss of ``model`` on a batch; what strategies call to recompute it
        (A-GEM's reference gradient, EWC's Fisher)."""
        return self.loss(self.forward(model, inputs), targets)

    # -- evaluation -----------------------------------------------------------------------
    def metrics(self, experience: "Experience | None") -> dict[str, "Metric"]:
        """The metrics of one test column (``None``: a stream-wide test set), primary first."""
        raise NotImplementedError

    def metric_specs(self) -> dict[str, "MetricSpec"]:
        """Declarations (:func:`clbench.metrics.declared.declare`) of metrics of :meth:`metrics`
        whose class does not say what it is (a stock torchmetrics class has no title), by name;
        a metric not here is described by its class alone. Default: none."""
        return {}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batch: Any, metrics: Any, column: "Experience | None" = None) -> None:
        """Update one column's metrics (a ``MetricCollection``) with one test batch;
        ``column`` is the experience the column scores (``None``: a stream-wide test set)."""
        inputs, targets = self.split(batch)
        if routing.is_recording() and isinstance(targets, Tensor) and targets.ndim == 1 \
                and not targets.is_floating_point():
            # a routing unit's composition for N_eff: its test experience and its sample's class
            with routing.units(sample_labels=targets):
                outputs = self.forward(model, inputs)
        else:
            outputs = self.forward(model, inputs)
        metrics.update(outputs, targets)

    def evaluate_padding(self, model: nn.Module, batch: Any, metrics: Any, column: "Experience | None" = None) -> None:
        """Run the forwards :meth:`evaluate` runs, keeping nothing: under sharded parameters
        (where every forward is a collective) a rank whose test shard ran out evaluates a padding
        batch beside its peers. ``metrics`` are throwaway; an objective that keeps outputs (see
        :meth:`save_outputs`) must not keep this batch's."""
        self.evaluate(model, batch, metrics, column)

    def begin_experience(self, experience: "Experience") -> None:
        """Before training on ``experience`` (and before a reference model or the pretraining
        trains on its data): per-experience set-up such as class weights from its labels."""

    def begin_evaluation(self) -> None:
        """Before every evaluation pass over the test columns."""

    def finish_evaluation(self, model: nn.Module, evaluating: Callable[[Any], ContextManager[None]] | None = None
                          ) -> None:
        """Complete what :meth:`evaluate` deferred (the causal-LM objective's pooled generation),
        on every process, before the pass's metrics are computed. ``evaluating(column)``: the
        strategy's context for a column's samples, given when the strategy has one (else
        samples of different columns may be processed together)."""

    def end_evaluation(self) -> None:
        """After every evaluation pass, on every process (under data parallelism each saw its
        shard): where what :meth:`save_outputs` writes is gathered from all of them."""

    def summary(self) -> dict[str, Any]:
        """Figures for ``result.json`` under ``objective`` (e.g. how many prompts were truncated)."""
        return {}

    def save_outputs(self, directory: Path) -> None:
        """After the final evaluation, write what a reader may want besides scores (a
        generative objective's predictions per test experience) under ``directory``."""
