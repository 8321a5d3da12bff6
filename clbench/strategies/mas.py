"""Memory Aware Synapses (MAS).

Aljundi, Babiloni, Elhoseiny, Rohrbach & Tuytelaars 2018, "Memory Aware Synapses: Learning what
(not) to forget" (ECCV). A parameter matters as much as the network's output is sensitive to it.
After each experience, at the trained parameters θ*,

    Ω_ij = 1/N Σ_k | ∂ ‖F(x_k; θ)‖²₂ / ∂θ_ij |

over the experience's N training samples (F: the output logits), and later training minimises

    loss + λ · Σ_ij Ω_ij (θ_ij − θ*_ij)²

(the paper's penalised loss, without a ½: its reference code adds ``2λΩ(θ − θ*)`` to the gradient).

Choices:

* Per-sample gradients, the paper's Σ_k |g_k| (the reference code's ``b1`` mode). The reference
  code's default takes the gradient of a whole batch's Σ_k ‖F(x_k)‖², whose magnitude is
  |Σ_k g_k| ≤ Σ_k |g_k|: smaller wherever samples pull a parameter in opposite directions, and
  dependent on the batch size. Per-sample gradients are summed as in EWC's Fisher: for linear
  layers from ``|δ|ᵀ|a|`` (:func:`clbench.strategies.ewc.linear_gradient_moments`), else from
  ``torch.func`` (vmap in chunks; keyword inputs one backward pass per sample).
* F in the harness's heads. Class- and domain-incremental streams share one head: F is all its
  logits. On a task-incremental stream whose objective masks logits outside a sample's task,
  only that task's logits count (the others are zeroed, not masked to the lowest value, which
  would dominate the norm): the paper's multi-head setting, where F ends in the task's head.
* Data: the experience's training split (the paper computes Ω on the task's training data; no
  labels are needed except to pick a sample's task head); ``samples`` takes a seeded subset.
* Accumulation: Ω is summed over experiences and θ* is the latest trained parameters, as the
  reference code accumulates (previous Ω + new Ω). Avalanche's moving average
  (``α Ω_old + (1 − α) Ω_new``) makes old experiences fade instead.
* The model is in eval mode while Ω is estimated (as the reference code does), so Ω is
  deterministic. Ω and θ* are kept by :class:`clbench.strategies.ewc.EWC`'s online bookkeeping
  with γ = 1 (``Ω ← Ω + Ω_t``, anchor ← θ*_t), whose flat penalty costs one dot product a step.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field
from torch import nn
from torch.func import grad, vmap
from torch.utils._pytree import tree_leaves, tree_map

from clbench import Objective, Strategy
from clbench.data.datasets import make_loader
from clbench.strategies.ewc import EWC, _Functional, estimation_chunk, estimation_set, linear_gradient_moments


def _squared_norms(outputs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Each sample's ``‖F(x)‖²`` over the outputs ``keep`` marks (B,)."""
    return (outputs.float() * keep).square().sum(1)


def output_importance(model: nn.Module, dataset, *, batch_size: int = 64, device: torch.device | None = None,
                      objective: Objective | None = None) -> dict[str, torch.Tensor]:
    """Mean over samples of ``|∂ ‖F(x)‖² / ∂θ|`` for every trainable parameter (eval mode).

    ``F(x)`` is ``objective.forward(model, x)``; where the objective has a ``task_mask`` (a
    task-incremental classification stream) only the logits of the sample's task count.
    """
    if objective is None:
        from clbench.objectives.classification import Classification

        objective = Classification()
    device = device or next(model.parameters()).device
    mask = getattr(objective, "task_mask", None)
    trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    buffers = {n: b.detach() for n, b in model.named_buffers()}

    def squared_norm(params, x, keep):
        one = tree_map(lambda t: t.unsqueeze(0), x)
        outputs = objective.forward(_Functional(model, (params, frozen, buffers)), one)
        return (outputs.float() * keep).square().sum()

    per_sample = vmap(grad(squared_norm), in_dims=(None, 0, 0))
    importance = {n: torch.zeros_like(p) for n, p in trainable.items()}
    count = 0
    was_training = model.training
    model.eval()
    try:
        for batch in make_loader(dataset, batch_size, shuffle=False, collate_fn=objective.collate(train=True)):
            x, y = tree_map(lambda t: t.to(device), objective.split(batch))
            n = len(tree_leaves(y)[0])
            keep = torch.ones(n, 1, device=device) if mask is None else mask.to(device)[y].float()
            if isinstance(x, dict):
                _accumulate_one_by_one(model, objective, x, keep, importance)
            elif not linear_gradient_moments(model, objective.forward, _squared_norms, trainable, x, keep,
                                             importance, power=1):
                for name, g in per_sample(trainable, x, keep).items():
                    importance[name] += g.abs().sum(0)
            count += n
    finally:
        model.train(was_training)
    return {n: v / max(count, 1) for n, v in importance.items()}


