"""MAUC: Hand & Till's (2001) multiclass AUC, as a DDP-safe torchmetrics ``Metric``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from clbench.metrics.functional import (InputKind, _check_scores, _check_target, _to_probs,
                                        multiclass_mauc_compute, pairwise_auc)


class MulticlassMAUC(Metric):
    """Hand & Till's M measure: the mean over class pairs of ``(Â(i|j) + Â(j|i)) / 2``, where
    ``Â(i|j)`` is the rank-based AUC of ranking class-i above class-j points by p̂(i|x).

    Equal to ``sklearn.metrics.roc_auc_score(multi_class="ovo", average="macro")``; torchmetrics'
    own ``MulticlassAUROC`` is one-vs-rest and is a different number. Ties count one half, as
    with average ranks. Pairs are averaged over the classes present in the evaluated targets
    (an AUC needs points of both classes); NaN when fewer than two are present.

    An AUC is not a sum over batches, so the metric keeps every probability vector: states are
    lists concatenated across processes (``dist_reduce_fx="cat"``), and ``compute`` ranks the
    union. They are stored flat, in the metric's float dtype, targets included: when a process
    saw no data, torchmetrics syncs its list as an empty 1-D tensor of that dtype, and only
    flat states of one dtype concatenate with it (class indices stay exact in float32 below
    2**24). Memory is N x K floats (52 MB for 200,000 x
    65 in float32); pass ``compute_on_cpu=True`` to keep them off the accelerator.

    ``input="logits"`` (default, what models emit) applies a softmax per row before storing:
    Hand & Till rank by the estimated probability of class i, and the softmax is not monotone
    in a logit across samples, so ranking raw logits would give another number.
    ``input="probs"`` takes probabilities as given.
    """

    is_differentiable = False
    higher_is_better = True
    title = "MAUC"  # shown in tables (clbench.metrics.declared)
    percent = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    probs: list[Tensor] | Tensor
    target: list[Tensor] | Tensor

    def __init__(self, num_classes: int, *, input: InputKind = "logits", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
        if input not in ("logits", "probs"):
            raise ValueError(f"input must be 'logits' or 'probs', got {input!r}")
        self.num_classes = num_classes
        self.input = input
        self.add_state("probs", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")

    def update(self, preds: Tensor, target: Tensor) -> None:
        _check_scores(preds, self.num_classes)
        target = _check_target(target, self.num_classes, preds.shape[0])
        probs = _to_probs(preds.detach(), self.input)
        self.probs.append(probs.to(self.dtype).reshape(-1))
        self.target.append(target.to(self.dtype))

    def _gathered(self) -> tuple[Tensor, Tensor]:
        probs = dim_zero_cat(self.probs) if len(self.probs) else torch.zeros(0, device=self.device)
        target = (dim_zero_cat(self.target) if len(self.target)
                  else torch.zeros(0, device=self.device))
        return probs.reshape(-1, self.num_classes), target.long()

    def compute(self) -> Tensor:
        probs, target = self._gathered()
        return multiclass_mauc_compute(probs, target, self.num_classes)

    def pairwise(self) -> Tensor:
        """The ``(K, K)`` matrix ``Â(i|j)`` over the accumulated data (local, unsynced)."""
        probs, target = self._gathered()
        return pairwise_auc(probs, target, self.num_classes)
