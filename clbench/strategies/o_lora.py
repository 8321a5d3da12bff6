"""Orthogonal LoRA (O-LoRA).

Wang et al. 2023, "Orthogonal Subspace Learning for Language Model Continual Learning"
(Findings of EMNLP; arXiv:2310.14152). Each task t trains a new LoRA (A_t, B_t) on the frozen
model; the LoRAs of earlier tasks stay in the model, frozen, and their outputs are still added.
The new LoRA's input subspace is pushed away from the earlier ones by

    loss + λ1 · Σ_layers Σ_{i<t} ‖A_i A_tᵀ‖²  (+ λ2 · Σ_{W ∈ {A_t, B_t}} ‖W‖₂)

with A the down-projection (r × in features), one term per adapted layer and earlier task.

Choices:

* One peft adapter per task (``task0``, ``task1``, ...), all active at once: peft sums the
  outputs of active adapters, ``Σ_i B_i A_i x · α/r``, which is exactly the paper's merge by
  concatenating earlier A's and B's along the rank (``[B_1 … B_t] [A_1; …; A_t] x``), with the
  same α/r scaling for every block as in the released code. peft supports several adapters
  per layer; it cannot grow one adapter's rank in place, and separate adapters also keep each
  task's A addressable for the orthogonality term and for inspection.
* Orthogonality term: the paper's squared entries, Σ_jk O[j,k]² with O = A_i A_tᵀ. The
  released code sums absolute values instead (Σ |O[j,k]|); the paper's form is used.
* λ1 = 0.5 and λ2 = 0, the released code's defaults (its ``lamda_1``, ``lamda_2``; the extracts
  of the papers reporting O-LoRA on TRACE give no values). The λ2 term follows the code: the sum of
  the (unsquared) L2 norms of the current A and B; off by default, as there.
* LoRA settings as :mod:`clbench.strategies.lora` (r = 8, α = 32, dropout 0.1: the released code's;
  query and value projections, as its TRACE port).
* Task boundaries are the experiences; inference needs no task id (all LoRAs always run).
* Each task's LoRA is initialised from its own seed (the strategy's seed and the task index),
  not from the global generator at the time it is made. With sharded parameters
  (``trainer.strategy: fsdp``) no LoRA can be added once the model is sharded, so the LoRAs of
  every task are made before (:meth:`OLoRA.adapt_model` asked for the whole stream), inactive
  and frozen until their task; seeded per task, they start as they would have unsharded, and a
  resumed run makes them as the uninterrupted one did.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
from pydantic import Field
from torch import nn

from clbench import Strategy, derive_seed, full_tensor
from clbench.strategies.lora import activate, add_adapter, lora_config, lora_layers, refuse_other_adapters


def task_adapter(index: int) -> str:
    return f"task{index}"


def orthogonality_loss(model: nn.Module, current: str, previous: list[str]) -> torch.Tensor:
    """Σ over adapted layers and earlier adapters i of ‖A_i A_currentᵀ‖² (squared entries).

    Computed outside the forward pass, so under sharded parameters the A's are sharded DTensors:
    DTensor's operators gather what the products need, and the sum is made a whole tensor
    (differentiably) before it joins the loss."""
    terms = []
    for layer in lora_layers(model):
        if current not in layer.lora_A:
            continue
        old = [layer.lora_A[name].weight for name in previous if name in layer.lora_A]
        if old:
            a_t = layer.lora_A[current].weight.float()
            terms.append((torch.cat(old).float() @ a_t.T).pow(2).sum())
    if not terms:
        return torch.zeros((), device=next(model.parameters()).device)
    return full_tensor(torch.stack(terms).sum())


def l2_loss(model: nn.Module, current: str) -> torch.Tensor:
    """Σ of the L2 norms of the current adapter's A and B matrices (the released code's λ2 term)."""
    terms = [torch.linalg.vector_norm(getattr(layer, part)[current].weight.float())
             for layer in lora_layers(model) for part in ("lora_A", "lora_B") if current in layer.lora_A]
    return full_tensor(torch.stack(terms).sum()) if terms else torch.zeros((), device=next(model.parameters()).device)


class OLoRA(Strategy):
    """O-LoRA: a new LoRA per task, orthogonal to the earlier ones, which stay frozen.

    Args:
        r, alpha, dropout, target_modules, layers: each task's LoRA, as in ``seq_lora``.
        lambda_1: λ1, weight of the orthogonality term (the released code's 0.5).
        lambda_2: λ2, weight of the L2 norm of the current LoRA (the released code's 0).
    """

    supports_distributed = True  # each task's adapter is created from the same seed on every rank
    supports_sharded = True  # every task's adapter is made before sharding (adapt_model)

    def __init__(self, r: Annotated[int, Field(ge=1)] = 8, alpha: Annotated[float, Field(gt=0)] = 32.0,
                 dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1,
                 target_modules: Annotated[list[str], Field(min_length=1)] | None = None,
                 layers: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None,
                 lambda_1: Annotated[float, Field(ge=0)] = 0.5, lambda_2: Annotated[float, Field(ge=0)] = 0.0):
        super().__init__()
        self.r = r
        self.alpha = alpha
        self.dropout = dropout
        self.target_modules = target_modules
        self.layers = layers
        self.lambda_1 = lambda_1
        self.lambda_2 = lambda_2
        self.tasks = 0  # tasks begun: task0 .. task{tasks-1}; the last one is trained
        self.created = 0  # adapters in the model (more than tasks once made for sharding)

    def config(self) -> Any:
        return lora_config(self.r, self.alpha, self.dropout, self.target_modules, self.layers)

    @property
    def names(self) -> list[str]:
        return [task_adapter(i) for i in range(self.tasks)]

    def setup(self, ctx, experiences, seed):
        super().setup(ctx, experiences, seed)
        refuse_other_adapters(ctx.model, "o_lora")

    def adapt_model(self, ctx, upto):
        """Every task adapter up to ``upto``, each from its own seed (all of them at once before
        sharding), those of the tasks begun running and none training: :meth:`before_experience`
        opens the new task's."""
        while self.created < upto:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(self.seed, "o_lora", self.created))
                add_adapter(ctx.model, self.config(), task_adapter(self.created))
            self.created += 1
        if self.created:
            activate(ctx.model, self.names, trainable=[])

    def before_experience(self, ctx, experience):
        self.tasks += 1
        activate(ctx.model, self.names, trainable=[self.names[-1]])

    def training_loss(self, ctx, x, y, logits, loss):
        if self.tasks == 0:
            return loss
        current, previous = self.names[-1], self.names[:-1]
        if self.lambda_1 and previous:
            loss = loss + self.lambda_1 * orthogonality_loss(ctx.model, current, previous)
        if self.lambda_2:
            loss = loss + self.lambda_2 * l2_loss(ctx.model, current)
        return loss

    def state_dict(self):
        return {"tasks": self.tasks}

    def load_state_dict(self, state):
        self.tasks = int(state["tasks"])
