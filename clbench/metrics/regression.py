"""Mean squared error per test sample, summed over output dimensions (lower is better).

torchmetrics' ``MeanSquaredError`` averages over every element, so a D-dimensional target
weighs each dimension 1/D; the regression streams score the squared error norm of a
prediction (as the MoE-CL theory paper's test error does), hence this small metric.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class SquaredError(Metric):
    """Mean over samples of ``||pred - target||²``; DDP-exact (sum and count states)."""

    higher_is_better = False
    title = "MSE"  # shown in tables (clbench.metrics.declared)
    percent = False
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        err = (preds.double() - target.double()).pow(2)
        self.total += err.reshape(len(err), -1).sum()
        self.count += len(err)

    def compute(self) -> Tensor:
        return self.total / self.count.clamp(min=1)
