"""Experience Replay (ER) with a fixed-size episodic memory.

Chaudhry et al. 2019, "On Tiny Episodic Memories in Continual Learning" (arXiv:1902.10486);
Rolnick et al. 2019, "Experience Replay for Continual Learning". Every training step uses the
current mini-batch concatenated with a mini-batch drawn from the memory, and minimises the
cross-entropy over the union (one gradient step on both).

Memory: ``mem_size`` slots holding (experience position, sample index) pairs, filled after each
experience so that it only ever holds past data (the memory is empty while training the first
experience, which therefore trains as naive). Policies:

* ``reservoir``: a uniform sample of every training sample seen so far (Vitter's Algorithm R,
  the paper's main variant). Each experience's samples are streamed through the reservoir in index
  order with a generator seeded from the run seed and the experience position, so the memory is
  identical on every rank and across resumes.
* ``class_balanced``: the slots are shared equally among the classes seen so far (water-filled:
  a class with fewer samples than its share keeps them all and the rest is shared among the
  others; a remainder slot goes to the lowest class ids), and each class keeps a reservoir
  sample of its own samples. The paper's class-balanced memory is a per-class FIFO ring
  buffer; a per-class reservoir is used instead so that the kept samples are a uniform draw
  from the whole class, not the most recent ones. (When a class's quota grows, because another
  class turned out to have fewer samples than its share, the freed slots take the class's next
  incoming samples; its earlier samples that were dropped cannot come back.)

Memory batches are sampled with replacement, as many per epoch as the current loader has
batches (Lightning ``CombinedLoader`` in ``min_size`` mode). Samples come from
``experience.train``, so the stream's training transform (augmentation) applies to them too.

Data parallelism: the memory is one global buffer, the same on every rank; each step's memory
draws are split among the ranks like the current batch (:func:`with_memory`), so W processes
at batch b replay what one process at batch W·b replays. ``replay_batch_size`` is per process,
like ``train.batch_size``.
"""

from __future__ import annotations

from typing import Annotated, Callable, Literal

import torch
from pydantic import Field
from torch.utils.data import WeightedRandomSampler

from clbench import ArgumentError, Strategy, derive_seed
from clbench.data.datasets import ShardedSampler, concat, shard_of, subset, targets_of


def seeded_generator(seed: int, *keys: object) -> torch.Generator:
    """A CPU generator seeded from the strategy seed and a purpose (the same on every rank)."""
    return torch.Generator().manual_seed(derive_seed(seed, *keys))


def reservoir_update(buffer: torch.Tensor, seen: int, new: torch.Tensor, capacity: int,
                     generator: torch.Generator) -> torch.Tensor:
    """Stream the rows of ``new`` through reservoir sampling into ``buffer``.

    ``buffer`` must hold a uniform sample of size ``min(capacity, seen)`` of the ``seen`` rows
    streamed before; the result is then a uniform sample of size ``min(capacity, seen +
    len(new))`` of all of them (each row kept with probability capacity / total). Algorithm R
    draws, for the row preceded by ``t`` rows, a slot ``j`` uniform in ``[0, t]`` and writes the
    row there if ``j < capacity``; the final content of a slot is the last row written to it,
    so all draws are made at once and each slot takes its latest writer (a scatter max).
    """
    head = new[: max(capacity - len(buffer), 0)]
    buffer = torch.cat([buffer, head])
    tail = new[len(head):]
    if len(tail) == 0 or capacity == 0:
        return buffer
    before = float(seen + len(head)) + torch.arange(len(tail), dtype=torch.float64)
    slot = (torch.rand(len(tail), dtype=torch.float64, generator=generator) * (before + 1)).long()
    write = slot < capacity
    order = torch.arange(len(tail))
    last = torch.full((capacity,), -1, dtype=torch.long).scatter_reduce(0, slot[write], order[write], reduce="amax")
    hit = last >= 0
    buffer = buffer.clone()
    buffer[hit] = tail[last[hit]]
    return buffer


def balanced_quotas(capacity: int, available: dict[int, int]) -> dict[int, int]:
    """Equal slots per class, capped by what each class has; leftovers go to the others."""
    quotas: dict[int, int] = {}
    remaining = capacity
    open_classes = sorted(c for c, n in available.items() if n > 0)
    while open_classes:
        share, extra = divmod(remaining, len(open_classes))
        small = [c for c in open_classes if available[c] <= share]
        if not small:
            for i, c in enumerate(open_classes):
                quotas[c] = share + (1 if i < extra else 0)
            break
        for c in small:
            quotas[c] = available[c]
            remaining -= available[c]
        open_classes = [c for c in open_classes if c not in small]
    return quotas


def memory_dataset(experiences, pairs: torch.Tensor):
    """The samples named by (experience position, sample index) rows, as one dataset."""
    parts = []
    for position in torch.unique(pairs[:, 0]).tolist():
        rows = pairs[pairs[:, 0] == position, 1]
        parts.append(subset(experiences[position].train, rows.tolist()))
    return concat(parts)


def loader_batch_size(loader) -> int:
    """The batch size of a loader from ``make_loader`` (batched datasets use a batch sampler)."""
    if loader.batch_size is not None:
        return loader.batch_size
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    return sampler.batch_size


