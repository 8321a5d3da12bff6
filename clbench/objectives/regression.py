"""Regression: squared error, scored by the mean squared test error (lower is better)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch.nn.functional as F
from torch import Tensor

from clbench.objectives.base import Objective


class Regression(Objective):
    """Predictions against real targets of the same shape (``(N,)`` or ``(N, D)``).

    The R entry is ``mse``, the mean over test samples of the squared error summed over output
    dimensions. Models are built with ``input_shape`` and ``output_dim`` from the stream
    (``StreamSpec.input_shape``; ``objective_args["output_dim"]``, default 1).
    """

    model_args: ClassVar[tuple[str, ...]] = ("input_shape", "output_dim")
    provides: ClassVar[frozenset[str]] = frozenset({"regression"})
    higher_is_better: ClassVar[bool] = False

    def model_kwargs(self, spec) -> dict[str, Any]:
        return {"input_shape": tuple(spec.input_shape), "output_dim": int(spec.objective_args.get("output_dim", 1))}

    def forward(self, model, inputs):
        out = model(inputs)
        return out.squeeze(-1) if out.dim() == 2 and out.shape[-1] == 1 else out

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.mse_loss(outputs, targets.to(outputs.dtype))

    def metrics(self, experience):
        from clbench.metrics.regression import SquaredError

        return {"mse": SquaredError()}
