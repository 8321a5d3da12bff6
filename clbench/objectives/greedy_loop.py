"""Greedy decoding of one pooled batch in a loop of our own: each row stops at its own EOS or cap.

transformers' ``generate`` decodes a batch until its last row stops, and a stopped row keeps
its place: it is fed padding and computed like the others to the end. A pooled batch
(:mod:`~clbench.objectives.generation_pool`) therefore had to hold rows of one answer cap only,
and still paid for every row that reached EOS early. Here a batch may hold rows of every cap:

- **prefill by part**: the batch's rows (ordered by column, then by prompt length) are cut into
  parts of one column and near-equal lengths (:func:`length_buckets`), and each part is
  prefilled by its own forward, so a prompt is padded only to its part's longest rest. A
  column's shared instruction is prefilled once (one row) and its keys and values repeated to
  the column's rows, as before;
- **one cache**: the parts' KV caches are left-padded to one width and stacked (:func:`joined`);
  padding is masked and positions follow the mask, as ``generate`` derives them;
- **one loop**: each step feeds every live row its last token; a row that emits EOS or reaches
  its cap is dropped from the batch, its cache rows with it (``DynamicCache.batch_select_indices``),
  so no step computes a finished row.

Each step is what ``generate`` computes for a greedy, unprocessed decode: the model's forward
over the new token with the cache and the 2-D mask, the last position's logits in float32, their
argmax. :func:`loop_decodes` checks that the model's generation config adds nothing to that (a
repetition penalty, forced or suppressed tokens, beams) and that no hook changes its forward;
where either does, the objective decodes with ``generate``. What changes is which rows share a
matrix product, so a row's logits round differently than in a batch of other rows (as pooling
already did), and a near tie may flip: ``perf/lm_generation.py`` counts the rows whose text
differs from batch-by-batch decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from clbench.objectives.generation_pool import shared_span
from clbench.objectives.kv_cache import forward_hooked
from clbench.objectives.text_batches import left_padded

#: A forward's fixed cost, in prompt positions, when a column's rows are cut into length
#: buckets: a new part is worth it when it saves more padded positions than this. Our choice:
#: a forward over a few rows costs about a read of SmolLM2's weights on a CPU thread, some 20-30
#: positions' products there. Measured on the README run's pass (SmolLM2, fp32, one AVX2 thread,
#: 3 rounds interleaved): 15.3 s at 32, 16.4 s with one part a column, 18.5 s with one part
#: a length (cost 0), the same texts all three.
PART_COST = 32

# Generation-config fields that would make ``generate``'s greedy step other than an argmax of
# the logits, with the values that leave it one.
NEUTRAL = {"num_beams": (None, 1), "num_beam_groups": (None, 1), "repetition_penalty": (None, 1.0),
           "encoder_repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
           "encoder_no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,), "min_length": (None, 0),
           "min_new_tokens": (None, 0), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
           "exponential_decay_length_penalty": (None,), "suppress_tokens": (None,),
           "begin_suppress_tokens": (None,), "sequence_bias": (None,), "guidance_scale": (None, 1.0),
           "renormalize_logits": (None, False), "remove_invalid_values": (None, False),
           "watermarking_config": (None,), "stop_strings": (None,), "dola_layers": (None,),
           "prompt_lookup_num_tokens": (None,), "token_healing": (None, False)}


def keeps_logits(model: Any) -> bool:
    """Whether the transformers model inside ``model`` takes ``logits_to_keep``."""
    import inspect

    hf = getattr(model, "hf", model)
    return "logits_to_keep" in inspect.signature(hf.forward).parameters


def loop_decodes(model: Any) -> bool:
    """Whether this loop computes what ``generate(do_sample=False)`` computes on ``model``: no
    forward hook changes what its forward sees (MoSEs prepends its prompts,
    :func:`~clbench.objectives.kv_cache.forward_hooked`), its forward takes what the loop passes
    (``logits_to_keep``), its generation config sets none of the :data:`NEUTRAL` fields to
    another value, and its cache is a plain key/value cache in every layer (a sliding-window
    layer keeps only its last positions, which left-padding rows to one width would not
    respect)."""
    from transformers import DynamicCache

    hf = getattr(model, "hf", model)
    config = getattr(hf, "generation_config", None)
    if forward_hooked(model) or not keeps_logits(model) or config is None:
        return False
    if any(getattr(config, name, None) not in values for name, values in NEUTRAL.items()):
        return False
    layers = DynamicCache(config=getattr(hf, "config", None)).layers
    return all(type(layer).__name__ == "DynamicLayer" for layer in layers)


@dataclass
class Prefilled:
    """Rows after their prompt's forward: the cache, the mask over its positions, the logits
    of each row's last position (float32)."""

    cache: Any
    mask: Tensor
    logits: Tensor


