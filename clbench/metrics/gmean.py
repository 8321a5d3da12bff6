"""G-mean: the geometric mean of per-class recalls, as a DDP-safe torchmetrics ``Metric``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from clbench.metrics.functional import Absent, geometric_mean_compute, geometric_mean_update


class GeometricMean(Metric):
    """``G = (prod_c recall_c) ** (1/K')`` (Kubat & Matwin 1997; thesis A.7).

    One low recall pulls G down, and any class with zero recall makes it 0, which is why it is
    used next to accuracy on imbalanced streams.

    Classes absent from the evaluated data are explicit: with ``absent="ignore"`` (default) a
    class that has no sample in the evaluated targets has an undefined recall and is left out
    of the product, so a Dirichlet partition that drops a class is scored on the classes it
    has. ``absent="zero"`` counts all ``num_classes`` with recall 0 for absent ones (the
    thesis's product read literally, which is then 0 for such partitions). NaN when no class
    is present. Predictions into an absent class are still errors for the class they belong to.

    States are per-class integer counts summed across processes, so the DDP value equals the
    single-process value exactly (given each sample is evaluated once; see docs/metrics.md).
    ``update(preds, target)`` takes scores ``(N, K)`` (logits or probabilities, argmax is the
    prediction) or predicted labels ``(N,)``, and targets ``(N,)``.
    """

    is_differentiable = False
    higher_is_better = True
    title = "G-mean"  # shown in tables (clbench.metrics.declared)
    percent = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    correct: Tensor
    support: Tensor

    def __init__(self, num_classes: int, *, absent: Absent = "ignore", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        if absent not in ("ignore", "zero"):
            raise ValueError(f"absent must be 'ignore' or 'zero', got {absent!r}")
        self.num_classes = num_classes
        self.absent = absent
        zeros = torch.zeros(num_classes, dtype=torch.long)
        self.add_state("correct", default=zeros.clone(), dist_reduce_fx="sum")
        self.add_state("support", default=zeros.clone(), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        correct, support = geometric_mean_update(preds, target, self.num_classes)
        self.correct += correct.to(self.correct.device)
        self.support += support.to(self.support.device)

    def compute(self) -> Tensor:
        return geometric_mean_compute(self.correct, self.support, absent=self.absent)

    def recalls(self) -> Tensor:
        """Per-class recall over the accumulated data (NaN for absent classes); local, unsynced."""
        recall = torch.full((self.num_classes,), float("nan"), dtype=torch.float64,
                            device=self.support.device)
        seen = self.support > 0
        recall[seen] = self.correct[seen].double() / self.support[seen].double()
        return recall
