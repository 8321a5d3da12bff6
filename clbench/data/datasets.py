"""Datasets and loaders shared by every stream.

:class:`ArrayDataset` holds a whole split as tensors and answers a *list* of indices with one
batch, so a loader built by :func:`make_loader` skips the per-sample ``__getitem__`` + collate
path. On small streams (the embedded digits) that path costs more than the model's step.
Datasets read from disk (images) are ordinary map-style datasets and get an ordinary loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import (BatchSampler, ConcatDataset, DataLoader, Dataset, RandomSampler, Sampler,
                              SequentialSampler, Subset)


class ArrayDataset(Dataset):
    """A split held in memory: ``x`` (N, ...) and integer labels ``y`` (N,).

    ``transform`` (optional) is applied to a whole batch tensor, so it must be batch-aware
    (elementwise ops, or torchvision v2 transforms that accept a leading batch dimension).
    """

    batched = True

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform: Callable | None = None):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        self.x = x
        self.y = y.long()
        self.transform = transform

    @property
    def targets(self) -> list[int]:
        return self.y.tolist()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index):
        if isinstance(index, (list, tuple)):
            index = torch.as_tensor(index, dtype=torch.long)
        x = self.x[index]
        if self.transform is not None:
            x = self.transform(x)
        return x, self.y[index]

    def subset(self, indices) -> "ArrayDataset":
        indices = torch.as_tensor(indices, dtype=torch.long)
        return ArrayDataset(self.x[indices], self.y[indices], self.transform)


def targets_of(dataset: Dataset) -> torch.Tensor:
    """Integer labels of every sample, without loading inputs where the dataset allows it."""
    if isinstance(dataset, ArrayDataset):
        return dataset.y
    if isinstance(dataset, Subset):
        return targets_of(dataset.dataset)[torch.as_tensor(dataset.indices, dtype=torch.long)]
    if isinstance(dataset, ConcatDataset):
        return torch.cat([targets_of(d) for d in dataset.datasets])
    targets = getattr(dataset, "targets", None)
    if isinstance(targets, torch.Tensor):
        return targets.long()
    if targets is not None:
        import numpy as np

        return torch.as_tensor(np.asarray(targets), dtype=torch.long)
    return torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))], dtype=torch.long)


def subset(dataset: Dataset, indices: Sequence[int]) -> Dataset:
    if isinstance(dataset, ArrayDataset):
        return dataset.subset(indices)
    return Subset(dataset, list(map(int, indices)))


def concat(datasets: Sequence[Dataset]) -> Dataset:
    """One dataset from several; in-memory splits stay in memory (and batched)."""
    datasets = [d for d in datasets if len(d) > 0]
    if not datasets:
        raise ValueError("nothing to concatenate")
    if len(datasets) == 1:
        return datasets[0]
    if all(isinstance(d, ArrayDataset) for d in datasets) and len({id(d.transform) for d in datasets}) == 1:
        return ArrayDataset(torch.cat([d.x for d in datasets]), torch.cat([d.y for d in datasets]),
                            datasets[0].transform)
    return ConcatDataset(datasets)


class _Batches(BatchSampler):
    """A BatchSampler that forwards ``set_epoch`` to its sampler (Lightning calls it on the
    loader's ``sampler`` once per epoch; a distributed sampler needs it to reshuffle)."""

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


class ShardedSampler(Sampler):
    """Rank ``rank``'s share of what ``sampler`` yields in one process: items ``rank``,
    ``rank + world``, ... of its sequence (padded by wrapping around to a multiple of ``world``).

    Per-rank batch k of ``b`` items is then exactly the single-process batch k of ``world * b``
    items, split among the ranks, in every epoch: the inner sampler (and its generator) runs
    as it would in one process. It is read lazily, ``world`` items per item yielded, so it is
    left exactly where one process's loader leaves it (a ``RandomSampler`` draws a second
    permutation only when read to its end, which a loader of known length may never do).
    ``DistributedSampler`` instead reseeds a permutation per epoch, an order no single-process
    run follows.
    """

    def __init__(self, sampler, num_replicas: int, rank: int):
        self.sampler, self.num_replicas, self.rank = sampler, num_replicas, rank

    def __iter__(self):
        import itertools

        items, head = iter(self.sampler), None
        while True:
            chunk = list(itertools.islice(items, self.num_replicas))
            if not chunk:
                return
            head = chunk if head is None else head
            if len(chunk) < self.num_replicas:  # pad from the start, as DistributedSampler does
                chunk += (head * self.num_replicas)[: self.num_replicas - len(chunk)]
            yield chunk[self.rank]

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.num_replicas)


