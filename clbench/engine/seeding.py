"""Seeds derived from the run seed, one per purpose and stage.

Every random choice in a run draws from a generator seeded by ``derive(seed, purpose, stage)``,
re-seeded at the start of each stage. A stage therefore does not depend on how much randomness
earlier stages consumed, which is what makes a resumed run identical to an uninterrupted one
and lets a strategy add or drop a random draw without shifting everything after it.
"""

from __future__ import annotations

import hashlib


def derive(seed: int, *keys: object) -> int:
    """A 31-bit seed from ``seed`` and any keys (stable across processes and platforms)."""
    text = ":".join(str(k) for k in (seed, *keys))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch global generators."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