def length_buckets(lengths: list[int], cost: int = PART_COST) -> list[int]:
    """Where to cut rows sorted by length into parts: the ends of the parts (exclusive) that
    minimise the positions prefilled (a part's rows padded to its last, the longest) plus
    ``cost`` per part."""
    n = len(lengths)
    best = [0] + [None] * n  # best[j]: the cheapest cut of the first j rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            total = best[i] + (j - i) * lengths[j - 1] + cost
            if best[j] is None or total < best[j]:
                best[j], cut[j] = total, i
    ends, j = [], n
    while j:
        ends.append(j)
        j = cut[j]
    return ends[::-1]


def prefill(model: Any, rows: list[Tensor], pad_id: int, prefix: Any = None, shared: int = 0) -> Prefilled:
    """One forward over ``rows`` laid out as [shared prefix | left-padded rest]; ``prefix``, the
    cache of the first ``shared`` tokens (one row), is repeated to every row first."""
    from transformers import DynamicCache

    config = getattr(model, "config", None)
    if prefix is None:
        cache = DynamicCache(config=config)
    else:
        cache = DynamicCache(ddp_cache_data=[(layer.keys.expand(len(rows), -1, -1, -1).contiguous(),
                                              layer.values.expand(len(rows), -1, -1, -1).contiguous())
                                             for layer in prefix.layers], config=config)
    ids, mask = left_padded([r[shared:] for r in rows], pad_id)
    mask = torch.cat([mask.new_ones((len(rows), shared)), mask], 1)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, shared:]
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                logits_to_keep=1)
    return Prefilled(cache, mask, out.logits[:, -1].to(dtype=torch.float32, copy=True))


def joined(parts: list[Prefilled], config: Any = None) -> Prefilled:
    """The parts' rows in one cache: each part's keys, values and mask left-padded to the widest."""
    from transformers import DynamicCache

    if len(parts) == 1:
        return parts[0]
    width = max(p.mask.shape[1] for p in parts)

    def stacked(tensors: list[Tensor], dim: int) -> Tensor:
        return torch.cat([F.pad(t, (0, 0) * (t.dim() - 1 - dim) + (width - t.shape[dim], 0)) for t in tensors])

    layers = [(stacked([p.cache.layers[d].keys for p in parts], 2),
               stacked([p.cache.layers[d].values for p in parts], 2)) for d in range(len(parts[0].cache.layers))]
    return Prefilled(DynamicCache(ddp_cache_data=layers, config=config), stacked([p.mask for p in parts], 1),
                     torch.cat([p.logits for p in parts]))


def prefilled(model: Any, rows: list[Tensor], keys: list[Any], pad_id: int) -> Prefilled:
    """Every row prefilled, by column (``keys``; a column's rows adjacent, sorted by length) and
    length bucket, in one joined cache."""
    from transformers import DynamicCache

    parts = []
    start = 0
    while start < len(rows):
        end = start
        while end < len(rows) and keys[end] == keys[start]:
            end += 1
        column = rows[start:end]
        shared = shared_span(column)
        prefix = None
        if shared:
            prefix = DynamicCache(config=getattr(model, "config", None))
            model(input_ids=column[0][:shared][None], cache=prefix, use_cache=True, logits_to_keep=1)
        first = 0
        for last in length_buckets([len(r) - shared for r in column]):
            parts.append(prefill(model, column[first:last], pad_id, prefix, shared))
            first = last
        start = end
    return joined(parts, getattr(model, "config", None))


@torch.no_grad()
def greedy(model: Any, rows: list[Tensor], caps: list[int], keys: list[Any], pad_id: int,
           eos_id: int | None) -> list[list[int]]:
    """Each row's greedy continuation (token ids, its EOS included), at most its cap. ``rows``:
    prompts without padding, a column's (``keys``) adjacent and sorted by length."""
    state = prefilled(model, rows, keys, pad_id)
    cache, mask, logits = state.cache, state.mask, state.logits
    positions = (mask.cumsum(-1) - 1)[:, -1]
    live = torch.arange(len(rows), device=mask.device)
    left = torch.tensor(caps, device=mask.device)
    out: list[list[int]] = [[] for _ in rows]
    while True:
        token = logits.argmax(-1)
        for row, t in zip(live.tolist(), token.tolist()):
            out[row].append(t)
        left = left - 1
        done = left == 0
        if eos_id is not None:
            done |= token == eos_id
        if bool(done.all()):
            return out
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            mask, positions, token, live, left = mask[keep], positions[keep], token[keep], live[keep], left[keep]
        mask = torch.cat([mask, mask.new_ones((len(live), 1))], 1)
        positions = positions + 1
        step = model(input_ids=token[:, None], attention_mask=mask, position_ids=positions[:, None], cache=cache,
                     use_cache=True, logits_to_keep=1)
        logits = step.logits[:, -1].to(dtype=torch.float32, copy=True)
