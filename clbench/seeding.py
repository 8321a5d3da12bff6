"""Seeds derived from the run seed, one per purpose and stage.

Every random choice in a run draws from a generator seeded by ``derive(seed, purpose, stage)``,
re-seeded at the start of each stage. A stage therefore does not depend on how much randomness
earlier stages consumed, which is what makes a resumed run identical to an uninterrupted one
and lets a strategy add or drop a random draw without shifting everything after it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def derive(seed: int, *keys: object) -> int:
    """A 31-bit seed from ``seed`` and any keys (stable across processes and platforms)."""
    text = ":".join(str(k) for k in (seed, *keys))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch global generators.

    Not Lightning's ``seed_everything``, which seeds the same three but also exports
    ``PL_GLOBAL_SEED``: Lightning's DDP set-up reads that variable back and re-seeds the global
    generators when a Trainer starts its processes, which would undo a stage's own seeding
    in the middle of it (a reference model's Trainer starts after its stage was seeded)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class Seeds:
    """The run's seed protocol: the generators each part of a run draws from, named once.

    The run, its reference models and its pretraining all seed through this, so a reference
    model starts from the run's initial weights and trains on the run's batches in the run's
    order (:mod:`clbench.engine.reference`)."""

    seed: int

    def build(self) -> None:
        """Before the stream and the strategy are built."""
        seed_all(derive(self.seed, "build"))

    def model(self) -> None:
        """Before the model is built: the run's and every reference model's initial weights."""
        seed_all(derive(self.seed, "model"))

    def strategy(self) -> int:
        """The strategy's own seed (:meth:`clbench.strategy.Strategy.setup`)."""
        return derive(self.seed, "strategy")

    def train(self, stage: object) -> None:
        """Before stage ``stage`` trains (an experience's position, or ``"pretrain"``)."""
        seed_all(derive(self.seed, "pretrain") if stage == "pretrain" else derive(self.seed, "train", stage))

    def loader(self, stage: object) -> int:
        """The shuffling seed of stage ``stage``'s training loader."""
        return derive(self.seed, "loader", stage)

    def held_out(self, experience: str) -> int:
        """Which samples of ``experience`` pretraining holds out (whatever the run order)."""
        return derive(self.seed, "pretrain-split", experience)