def with_memory(current, memory, make_loader: Callable, batch_size: int, generator: torch.Generator,
                shard: bool = True):
    """``current`` paired step by step with batches drawn with replacement from ``memory``.

    The memory sampler draws uniformly with replacement from a generator seeded identically on
    every rank. Under data parallelism (``current`` sharded by :class:`ShardedSampler`) the draws
    are sharded like the current data: the W ranks draw the sequence one process would draw
    at batch W·``batch_size`` and each takes its share of every memory batch, so a step sees
    the memory batch of the equivalent single-process step, not W copies of one small batch.
    With ``shard=False`` every rank gets the whole memory batch instead (A-GEM's reference batch).
    """
    from lightning.pytorch.utilities import CombinedLoader

    world, rank = shard_of(current) if shard else (1, 0)
    sampler = WeightedRandomSampler(torch.ones(len(memory), dtype=torch.double), len(current) * batch_size * world,
                                    replacement=True, generator=generator)
    if world > 1:
        sampler = ShardedSampler(sampler, world, rank)
    memory_loader = make_loader(memory, batch_size=batch_size, sampler=sampler)
    return CombinedLoader({"current": current, "memory": memory_loader}, mode="min_size")


class Replay(Strategy):
    """Experience Replay.

    Args:
        mem_size: memory slots in total (samples, not per class or experience). Default 200,
            the digits streams' leaderboard budget; the paper sweeps 1-5 samples per class.
        policy: ``reservoir`` (the paper's main variant) or ``class_balanced``.
        replay_batch_size: memory samples per step; ``None`` uses the training batch size
            (the paper concatenates two mini-batches of equal size).
    """

    supports_sharded = True  # touches data only, never parameters

    supports_distributed = True  # one global memory on every rank; its draws are sharded like the data

    def __init__(self, mem_size: Annotated[int, Field(ge=0)] = 200,
                 policy: Literal["reservoir", "class_balanced"] = "reservoir",
                 replay_batch_size: Annotated[int, Field(ge=1)] | None = None):
        super().__init__()
        self.mem_size = mem_size
        self.policy = policy
        self.replay_batch_size = replay_batch_size
        self.buffer = torch.zeros((0, 2), dtype=torch.long)  # (experience position, sample index)
        self.labels = torch.zeros(0, dtype=torch.long)
        self.seen = 0                                         # training samples streamed so far
        self.class_seen: dict[int, int] = {}                  # per class (class_balanced)
        self._position = 0

    def before_experience(self, ctx, experience):
        self._position = experience.position

    def train_loader(self, ctx, dataset, make_loader):
        current = make_loader(dataset)
        if len(self.buffer) == 0:
            return current
        batch_size = self.replay_batch_size or loader_batch_size(current)
        return with_memory(current, memory_dataset(self.experiences, self.buffer), make_loader, batch_size,
                           seeded_generator(self.seed, "replay-loader", self._position))

    def prepare_batch(self, ctx, batch):
        objective = ctx.objective
        if isinstance(batch, dict) and set(batch) == {"current", "memory"}:
            return objective.join([objective.split(batch["current"]), objective.split(batch["memory"])])
        return objective.split(batch)

    def after_experience(self, ctx, experience):
        labels = self._labels(experience)
        new = torch.stack([torch.full((len(labels),), experience.position, dtype=torch.long),
                           torch.arange(len(labels))], dim=1)
        generator = seeded_generator(self.seed, "replay-buffer", experience.position)
        if self.policy == "reservoir":
            rows = torch.cat([self.buffer, new])
            all_labels = torch.cat([self.labels, labels])
            picked = reservoir_update(torch.arange(len(self.buffer)), self.seen,
                                      torch.arange(len(self.buffer), len(rows)), self.mem_size, generator)
        else:
            rows, all_labels, picked = self._class_balanced(new, labels, generator)
        self.buffer, self.labels = rows[picked], all_labels[picked]
        self.seen += len(labels)

    def _labels(self, experience) -> torch.Tensor:
        """Class labels of the experience's samples; the reservoir needs only their number
        (-1 each), so streams without labels (text records) replay with it."""
        if self.policy == "reservoir":
            return torch.full((len(experience.train),), -1, dtype=torch.long)
        try:
            return targets_of(experience.train).long().cpu()
        except (KeyError, IndexError, TypeError, ValueError):
            raise ArgumentError("strategy", "policy", "class-balanced replay needs class labels, and the samples "
                                f"of '{experience.name}' have none",
                                fix="use policy: reservoir for this stream") from None

    def _class_balanced(self, new, labels, generator):
        """Shrink each class to its new quota (a uniform subsample stays uniform), then stream
        the experience's samples of that class through the class's reservoir."""
        rows = torch.cat([self.buffer, new])
        all_labels = torch.cat([self.labels, labels])
        before = dict(self.class_seen)
        classes, counts = torch.unique(labels, return_counts=True)
        for c, n in zip(classes.tolist(), counts.tolist()):
            self.class_seen[c] = self.class_seen.get(c, 0) + n
        quotas = balanced_quotas(self.mem_size, self.class_seen)
        offset = len(self.buffer)
        picked = []
        for c in sorted(self.class_seen):
            kept = torch.nonzero(self.labels == c).flatten()
            if len(kept) > quotas[c]:
                kept = kept[torch.randperm(len(kept), generator=generator)[: quotas[c]]]
            incoming = offset + torch.nonzero(labels == c).flatten()
            picked.append(reservoir_update(kept, before.get(c, 0), incoming, quotas[c], generator))
        return rows, all_labels, torch.cat(picked) if picked else torch.zeros(0, dtype=torch.long)

    def state_dict(self):
        return {"buffer": self.buffer.clone(), "labels": self.labels.clone(), "seen": self.seen,
                "class_seen": dict(self.class_seen)}

    def load_state_dict(self, state):
        self.buffer = state["buffer"].long()
        self.labels = state["labels"].long()
        self.seen = int(state["seen"])
        self.class_seen = {int(c): int(n) for c, n in state["class_seen"].items()}