def _accumulate_one_by_one(model: nn.Module, objective: Objective, x: dict, keep: torch.Tensor,
                           importance: dict) -> None:
    """Add each sample's ``|∂ ‖F‖² / ∂θ|``, one backward pass per sample (keyword inputs, which
    ``vmap`` cannot trace; see :func:`clbench.strategies.ewc._accumulate_one_by_one`)."""
    names = list(importance)
    params = dict(model.named_parameters())
    params = [params[n] for n in names]
    for i in range(len(keep)):
        xi = tree_map(lambda t, i=i: t[i:i + 1], x)
        with torch.enable_grad():
            value = (objective.forward(model, xi).float() * keep[i]).square().sum()
        for n, g in zip(names, torch.autograd.grad(value, params, allow_unused=True)):
            if g is not None:
                importance[n] += g.abs()


class MAS(Strategy):
    """Memory Aware Synapses.

    Args:
        mas_lambda: λ, the penalty strength. Default 1.0: the paper's and its reference code's
            value for the object-recognition sequences.
        samples: training samples of each experience Ω is estimated on (a seeded random
            subset); ``None`` uses all of them, as the paper does.
        importance_batch_size: samples per vmapped chunk; it changes memory use, not Ω.
            ``None`` takes the largest chunk (up to 256) whose per-sample gradients hold at
            most 2^28 numbers, as EWC does.
    """

    requires = frozenset({"classification"})  # F is the class logits (a task's head in task-IL)
    supports_distributed = True  # DDP: every rank estimates the same Ω on the same samples

    def __init__(self, mas_lambda: Annotated[float, Field(ge=0)] = 1.0,
                 samples: Annotated[int, Field(ge=1)] | None = None,
                 importance_batch_size: Annotated[int, Field(ge=1)] | None = None):
        super().__init__()
        self.mas_lambda = mas_lambda
        self.samples = samples
        self.importance_batch_size = importance_batch_size
        self.regulariser = EWC(mode="online", gamma=1.0)  # Ω (importance) and θ* (anchor), by name
        self.regulariser.method = "MAS"

    @property
    def importance(self) -> dict[str, torch.Tensor]:
        """Ω by parameter name, summed over the experiences so far."""
        return self.regulariser.importance

    @property
    def anchor(self) -> dict[str, torch.Tensor]:
        """θ* by parameter name: the parameters after the latest experience."""
        return self.regulariser.anchor

    def penalty(self, model: nn.Module) -> torch.Tensor:
        """``Σ Ω (θ − θ*)²`` (without λ) for the current parameters."""
        return self.regulariser.penalty(model)

    def before_experience(self, ctx, experience):
        self.regulariser.before_experience(ctx, experience)

    def training_loss(self, ctx, x, y, logits, loss):
        if not self.importance or self.mas_lambda == 0:
            return loss
        return loss + self.mas_lambda * self.penalty(ctx.model)

    def after_experience(self, ctx, experience):
        dataset = estimation_set(experience, self.samples, self.seed, "mas-importance")
        model = ctx.model
        chunk = estimation_chunk(model, self.importance_batch_size)
        home = next(model.parameters()).device
        model.to(ctx.device)  # where training runs (a module outside a run is back on the CPU after fit)
        try:
            importance = output_importance(model, dataset, batch_size=chunk, device=ctx.device,
                                           objective=ctx.objective)
            theta = {n: p.detach().clone() for n, p in model.named_parameters() if n in importance}
        finally:
            model.to(home)
        self.regulariser.consolidate(importance, theta)

    def state_dict(self):
        return self.regulariser.state_dict()

    def load_state_dict(self, state):
        self.regulariser.load_state_dict(state)