@dataclass
class Padding:
    """A test batch evaluated only to keep step with the other ranks;
    :class:`clbench.engine.module.ContinualModule` runs its forwards and keeps nothing of them."""

    batch: Any


class LockstepLoader:
    """An evaluation shard's loader, lengthened with :class:`Padding` batches to ``batches``,
    the batch count of the largest shard, so that every rank evaluates as many batches: with
    sharded parameters every forward is a collective, and a rank left without test samples (a
    test set smaller than the number of processes) would otherwise skip the evaluation and
    never join the metrics' synchronisation. Evaluation shards differ by at most one sample, so
    at most one padding batch, a one-sample batch of the test set's first item, is added; no
    test sample is scored twice."""

    def __init__(self, loader: DataLoader, batches: int, filler: Callable[[], Any]):
        self.loader, self.batches, self.filler = loader, batches, filler

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        n = 0
        for batch in self.loader:
            n += 1
            yield batch
        for _ in range(self.batches - n):
            yield Padding(self.filler())


def shard_of(loader) -> tuple[int, int]:
    """``(world, rank)`` of a loader sharded by :class:`ShardedSampler`; ``(1, 0)`` otherwise."""
    sampler = getattr(loader, "sampler", None)
    sampler = getattr(sampler, "sampler", sampler) if isinstance(sampler, BatchSampler) else sampler
    if isinstance(sampler, ShardedSampler):
        return sampler.num_replicas, sampler.rank
    return 1, 0


def _first_two(item):
    """Avalanche classification datasets yield (x, y, task_label); the harness uses (x, y).
    Items of other shapes (text records as mappings) pass unchanged."""
    if isinstance(item, (tuple, list)) and len(item) > 2:
        return item[0], item[1]
    return item


def make_loader(dataset: Dataset, batch_size: int, *, shuffle: bool, seed: int | None = None,
                num_workers: int = 0, sampler=None, pin_memory: bool = False,
                persistent_workers: bool | None = None, collate_fn: Callable | None = None) -> DataLoader:
    """A DataLoader whose shuffling is driven by its own seeded generator (reproducible, and
    independent of how much global randomness the model or strategy consumed).

    ``collate_fn`` (the objective's, e.g. tokenising text) applies to per-sample datasets;
    batched in-memory datasets already yield whole batches."""
    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    persistent = num_workers > 0 if persistent_workers is None else (persistent_workers and num_workers > 0)
    kwargs = dict(num_workers=num_workers, pin_memory=pin_memory, persistent_workers=persistent)
    if getattr(dataset, "batched", False):
        if sampler is None:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        return DataLoader(dataset, sampler=_Batches(sampler, batch_size, drop_last=False),
                          batch_size=None, **kwargs)
    if sampler is None and shuffle:
        sampler = RandomSampler(dataset, generator=generator)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False if sampler else shuffle,
                        collate_fn=collate_fn, **kwargs)
    return loader


def unwrap(dataset: Dataset) -> Dataset:
    """The dataset an experience's Avalanche dataset reads, as plainly as it can be read.

    Avalanche 0.6 keeps subsets and transforms in a chain of ``FlatData`` nodes (each with its
    own ``_indices`` and transform groups). Where the chain only selects samples of one plain
    dataset, that dataset (or its subset) is returned, so an in-memory split stays batched.
    Anything else (a transform, a label remapping, a concatenation) is read through Avalanche's
    own ``__getitem__``, so the harness sees exactly what Avalanche code would.
    """
    plain = _plain_source(dataset)
    if plain is None:
        return _AvalancheView(dataset)
    leaf, indices = plain
    return leaf if indices is None else subset(leaf, indices)


def _plain_source(dataset) -> tuple[Dataset, list[int] | None] | None:
    """``(leaf, indices)`` when reading ``dataset`` is reading ``leaf`` (at ``indices``, or
    whole when None) unchanged but for the task label; None otherwise."""
    node = getattr(dataset, "_flat_data", None)
    if node is None:
        return None
    from avalanche.benchmarks.utils.flat_data import FlatData

    group = getattr(getattr(node, "_transform_groups", None), "current_group", "train")
    indices: list[int] | None = None
    while isinstance(node, FlatData):
        if len(node._datasets) != 1:
            return None
        for groups in (getattr(node, "_transform_groups", None), getattr(node, "_frozen_transform_groups", None)):
            try:  # indexing, not .get(): a group applying one transform to all is a defaultdict
                if groups is not None and not _is_identity(groups[group]):
                    return None
            except KeyError:
                return None
        if node._indices is not None:
            own = list(node._indices)
            indices = own if indices is None else [own[i] for i in indices]
        node = node._datasets[0]
    if hasattr(node, "_flat_data"):  # a nested Avalanche dataset appends its own attributes
        return None
    return node, indices


