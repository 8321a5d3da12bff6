"""The composition each token of a routing record is labelled with, for MH-MoE's N_eff.

A token's composition is (task, relative-position bucket, token-frequency bucket):
:data:`POSITION_BUCKETS` equal quarters of its sequence, and :data:`FREQUENCY_BUCKETS` classes of
token ids holding equal thirds of the token occurrences in the stream's training records (at most
:data:`FREQUENCY_SAMPLES` per task, in dataset order), rarest last. The task is the column the
record belongs to. What is recorded, and why, is the causal-LM objective's to say (its module
notes, "Routing records").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from clbench.objectives.text_batches import prompt_and_answer

POSITION_BUCKETS = 4
FREQUENCY_BUCKETS = 3
FREQUENCY_SAMPLES = 2000


def frequency_buckets(tokenizer: Any, experiences: list) -> Tensor:
    """Token id -> frequency bucket (0 = most frequent), from the experiences' training records."""
    import numpy as np

    counts = np.zeros(len(tokenizer), dtype=np.int64)
    for exp in experiences:
        data = exp.train
        for i in range(min(len(data), FREQUENCY_SAMPLES)):
            prompt, answer = prompt_and_answer(data[i])
            ids = tokenizer(prompt + answer, add_special_tokens=False)["input_ids"]
            counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=len(counts))[: len(counts)]
    order = np.argsort(-counts, kind="stable")
    share = np.cumsum(counts[order]) / max(1, counts.sum())
    buckets = np.empty(len(counts), dtype=np.int64)
    buckets[order] = np.minimum((share * FREQUENCY_BUCKETS).astype(np.int64), FREQUENCY_BUCKETS - 1)
    buckets[counts == 0] = FREQUENCY_BUCKETS - 1
    return torch.from_numpy(buckets)


def token_labels(ids: Tensor, mask: Tensor, buckets: Tensor) -> Tensor:
    """``(batch, length, 2)``: each token's position bucket within its row's real tokens (``mask``)
    and its frequency bucket (``buckets``, from :func:`frequency_buckets`)."""
    position = (mask.cumsum(1) - 1).clamp(min=0)
    length = mask.sum(1, keepdim=True).clamp(min=1)
    return torch.stack([position * POSITION_BUCKETS // length,
                        buckets[ids.cpu().clamp(max=len(buckets) - 1)].to(ids.device)], -1)
