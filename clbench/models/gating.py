"""Top-k gate weights: the one place every router's combine formula lives.

Each router picks its experts itself, from the quantity its paper ranks them by: LoRAMoE,
MH-MoE and MoSEs take the top-k of the router logits; the thesis's Switch router the top-k of
its probabilities; the EMA router the top-k of its centroid similarities, outside autograd;
the prototype router the single best of its masked prototype scores, with no gate at all.
Those selections differ in what they rank and in what gradient they carry, so each stays with
its router. What the selected experts' outputs are weighted by is one of five formulas, all
here, each computed from ``scores.gather(-1, indices)``:

* ``"softmax"`` (``scores`` = logits): a softmax over the selected logits only, LoRAMoE's
  Eq. 13 and MoSEs' router (Shazeer et al.'s sparse gate without the noise);
* ``"probability"`` (``scores`` = probabilities): the selected experts' router probabilities
  p_j, Switch Transformer's gate;
* ``"normalized"`` (probabilities): p_j over the selected experts' sum, the thesis's "added and
  normalized"; equal in value to ``"softmax"`` of the logits, computed from the probabilities
  as the thesis's routers always have, so their results keep their last bits;
* ``"straight_through"`` (probabilities): ``"normalized"``'s value with ``"probability"``'s
  gradient, so a top-1 router still learns from the task loss;
* ``"one"``: 1 for every selected expert (LoRAMoE's Eq. 13 with k = 1: the softmax of one logit),
  written as a constant, so the router gets no gradient at all rather than a zero one, which
  Adam's moments and weight decay would still act on.
"""

from __future__ import annotations

import torch
from torch import Tensor

GATE_FORMULAS = ("softmax", "probability", "normalized", "straight_through", "one")


def top_k_gates(scores: Tensor, indices: Tensor, formula: str) -> Tensor:
    """Gate weights ``(..., k)`` of the experts ``indices (..., k)`` chosen from ``scores (..., E)``."""
    chosen = scores.gather(-1, indices)
    if formula == "softmax":
        return chosen.softmax(-1)
    if formula == "probability":
        return chosen
    if formula == "one":
        return torch.ones_like(chosen)
    if formula not in GATE_FORMULAS:
        raise ValueError(f"gate formula must be one of {GATE_FORMULAS}, got {formula!r}")
    normalized = chosen / chosen.sum(-1, keepdim=True)
    if formula == "normalized":
        return normalized
    return normalized + (chosen - chosen.detach())  # exactly the normalized value


def dense_gates(weights: Tensor, indices: Tensor, like: Tensor) -> Tensor:
    """The weights ``(..., k)`` spread over every expert: zero off ``indices``, shaped and typed as ``like``."""
    return torch.zeros_like(like).scatter(-1, indices, weights)