def _is_identity(transform) -> bool:
    """Whether an Avalanche transform (None, or a composition of Nones) changes nothing."""
    if transform is None:
        return True
    parts = getattr(transform, "transforms", None)
    return isinstance(parts, (list, tuple)) and all(_is_identity(t) for t in parts)


class _AvalancheView(Dataset):
    """(x, y) view of an Avalanche dataset that yields (x, y, t)."""

    def __init__(self, dataset):
        self.dataset = dataset

    @property
    def targets(self):
        targets = getattr(self.dataset, "targets", None)
        if targets is None:  # not a classification dataset: labels are read from the items
            raise AttributeError("targets")
        return list(targets)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return _first_two(self.dataset[i])


def run_loader(cfg: dict, dataset, *, shuffle: bool, seed: int | None = None, batch_size: int | None = None,
               world_size: int = 1, rank: int = 0, lengths: list[int] | None = None, **kw):
    """The loader a run uses for ``dataset`` (training when ``shuffle``), from the config's ``train:``.

    Under data parallelism each rank reads its own shard, sharded here rather than by Lightning
    (``use_distributed_sampler=False``). ``batch_size`` is per process, so a step's global batch
    is ``world_size`` times it. Training shards split the single-process order
    (:class:`ShardedSampler` over the same seeded ``RandomSampler``): with equal shards, W
    processes at batch b take the steps one process takes at batch W·b. Evaluation shards are
    items ``rank, rank + W, ...`` of the test set (what Lightning's ``UnrepeatedDistributedSampler``
    yields unshuffled, but without its refusal of an empty shard: a test set smaller than W
    leaves some ranks none), never padded with samples, so no test sample is counted twice when
    the per-rank metric states are summed; every shard's loader is lengthened to the same number
    of batches with batches that count nothing (:class:`LockstepLoader`). ``lengths`` (each
    sample's, ``train.group_by_length``): training batches of near-equal lengths
    (:func:`training_order`).
    """
    train = cfg["train"]
    bs = batch_size or (train["batch_size"] if shuffle else train["eval_batch_size"])
    lockstep = world_size > 1 and not shuffle and "sampler" not in kw
    if shuffle and "sampler" not in kw and (world_size > 1 or lengths is not None):
        order = training_order(dataset, bs * world_size, seed, lengths)
        kw["sampler"] = ShardedSampler(order, world_size, rank) if world_size > 1 else order
    elif world_size > 1 and "sampler" not in kw:
        kw["sampler"] = range(rank, len(dataset), world_size)
    pin = torch.cuda.is_available() and cfg["trainer"].get("accelerator") != "cpu"
    # Evaluation loaders do not keep workers alive: with one loader per test experience,
    # persistent workers would hold T x num_workers processes between evaluations.
    kw.setdefault("persistent_workers", shuffle)
    loader = make_loader(dataset, bs, shuffle=shuffle, seed=seed, num_workers=train["num_workers"], pin_memory=pin,
                         **kw)
    if not lockstep:
        return loader
    collate = kw.get("collate_fn")
    batches = -(-(-(-len(dataset) // world_size)) // bs)  # of the largest shard: ceil(ceil(n / w) / b)
    return LockstepLoader(loader, batches, lambda: next(iter(make_loader(subset(dataset, [0]), 1, shuffle=False,
                                                                         collate_fn=collate))))


def training_order(dataset, batch_size: int, seed: int | None, lengths: list[int] | None = None) -> Sampler:
    """The order one process trains on ``dataset`` in, batch after batch of ``batch_size``: a seeded
    shuffle, or with ``lengths``, transformers' ``LengthGroupedSampler`` (shuffled, cut into runs of
    a quarter of the batches, at least 1 and at most 50, each run sorted by length, longest
    first, so a batch pads little; the longest batch comes first, so a batch too large for the
    memory fails at the first step)."""
    generator = torch.Generator().manual_seed(seed if seed is not None else 0)
    if lengths is None:
        return RandomSampler(dataset, generator=generator)
    if len(lengths) != len(dataset):
        raise ValueError(f"{len(lengths)} lengths for {len(dataset)} samples")
    from transformers.trainer_pt_utils import LengthGroupedSampler

    return LengthGroupedSampler(batch_size, lengths=lengths, generator=generator)
