"""G-mean: the geometric mean of per-class recalls, on torchmetrics' multiclass stat scores."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.classification import MulticlassStatScores

from clbench.metrics.functional import Absent, geometric_mean_compute, predicted_labels


class GeometricMean(MulticlassStatScores):
    """``G = (prod_c recall_c) ** (1/K')`` (Kubat & Matwin 1997; thesis A.7).

    One low recall pulls G down, and any class with zero recall makes it 0, which is why it is
    used next to accuracy on imbalanced streams.

    Classes absent from the evaluated data are explicit: with ``absent="ignore"`` (default) a
    class that has no sample in the evaluated targets has an undefined recall and is left out
    of the product, so a Dirichlet partition that drops a class is scored on the classes it
    has. ``absent="zero"`` counts all ``num_classes`` with recall 0 for absent ones (the
    thesis's product read literally, which is then 0 for such partitions). NaN when no class
    is present. Predictions into an absent class are still errors for the class they belong to.

    The states are torchmetrics' per-class integer counts (``average=None``: true and false
    positives and negatives), summed across processes, so the DDP value equals the
    single-process value exactly (given each sample is evaluated once; see docs/metrics.md);
    recall is ``tp / (tp + fn)``, as ``MulticlassRecall(average=None)`` gives it, in float64.
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

    def __init__(self, num_classes: int, *, absent: Absent = "ignore", **kwargs: Any) -> None:
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        if absent not in ("ignore", "zero"):
            raise ValueError(f"absent must be 'ignore' or 'zero', got {absent!r}")
        super().__init__(num_classes=num_classes, average=None, validate_args=False, **kwargs)
        self.absent = absent

    def update(self, preds: Tensor, target: Tensor) -> None:
        labels, target = predicted_labels(preds, target, self.num_classes)
        super().update(labels.to(self.tp.device), target.to(self.tp.device))

    def compute(self) -> Tensor:
        tp, _, _, fn = self._final_state()
        return geometric_mean_compute(tp, tp + fn, absent=self.absent)

    def recalls(self) -> Tensor:
        """Per-class recall over the accumulated data (NaN for absent classes); local, unsynced."""
        support = self.tp + self.fn
        recall = torch.full((self.num_classes,), float("nan"), dtype=torch.float64, device=support.device)
        seen = support > 0
        recall[seen] = self.tp[seen].double() / support[seen].double()
        return recall
