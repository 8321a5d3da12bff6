"""Averaged Gradient Episodic Memory (A-GEM).

Chaudhry et al. 2019, "Efficient Lifelong Learning with A-GEM" (ICLR). Each step computes the
gradient g of the current batch and a reference gradient g_ref of the loss on a random batch
from the episodic memory of past experiences; if they conflict (g·g_ref < 0) the update uses
the projection ``g − (g·g_ref / g_ref·g_ref) g_ref``, the closest direction that does not
increase the memory loss to first order; otherwise g is used unchanged.

Choices:

* Memory: a fixed number of samples per experience (``patterns_per_experience``), as in the
  paper, where the memory grows by one task's worth per task. They are a seeded uniform random
  subset of the experience's training split (the reference code stores equal numbers per class;
  a uniform draw keeps the class mix of the experience, which also suits imbalanced streams).
* Memory batch: drawn with replacement, one per step, by a ``CombinedLoader`` paired with the
  current loader (the reference code draws without replacement, or the whole memory when it is
  smaller than the batch; either gives an unbiased estimate of the average memory gradient).
* Where: in the ``before_optimizer_step`` hook, where ``p.grad`` holds the complete gradient of the
  step (after gradient accumulation, after DDP's all-reduce; the projection is unchanged by
  AMP's loss scaling since it is linear in g and invariant to the scale of g_ref). Under
  gradient accumulation the memory batch of the last micro-batch is used.
* Distributed: every rank draws the same memory batch of ``sample_size`` samples (the memory
  sampler is not sharded), so g_ref is that of the single-process step; it is still averaged
  with an all-reduce, which guards against ranks drifting apart through non-deterministic
  kernels, and every rank projects the same all-reduced g onto the same g_ref. The current
  batch is sharded as usual. Sharded parameters (FSDP) are not handled: the dot products would
  only cover each shard.
* The memory forward runs in training mode, like the current batch (batch norm statistics see
  memory samples too, as they do in replay).
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from clbench import Strategy
from clbench.strategies.replay import memory_dataset, seeded_generator, with_memory


def project(grads: list[torch.Tensor], reference: list[torch.Tensor]) -> torch.Tensor:
    """Project ``grads`` in place so that they do not oppose ``reference``; returns g·g_ref.

    The test is made on device (no host sync): the coefficient is 0 when g·g_ref >= 0.
    """
    g = torch.cat([t.reshape(-1) for t in grads]).float()  # dot products in at least float32
    r = torch.cat([t.reshape(-1) for t in reference]).float()
    dot = g @ r
    coefficient = torch.where(dot < 0, dot / (r @ r).clamp_min(torch.finfo(r.dtype).tiny), torch.zeros_like(dot))
    for t, ref in zip(grads, reference):
        t.sub_(coefficient * ref)
    return dot


class AGEM(Strategy):
    """A-GEM.

    Args:
        patterns_per_experience: samples stored from each experience (the paper's setups:
            250 per task on permuted MNIST, 25 per class; 65 per task on split CIFAR).
        sample_size: memory samples per reference gradient (the paper: 256).
    """

    supports_distributed = True  # same memory batch on every rank; g_ref all-reduced before the projection

    def __init__(self, patterns_per_experience: Annotated[int, Field(ge=0)] = 250,
                 sample_size: Annotated[int, Field(ge=1)] = 256):
        super().__init__()
        self.patterns_per_experience = patterns_per_experience
        self.sample_size = sample_size
        self.memory = torch.zeros((0, 2), dtype=torch.long)  # (experience position, sample index)
        self._position = 0
        self._memory_batch = None

    def before_experience(self, ctx, experience):
        self._position = experience.position
        self._memory_batch = None

    def train_loader(self, ctx, dataset, make_loader):
        current = make_loader(dataset)
        if len(self.memory) == 0:
            return current
        return with_memory(current, memory_dataset(self.experiences, self.memory), make_loader, self.sample_size,
                           seeded_generator(self.seed, "agem-loader", self._position), shard=False)

    def prepare_batch(self, ctx, batch):
        if isinstance(batch, dict) and set(batch) == {"current", "memory"}:
            self._memory_batch = batch["memory"]
            batch = batch["current"]
        return ctx.objective.split(batch)

    def before_optimizer_step(self, ctx, optimizer):
        if self._memory_batch is None:
            return
        x, y = ctx.objective.split(self._memory_batch)
        self._memory_batch = None
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        with torch.enable_grad():  # optimizers run their step under no_grad
            loss = ctx.objective.loss_of(ctx.model, x, y)
        reference = torch.autograd.grad(loss, params, allow_unused=True)
        # A parameter that neither batch reaches keeps grad None (the optimizer skips it).
        pairs = [(p, r) for p, r in zip(params, reference) if p.grad is not None or r is not None]
        params = [p for p, _ in pairs]
        reference = [torch.zeros_like(p) if r is None else r for p, r in pairs]
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            flat = torch.cat([r.reshape(-1) for r in reference])
            torch.distributed.all_reduce(flat)
            flat /= torch.distributed.get_world_size()
            reference = [r.view_as(p) for r, p in zip(torch.split(flat, [p.numel() for p in params]), params)]
        for p in params:
            if p.grad is None:  # not reached by the current batch: its update is the projection alone
                p.grad = torch.zeros_like(p)
        project([p.grad for p in params], reference)

    def after_experience(self, ctx, experience):
        n = len(experience.train)
        k = min(self.patterns_per_experience, n)
        generator = seeded_generator(self.seed, "agem-memory", experience.position)
        chosen = torch.randperm(n, generator=generator)[:k].sort().values
        rows = torch.stack([torch.full((k,), experience.position, dtype=torch.long), chosen], dim=1)
        self.memory = torch.cat([self.memory, rows])

    def state_dict(self):
        return {"memory": self.memory.clone()}

    def load_state_dict(self, state):
        self.memory = state["memory"].long()
