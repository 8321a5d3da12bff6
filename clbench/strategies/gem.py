"""Gradient Episodic Memory (GEM).

Lopez-Paz & Ranzato 2017, "Gradient Episodic Memory for Continual Learning" (NeurIPS). An
episodic memory keeps samples of every past experience k. At each step the gradient g_k of the
loss on memory k is computed for every past k; when the current gradient g conflicts with any
of them (⟨g, g_k⟩ < 0) the update uses instead the closest direction g̃ that conflicts with
none, found through the dual quadratic program of the paper (its Eq. 10-11)::

    v* = argmin_v  ½ vᵀ G Gᵀ v + gᵀ Gᵀ v   subject to  v ≥ γ        (G: one row g_k per past k)
    g̃  = Gᵀ v* + g

solved with ``quadprog``. γ (``memory_strength``) is the margin the paper adds to v "to bias the
projection towards updates that favour backward transfer"; with γ = 0 this is the exact
Euclidean projection onto the cone {z : G z ≥ 0}. For any γ ≥ 0 the KKT conditions give
G g̃ = μ ≥ 0, so no memory loss increases to first order.

Choices:

* Memory: ``patterns_per_experience`` samples per experience (the paper: 256 per task), a
  seeded uniform draw from its training split, stored as (experience position, sample index)
  pairs, so a checkpoint holds indices and a resumed run reads the same samples again.
* Each g_k is the gradient of the mean loss over all of memory k, as in the paper. The memory is
  read in chunks of ``memory_batch_size`` (default: the training batch size), and the chunks'
  gradients are averaged weighted by their sample counts (a text objective's per-token mean
  is then taken per chunk). Chunks are collated once per experience with the objective's
  training collate, so the method works for any objective: images, text, regression.
* The QP is solved in its dual, which needs only the t × t Gram matrix G Gᵀ and G g: G itself
  stays on the training device. quadprog needs G Gᵀ positive definite; it is only
  semi-definite when memory gradients are linearly dependent, so a ridge of 1e-10 times its
  mean diagonal is added (10³ times larger on each failure). The reference code adds a fixed
  1e-3, which is not scale-free: it swamps the QP when gradients are small (LoRA on a language
  model) and it lets each active constraint end ε·v_k below zero.
* G g, G Gᵀ and g̃ in float64 (g̃ returned in float32): a memory whose loss has saturated (task-IL,
  two classes per head) has a gradient whose squared norm falls below float32's range, and
  float32 products then give multipliers that send the step to NaN (:func:`project`).
* Only ``requires_grad`` parameters are projected (LoRA adapters, when the base is frozen).
* Where: the ``before_optimizer_step`` hook, like A-GEM: ``p.grad`` holds the step's full gradient
  (after accumulation and DDP's all-reduce). Memory gradients come from
  ``torch.autograd.grad``. Under DDP every rank reads the whole memory (it is not sharded), so
  each g_k is the single-process one; they are still all-reduced (averaged), which guards
  against ranks drifting apart through non-deterministic kernels, so every rank solves the
  same QP and the replicas stay identical. Sharded parameters are not supported.
* Cost: one forward/backward over every past memory per step (the paper's method), and the
  t flattened gradients of the trainable parameters in memory.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import quadprog
import torch
from pydantic import Field
from torch.utils._pytree import tree_leaves, tree_map

from clbench import Strategy
from clbench.data.datasets import make_loader
from clbench.strategies.replay import loader_batch_size, memory_dataset, seeded_generator

_RIDGE = 1e-10  # relative to the mean diagonal of G Gᵀ; grown on a failed factorisation


def solve_dual(gram: np.ndarray, dots: np.ndarray, margin: float) -> np.ndarray:
    """v* = argmin_{v ≥ margin} ½ vᵀ gram v + dotsᵀ v (``gram`` = G Gᵀ, ``dots`` = G g)."""
    t = len(dots)
    gram = 0.5 * (gram + gram.T)
    scale = max(float(np.trace(gram)) / t, np.finfo(np.float64).tiny)
    ridge = _RIDGE
    while True:
        try:  # quadprog: min ½ xᵀPx − qᵀx subject to Cᵀx ≥ b
            return quadprog.solve_qp(gram + np.eye(t) * ridge * scale, -dots, np.eye(t), np.full(t, margin))[0]
        except ValueError:
            if ridge >= 1e-1:
                raise
            ridge *= 1e3


def project(grad: torch.Tensor, memories: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
    """GEM's g̃ for the flat gradient ``grad`` and one memory gradient per row of ``memories``.

    Returns ``grad`` itself when no constraint is violated (the paper projects only then). The
    products, the QP and g̃ are computed in float64 and g̃ returned in ``grad``'s dtype: once a
    memory's loss has saturated, its gradient's squared norm falls below float32's normal range
    (measured on task-IL Split Fashion-MNIST: 1e-40 ten epochs into the second experience), the
    float32 Gram matrix turns to denormals or zero, and the multipliers computed from it blow the
    step up until the loss is NaN.
    """
    grad64, memories64 = grad.double(), memories.double()
    dots = memories64 @ grad64
    if not bool((dots < 0).any()):
        return grad
    gram = (memories64 @ memories64.T).cpu().numpy()
    v = solve_dual(gram, dots.cpu().numpy(), margin)
    return (grad64 + torch.as_tensor(v, device=memories.device) @ memories64).to(grad.dtype)


def _flat(tensors, params) -> torch.Tensor:
    return torch.cat([(torch.zeros_like(p) if t is None else t).reshape(-1).float() for t, p in zip(tensors, params)])


class GEM(Strategy):
    """Gradient Episodic Memory.

    Args:
        patterns_per_experience: samples stored from each experience (the paper: 256 per task).
        memory_strength: γ, the margin on the dual variables (0.5 in the reference code's
            experiments and Avalanche's default; 0 gives the exact projection).
        memory_batch_size: samples per forward pass over a memory; changes memory use, not the
            method. ``None`` uses the training batch size.
    """

    supports_distributed = True  # every rank reads the whole memory; memory gradients all-reduced before the QP

    def __init__(self, patterns_per_experience: Annotated[int, Field(ge=0)] = 256,
                 memory_strength: Annotated[float, Field(ge=0)] = 0.5,
                 memory_batch_size: Annotated[int, Field(ge=1)] | None = None):
        super().__init__()
        self.patterns_per_experience = patterns_per_experience
        self.memory_strength = memory_strength
        self.memory_batch_size = memory_batch_size
        self.memory = torch.zeros((0, 2), dtype=torch.long)  # (experience position, sample index)
        self._chunks: list[list[tuple]] = []  # per past experience: (inputs, targets, count) chunks
        self._device = torch.device("cpu")     # where the chunks are
        self.projections = 0  # steps whose gradient was projected in the current experience

    # -- memory ----------------------------------------------------------------------------
    def train_loader(self, ctx, dataset, make_loader_):
        current = make_loader_(dataset)
        self.projections = 0
        self._chunks = self._read_memory(ctx, self.memory_batch_size or loader_batch_size(current))
        self._device = torch.device("cpu")
        return current

    def _read_memory(self, ctx, batch_size: int) -> list[list[tuple]]:
        """Every past experience's memory as collated, split chunks (read once per experience,
        after the runner has seeded it, so a resumed run reads the same augmented views)."""
        objective = ctx.objective
        out = []
        for position in torch.unique(self.memory[:, 0]).tolist():
            rows = self.memory[self.memory[:, 0] == position]
            data = memory_dataset(self.experiences, rows)
            chunks = []
            for batch in make_loader(data, batch_size, shuffle=False, collate_fn=objective.collate(train=True)):
                x, y = objective.split(batch)
                chunks.append((x, y, len(tree_leaves(y)[0])))
            out.append(chunks)
        return out

    def after_experience(self, ctx, experience):
        n = len(experience.train)
        k = min(self.patterns_per_experience, n)
        chosen = torch.randperm(n, generator=seeded_generator(self.seed, "gem-memory", experience.position))[:k]
        rows = torch.stack([torch.full((k,), experience.position, dtype=torch.long), chosen.sort().values], dim=1)
        self.memory = torch.cat([self.memory, rows])
        self._chunks = []

    # -- the projection ---------------------------------------------------------------------
    def memory_gradient(self, ctx, params, chunks, reached: list[bool] | None = None) -> torch.Tensor:
        """Flat gradient of the mean task loss over one experience's memory; ``reached[i]`` is
        set where parameter i gets a gradient."""
        total = sum(count for _, _, count in chunks)
        flat = None
        for x, y, count in chunks:
            with torch.enable_grad():  # optimizers run their step under no_grad
                loss = ctx.objective.loss_of(ctx.model, x, y)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            if reached is not None:
                reached[:] = [r or g is not None for r, g in zip(reached, grads)]
            grads = _flat(grads, params) * (count / total)
            flat = grads if flat is None else flat + grads
        return flat

    def before_optimizer_step(self, ctx, optimizer):
        if not self._chunks:
            return
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        device = params[0].device
        if self._device != device:  # the chunks move to the training device once per experience
            self._chunks = [[tree_map(lambda t: t.to(device) if torch.is_tensor(t) else t, chunk) for chunk in chunks]
                            for chunks in self._chunks]
            self._device = device
        reached = [p.grad is not None for p in params]
        memories = torch.stack([self.memory_gradient(ctx, params, chunks, reached) for chunks in self._chunks])
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(memories)
            memories /= torch.distributed.get_world_size()
        grad = _flat([p.grad for p in params], params)
        projected = project(grad, memories, self.memory_strength)
        if projected is grad:
            return
        self.projections += 1
        start = 0
        for p, hit in zip(params, reached):
            end = start + p.numel()
            update = projected[start:end].view_as(p).to(p.dtype)
            if p.grad is not None:
                p.grad.copy_(update)
            elif hit:  # reached by a memory only: its update is the projection's
                p.grad = update.clone()
            start = end  # (reached by neither: grad stays None and the optimizer skips it)

    # -- resume -----------------------------------------------------------------------------
    def state_dict(self):
        return {"memory": self.memory.clone()}

    def load_state_dict(self, state):
        self.memory = state["memory"].long()
        self._chunks = []
