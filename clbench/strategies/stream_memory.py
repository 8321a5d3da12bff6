"""The online episodic memory of DER++ and ER-ACE: a reservoir that every incoming batch passes through.

``replay`` fills its memory after each experience; the methods here fill it during training, as
their papers do (every batch of every epoch is streamed through reservoir sampling, so the first
experience already replays its own earlier batches). The memory is (experience position, sample
index) pairs into the stream's training splits, like ``replay``'s; a drawn sample is read again
through its split, so the training transform augments it afresh. Batches do not say which
samples they hold, so :meth:`StreamReplay.train_dataset` wraps the split (:class:`IndexedSplit`:
items read ``(x, y, index)``) and ``prepare_batch`` strips the index again. Reservoir and draws
use generators seeded from the run seed, the method and the experience position; checkpoints
fall between experiences, so the pairs and the count of samples seen are all a resume needs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, default_collate
from torch.utils._pytree import tree_map

from clbench import Strategy
from clbench.strategies.replay import loader_batch_size, reservoir_update, seeded_generator


class IndexedSplit(Dataset):
    """A training split whose items (or batches) also carry their sample indices: ``(x, y, index)``."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.batched = getattr(dataset, "batched", False)  # in-memory splits answer a list with a batch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        item = self.dataset[index]
        if isinstance(index, (list, tuple)):
            index = torch.as_tensor(index, dtype=torch.long)
        return item[0], item[1], index


def stream_into(pairs: torch.Tensor, seen: int, incoming: torch.Tensor, capacity: int,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One reservoir step over the rows of ``incoming``: ``(pairs after, slots written, rows)``.

    ``pairs[slots] = incoming[rows]``, the rest unchanged, so per-slot data kept beside the pairs
    (logits) is updated the same way.
    """
    old = len(pairs)
    picked = reservoir_update(torch.arange(old), seen, old + torch.arange(len(incoming)), capacity, generator)
    slots = torch.nonzero(picked >= old).flatten()
    rows = picked[slots] - old
    out = torch.cat([pairs, pairs.new_zeros((len(picked) - old, *pairs.shape[1:]))])
    out[slots] = incoming[rows]
    return out, slots, rows


def draw(filled: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """``min(size, filled)`` distinct slots, uniformly."""
    return torch.randperm(filled, generator=generator)[:size]


def fetch(experiences, pairs: torch.Tensor, objective) -> tuple[Any, Any, torch.Tensor]:
    """The samples named by (position, index) rows, read through their training splits (so the
    training transform applies), as ``(inputs, targets, order)``: batch row i is ``pairs[order[i]]``."""
    parts, order = [], []
    for position in torch.unique(pairs[:, 0]).tolist():
        rows = torch.nonzero(pairs[:, 0] == position).flatten()
        dataset, indices = experiences[position].train, pairs[rows, 1].tolist()
        if getattr(dataset, "batched", False):
            batch = dataset[indices]
        else:
            batch = (objective.collate(train=True) or default_collate)([dataset[i] for i in indices])
        parts.append(objective.split(batch))
        order.append(rows)
    inputs, targets = objective.join(parts) if len(parts) > 1 else parts[0]
    return inputs, targets, torch.cat(order)


class StreamReplay(Strategy):
    """A reservoir memory of (experience position, sample index) pairs that every incoming batch
    passes through during training (the online memory of DER++ and ER-ACE)."""

    requires = frozenset({"classification"})  # losses on class logits
    supports_distributed = False  # the reservoir sees one rank's shard (see the module docstring)
    purpose = "stream-replay"  # names the seeded generators

    def __init__(self, mem_size: int, replay_batch_size: int | None):
        super().__init__()
        self.mem_size = mem_size
        self.replay_batch_size = replay_batch_size
        self.pairs = torch.zeros((0, 2), dtype=torch.long)  # slot -> (experience position, sample index)
        self.seen = 0                                        # samples streamed through the reservoir
        self._position = 0
        self._batch_size = 1
        self._incoming: torch.Tensor | None = None
        self._reservoir = self._draws = torch.Generator()

    def before_experience(self, ctx, experience):
        self._position = experience.position
        self._reservoir = seeded_generator(self.seed, f"{self.purpose}-reservoir", experience.position)
        self._draws = seeded_generator(self.seed, f"{self.purpose}-draw", experience.position)

    def train_dataset(self, experience):
        return IndexedSplit(experience.train)

    def train_loader(self, ctx, dataset, make_loader):
        loader = make_loader(dataset)
        self._batch_size = self.replay_batch_size or loader_batch_size(loader)
        return loader

    def prepare_batch(self, ctx, batch):
        self._incoming = batch[-1]
        return ctx.objective.split(batch[:-1])

    def memory_batch(self, ctx, device) -> tuple[Any, Any, torch.Tensor]:
        """A fresh draw from the memory on ``device``: ``(inputs, targets, slots)``."""
        slots = draw(len(self.pairs), self._batch_size, self._draws)
        inputs, targets, order = fetch(self.experiences, self.pairs[slots], ctx.objective)

        def move(t):
            return t.to(device) if isinstance(t, torch.Tensor) else t

        return tree_map(move, inputs), tree_map(move, targets), slots[order]

    def remember(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Stream the current batch through the reservoir; ``(slots written, batch rows)``."""
        indices = self._incoming.detach().cpu().long()
        incoming = torch.stack([torch.full_like(indices, self._position), indices], dim=1)
        self.pairs, slots, rows = stream_into(self.pairs, self.seen, incoming, self.mem_size, self._reservoir)
        self.seen += len(indices)
        return slots, rows

    def state_dict(self):
        return {"pairs": self.pairs.clone(), "seen": self.seen}

    def load_state_dict(self, state):
        self.pairs = state["pairs"].long()
        self.seen = int(state["seen"])
