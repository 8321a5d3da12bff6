"""GDumb: Greedy Sampler and Dumb Learner.

Prabhu, Torr & Dokania 2020, "GDumb: A Simple Approach that Questions Our Progress in Continual
Learning" (ECCV). Two parts, neither of which looks at the task structure:

* Greedy class-balanced sampler (the paper's Algorithm 1). Samples stream into a memory of
  ``mem_size`` items. While it has room, every sample is stored. Once it is full, a sample of
  class y is stored only if y holds fewer than ``mem_size / |Y|`` items (|Y|: the classes seen
  so far, y included); a random item of the largest class is then evicted to make room. A new
  class therefore always gets in, and the memory stays balanced over the classes seen.
* Dumb learner: at every experience the model is reset to its initial weights and trained on
  the memory alone (the current experience's samples reach training only through the memory).

Choices where the harness differs from the paper's setting:

* Order: each experience's training samples are offered to the sampler in a random order drawn
  from a generator seeded with the run seed and the experience position (the paper processes the
  stream as it arrives); largest-class ties are broken, like the evicted item, by that generator.
* Initial weights: the model's weights when the first experience starts (after pretraining, when
  the run has one), buffers included. The paper trains from scratch; a harness run starts from
  the seeded initial model, so resetting to it is training from scratch with the run's seed.
  They are kept in the strategy state (one copy of the model), so a resumed run resets to the
  same weights.
* Optimisation: the run's configured optimizer and epochs, applied to the memory at each
  experience. The paper trains with SGD under cosine annealing with warm restarts, cutmix
  augmentation and gradient clipping; those are the learner's recipe, not the method, and the
  harness's optimizer and epochs are the suite's, shared by every strategy it compares.
* Task-IL: the paper masks the logits of the sample's task at inference; the classification
  objective already does so on a task-incremental stream, in training and at test.
* Memory as (experience position, sample index) pairs into the stream's training splits, read
  through ``experience.train`` (its training transform applies).
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field

from clbench import ArgumentError, Strategy
from clbench.data.datasets import targets_of
from clbench.strategies.replay import memory_dataset, seeded_generator


class BalancedMemory:
    """GDumb's greedy class-balanced memory of ``capacity`` items (each an (experience, index) pair)."""

    def __init__(self, capacity: int, items: torch.Tensor, labels: torch.Tensor, seen: list[int]):
        self.capacity = capacity
        self.items = [tuple(p) for p in items.tolist()]
        self.labels = [int(y) for y in labels.tolist()]
        self.seen = set(int(c) for c in seen)
        self.slots: dict[int, list[int]] = {}  # class -> its slots, in slot order at the start
        for slot, y in enumerate(self.labels):
            self.slots.setdefault(y, []).append(slot)

    def offer(self, item: tuple[int, int], label: int, generator: torch.Generator) -> int | None:
        """Store ``item`` if the sampler takes it; returns the slot it evicted (None: none, or not stored)."""
        self.seen.add(label)
        mine = self.slots.setdefault(label, [])
        if len(self.items) < self.capacity:
            mine.append(len(self.items))
            self.items.append(item)
            self.labels.append(label)
            return None
        if len(mine) >= self.capacity / len(self.seen):
            return None
        largest = max(len(s) for s in self.slots.values())
        tied = [c for c in sorted(self.slots) if len(self.slots[c]) == largest]
        candidates = [slot for c in tied for slot in self.slots[c]]  # uniform over the tied classes' items
        slot = candidates[int(torch.randint(len(candidates), (1,), generator=generator))]
        self.slots[self.labels[slot]].remove(slot)
        self.items[slot], self.labels[slot] = item, label
        mine.append(slot)
        return slot

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        items = torch.tensor(self.items, dtype=torch.long).reshape(-1, 2)
        return items, torch.tensor(self.labels, dtype=torch.long)


class GDumb(Strategy):
    """GDumb.

    Args:
        mem_size: items in the memory, over all classes. Default 200, our choice: ``replay``'s
            default, so the two compare at equal memory (the paper evaluates several budgets per
            dataset, those of the methods it compares with).
    """

    requires = frozenset({"classification"})  # the sampler balances class labels
    # DDP: the memory is built from the same seeded generator on every rank, the reset loads
    # the same weights everywhere, and training reads the memory through the run's sharded loader.
    supports_distributed = True

    def __init__(self, mem_size: Annotated[int, Field(ge=1)] = 200):
        super().__init__()
        self.mem_size = mem_size
        self.memory = torch.zeros((0, 2), dtype=torch.long)  # (experience position, sample index)
        self.labels = torch.zeros(0, dtype=torch.long)
        self.seen_classes: list[int] = []
        self.initial: dict[str, torch.Tensor] | None = None  # the weights every experience starts from

    def before_experience(self, ctx, experience):
        if self.initial is None:
            self.initial = {k: v.detach().cpu().clone() for k, v in ctx.model.state_dict().items()}
        else:
            ctx.model.load_state_dict(self.initial)
        self.add(experience)

    def add(self, experience) -> None:
        """Offer the experience's training samples to the sampler, in a seeded random order."""
        try:
            labels = targets_of(experience.train).long().cpu()
        except (KeyError, IndexError, TypeError, ValueError):
            raise ArgumentError("strategy", "", f"GDumb balances classes, and the samples of '{experience.name}' "
                                "have no class labels", fix="use a classification stream") from None
        memory = BalancedMemory(self.mem_size, self.memory, self.labels, self.seen_classes)
        generator = seeded_generator(self.seed, "gdumb-sampler", experience.position)
        order = torch.randperm(len(labels), generator=generator).tolist()
        for i, y in zip(order, labels[order].tolist()):
            memory.offer((experience.position, i), y, generator)
        self.memory, self.labels = memory.tensors()
        self.seen_classes = sorted(memory.seen)

    def train_dataset(self, experience):
        return memory_dataset(self.experiences, self.memory)

    def state_dict(self):
        return {"memory": self.memory.clone(), "labels": self.labels.clone(), "seen_classes": list(self.seen_classes),
                "initial": None if self.initial is None else {k: v.clone() for k, v in self.initial.items()}}

    def load_state_dict(self, state):
        self.memory = state["memory"].long()
        self.labels = state["labels"].long()
        self.seen_classes = [int(c) for c in state["seen_classes"]]
        self.initial = None if state.get("initial") is None else dict(state["initial"])
