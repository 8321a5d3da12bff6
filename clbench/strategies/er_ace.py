"""Experience Replay with Asymmetric Cross-Entropy (ER-ACE).

Caccia et al. 2022, "New Insights on Reducing Abrupt Representation Change in Online Continual
Learning" (ICLR). When new classes arrive, ER's cross-entropy over all classes on the incoming
batch pushes the new classes' data away from the old classes' representations, which drift
abruptly. ACE makes the loss asymmetric: every step minimises::

    CE_{C_in}(f(x_in), y_in) + CE_{C_seen}(f(x_bf), y_bf)

where CE_S is the cross-entropy over the logits of the classes in S only (the others masked
out), C_in the classes present in the incoming batch and C_seen every class seen so far; x_bf is
a batch drawn from a memory filled by reservoir sampling over the stream.

Choices:

* Incoming classes: the classes present in the incoming mini-batch, not those of the current
  task. The paper's ACE masks the classes not among the current ones; its released code
  (pclucas14/AML, ``methods/er_ace.py``) reads them off the batch's labels and runs ER-ACE
  task-free only, so no task boundary is needed; so does this one. That code also leaves the
  logits of classes with ids above the largest seen unmasked, which assumes classes arrive in id
  order; a stream's ``order:`` breaks that, so it is not done here.
* Memory classes: the replay cross-entropy spans the classes seen so far in incoming batches
  (the paper's old and current classes). The released code uses every output unit; the two
  differ only on units of classes not seen yet, which get no gradient here.
* Memory updated online, as in the paper: every incoming batch passes through the reservoir
  after the replay batch is drawn, so replay starts at the second step of the first experience
  (:mod:`clbench.strategies.stream_memory`). ``replay``'s memory, updated
  after each experience, would leave the first experience without replay and would not change
  within an experience, which is not the method; so ``replay`` is not subclassed.
* The incoming and replayed batches get separate forward passes, as in the released code, whose
  notes report that concatenating them loses ACE's gain (batch norm statistics).
* The two terms are summed, as in the released code (Avalanche halves the sum: a rescaled
  learning rate). Each is the objective's loss on masked logits, so a task-IL stream's
  restriction and class weights apply; the objective's loss over every class that the engine
  hands ``training_loss`` is swapped for ACE's, keeping the auxiliary terms the model's layers
  added in the incoming forward (those of the memory forward are not counted).
* Not data-parallel: see :mod:`clbench.strategies.derpp` (one reservoir across ranks would need an
  all-gather of indices at every step).

Cost per step: one memory forward/backward of replay_batch_size samples, read from the training
splits in the main process, and one host copy of the batch's indices.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from clbench.strategies.stream_memory import StreamReplay


def masked(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``logits`` with the columns outside ``keep`` (bool, one per class) at the dtype's lowest
    value: they get probability 0 and, through ``masked_fill``, gradient 0."""
    return logits.masked_fill(~keep.to(logits.device), torch.finfo(logits.dtype).min)


def incoming_loss(objective, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The objective's cross-entropy over the classes present in the batch only."""
    present = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
    present[targets] = True
    return objective.loss(masked(logits, present), targets)


def replay_loss(objective, logits: torch.Tensor, targets: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """The objective's cross-entropy over the classes seen so far (``seen``: bool per class)."""
    return objective.loss(masked(logits, seen), targets)


class ERACE(StreamReplay):
    """ER-ACE.

    Args:
        mem_size: memory slots in total. Default 200 (our choice): the digits streams'
            leaderboard budget, as for ``replay`` and ``derpp``.
        replay_batch_size: memory samples per step; ``None`` uses the training batch size (the
            released code's defaults: 10 incoming and 10 replayed).
    """

    purpose = "er_ace"

    def __init__(self, mem_size: Annotated[int, Field(ge=0)] = 200,
                 replay_batch_size: Annotated[int, Field(ge=1)] | None = None):
        super().__init__(mem_size, replay_batch_size)
        self.seen_classes = torch.zeros(0, dtype=torch.bool)  # class -> seen in an incoming batch

    def training_loss(self, ctx, x, y, logits, loss):
        objective = ctx.objective
        seen = self.see(y, logits.shape[1])
        loss = loss - objective.loss(logits, y) + incoming_loss(objective, logits, y)
        if len(self.pairs):
            inputs, targets, _ = self.memory_batch(ctx, logits.device)
            loss = loss + replay_loss(objective, objective.forward(ctx.model, inputs), targets, seen)
        self.remember()
        return loss

    def see(self, targets: torch.Tensor, width: int) -> torch.Tensor:
        """Add the batch's classes to those seen (on the batch's device, no host sync)."""
        seen = self.seen_classes.to(targets.device)
        if len(seen) < width:
            seen = torch.cat([seen, seen.new_zeros(width - len(seen))])
        seen[targets] = True
        self.seen_classes = seen
        return seen

    def state_dict(self):
        return {**super().state_dict(), "seen_classes": self.seen_classes.cpu().clone()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.seen_classes = state["seen_classes"].bool()
