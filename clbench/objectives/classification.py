"""Classification: cross-entropy on logits, accuracy as the R-matrix entry."""

from __future__ import annotations

from typing import Any, ClassVar

import torch.nn.functional as F
from torch import Tensor

from clbench.objectives.base import Objective


class Classification(Objective):
    """Logits ``(N, K)`` against integer labels ``(N,)``.

    Every test column is scored by micro accuracy (``acc``, the R entry), and by G-mean and
    MAUC when the stream opts in (``StreamSpec.imbalance_metrics``, as the built-in image
    streams do) or the config says ``objective: {class_path: classification, init_args:
    {imbalance: true}}`` (``false`` turns them off for any stream).
    """

    model_args: ClassVar[tuple[str, ...]] = ("num_classes", "input_shape")

    def __init__(self, imbalance: bool | None = None):
        """``imbalance``: G-mean and MAUC on every column; ``None`` follows the stream."""
        self.imbalance = imbalance

    def setup(self, spec, experiences) -> None:
        super().setup(spec, experiences)
        self.num_classes = spec.num_classes
        if self.imbalance is None:
            self.imbalance = spec.imbalance_metrics

    def model_kwargs(self, spec) -> dict[str, Any]:
        return {"num_classes": spec.num_classes, "input_shape": tuple(spec.input_shape)}

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs, targets)

    def metrics(self, experience):
        from clbench.metrics.collection import make_eval_metrics

        return make_eval_metrics(self.num_classes, imbalance=bool(self.imbalance))
