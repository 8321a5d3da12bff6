"""Greedy generation over a whole evaluation pass: prompts pooled, bucketed, then decoded.

Decoding each loader batch as it comes (``eval_batch_size`` rows, padded to the batch's longest
prompt, one ``generate`` per batch) pays for padding, for every row's copy of its task's
instruction, for each decoding step's fixed cost once per small batch, and for every row that
stopped early until its batch ends. The causal-LM objective therefore keeps a pass's prompts
until the pass ends (:class:`PendingBatch`) and decodes them together (:func:`decode`):

- rows are ordered by column, then by prompt length (ties in arrival order), and cut into the
  fewest batches of at most ``rows`` rows, of near-equal size (:func:`plan`);
- a batch is decoded by :mod:`~clbench.objectives.greedy_loop`: each column's rows prefilled
  apart, in buckets of near-equal length, the instruction they share once; one greedy loop
  over the batch, each row dropped at its own EOS or answer cap (a task's ``max_new_tokens``);
- where the objective decodes with transformers' ``generate`` instead (a static KV cache, a
  model whose forward hooks change its inputs, a generation config that is not a plain argmax,
  a sliding-window cache),
  rows are first grouped by answer cap, so no row decodes past its own, and a batch's shared
  instructions are prefilled once (:func:`shared_prefix_cache`).

On a CPU a decoding step over 64 rows costs a few times one over 8, for eight times the tokens,
and prefill costs per token, so what padding, repeated instructions and finished rows cost is
saved outright (``perf/lm_generation.py`` measures it).

Greedy tokens are not bit-equal to one-batch-at-a-time decoding: a row's logits round
differently beside other rows (about 4e-5 in SmolLM2's logits), and a near tie may flip. The
perf script counts the rows whose text differs. The batch size is a setting, not read from
free memory: the tokens of a run must not depend on what else its machine was running; a
batch the memory cannot hold is cut (:func:`rows_that_fit`) and the cut is recorded.

The teacher-forced routing pass (models with routing layers) keeps its own forward: it reads
prompt + reference answer, right-padded, and its prompt positions would give the generation's
prefill only in exact arithmetic, laid out as the loader batch, not as the bucketed one.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Hashable

import torch
from torch import Tensor

from clbench.objectives.kv_cache import forward_hooked
from clbench.objectives.text_batches import left_padded

# Fraction of the free memory a generation batch may take (KV cache and prefill activations).
MEMORY_SHARE = 0.25
# A column's shared prefix shorter than this is prefilled with each row (a separate forward is not worth it).
MIN_SHARED_PREFIX = 4


@dataclass
class PendingBatch:
    """One loader batch whose generations wait for the end of the pass."""

    rows: list[Tensor]  # each prompt's token ids, without padding
    cap: int  # new tokens at most (the column's max_new_tokens)
    raw: bool  # decoded as TRACE's inference does
    metrics: Any  # the column's MetricCollection
    column: Any  # the experience the column scores (None: a stream-wide test set)
    prompts: list[str]
    answers: list[str]
    predictions: list[str | None] = field(default_factory=list)


def decode(model: Any, pending: list[PendingBatch], generate: Callable[..., list[str]], pad_id: int, rows: int,
           evaluating: Callable[[Any], ContextManager[None]] | None = None,
           loop: Callable[..., list[str]] | None = None) -> list[int]:
    """Fill every pending batch's ``predictions``: rows pooled across batches (and across
    columns unless ``evaluating(column)``, the strategy's per-column context, is given: then per
    column inside it), decoded by ``loop(model, rows, caps, columns, raws)``
    (:mod:`~clbench.objectives.greedy_loop`: a batch of any caps, each row stopped on its own)
    where given, else by ``generate(model, ids, mask, cap, raw=, cache=)`` in batches of one cap.
    Returns the sizes of the batches decoded."""
    flat = [(b, i) for b, batch in enumerate(pending) for i in range(len(batch.rows))]
    for batch in pending:
        batch.predictions = [None] * len(batch.rows)
    order = {c: k for k, c in enumerate(dict.fromkeys(id(b.column) for b in pending))}  # columns as they came
    columns = [order[id(pending[b].column)] for b, _ in flat]
    groups = [(None, None) if loop else (pending[b].cap, pending[b].raw) for b, _ in flat]
    groups = [(*group, columns[n] if evaluating else None) for n, group in enumerate(groups)]
    lengths = [len(pending[b].rows[i]) for b, i in flat]
    wanted = rows_that_fit(model, max(lengths) + max(b.cap for b in pending), rows)
    share = not forward_hooked(model)  # MoSEs prepends its prompts: no prefix is shared then
    sizes = []
    for members in plan(lengths, groups, wanted, columns):
        first = pending[flat[members[0]][0]]
        batch_rows = [pending[b].rows[i] for b, i in (flat[m] for m in members)]
        with evaluating(first.column) if evaluating else contextlib.nullcontext():
            if loop:
                texts = loop(model, batch_rows, [pending[flat[m][0]].cap for m in members],
                             [columns[m] for m in members], [pending[flat[m][0]].raw for m in members])
            else:
                laid_out = shared_prefix_cache(model, batch_rows, [columns[m] for m in members], pad_id) if share else None
                ids, mask, cache = laid_out if laid_out is not None else (*left_padded(batch_rows, pad_id), None)
                texts = generate(model, ids, mask, first.cap, raw=first.raw, cache=cache)
        for m, text in zip(members, texts):
            b, i = flat[m]
            pending[b].predictions[i] = text
        sizes.append(len(members))
    return sizes


def plan(lengths: list[int], groups: list[Hashable], rows: int, columns: list[int] | None = None
         ) -> list[list[int]]:
    """Batches of row indices: rows of one group only, sorted by column (when given), then by
    length (ties in order), each group cut into ``ceil(n / rows)`` batches whose sizes differ by
    at most one."""
    by_group: dict[Hashable, list[int]] = {}
    for index, group in enumerate(groups):
        by_group.setdefault(group, []).append(index)
    batches = []
    for members in by_group.values():
        members.sort(key=lambda i: (columns[i] if columns else 0, lengths[i]))  # stable: ties keep their order
        count = math.ceil(len(members) / rows)
        size, extra = divmod(len(members), count)
        start = 0
        for k in range(count):
            end = start + size + (k < extra)
            batches.append(members[start:end])
            start = end
    return batches


def bytes_per_row(config: Any, tokens: int, itemsize: int) -> int:
    """Memory one row of a generation batch may take: its KV cache over ``tokens`` positions and
    one layer's prefill activations (attention projections and the MLP's three matrices)."""
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    head_dim = int(getattr(config, "head_dim", 0) or (hidden // heads if hidden else 0))
    kv_heads = int(getattr(config, "num_key_value_heads", 0) or heads)
    layers = int(getattr(config, "num_hidden_layers", 1) or 1)
    inner = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    cache = 2 * layers * kv_heads * head_dim
    activations = 4 * hidden + 3 * inner
    return tokens * (cache + activations) * itemsize + int(getattr(config, "vocab_size", 0) or 0) * 4


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` (None where it cannot be read)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def rows_that_fit(model: Any, tokens: int, wanted: int) -> int:
    """``wanted``, or fewer where :data:`MEMORY_SHARE` of the free memory cannot hold as many
    rows of ``tokens`` positions."""
    hf = getattr(model, "hf", model)
    config = getattr(hf, "config", None)
    parameter = next(iter(model.parameters()), None)
    if config is None or parameter is None:
        return wanted
    free = free_memory(parameter.device)
    if free is None:
        return wanted
    each = bytes_per_row(getattr(config, "get_text_config", lambda: config)(), tokens, parameter.element_size())
    return max(1, min(wanted, int(free * MEMORY_SHARE) // max(1, each)))


def common_prefix(rows: list[Tensor]) -> int:
    """How many leading tokens all ``rows`` share."""
    shortest = min(len(r) for r in rows)
    if len(rows) < 2 or shortest == 0:
        return 0
    stacked = torch.stack([r[:shortest] for r in rows])
    differs = (stacked != stacked[0]).any(0).nonzero()
    return int(differs[0]) if len(differs) else shortest


def shared_span(rows: list[Tensor]) -> int:
    """The leading tokens of ``rows`` worth prefilling once: their common prefix, each row
    keeping at least one token of its own; 0 below :data:`MIN_SHARED_PREFIX`."""
    shared = min(common_prefix(rows), min(len(r) for r in rows) - 1)
    return shared if shared >= MIN_SHARED_PREFIX else 0


def shared_prefix_cache(model: Any, rows: list[Tensor], keys: list[Hashable], pad_id: int
                        ) -> tuple[Tensor, Tensor, Any] | None:
    """``(input_ids, attention_mask, cache)`` for ``generate``: the rows laid out as
    [left-padded shared prefix | left-padded rest], the prefix that the rows of each key (column)
    share computed once (one row) and its KV cache copied to those rows. Padding inside a row
    is masked and positions follow the mask, as ``generate`` derives them, so each row sees
    its own prompt. None where no key's rows share :data:`MIN_SHARED_PREFIX` tokens (each row
    keeps at least one token of its own to prefill), or the model's cache is not a plain
    key/value cache."""
    from transformers import DynamicCache

    spans = {key: shared_span([r for r, k in zip(rows, keys) if k == key]) for key in dict.fromkeys(keys)}
    if not any(spans.values()):
        return None
    width = max(spans.values())
    first = {key: next(r for r, k in zip(rows, keys) if k == key) for key, n in spans.items() if n}
    caches = {}
    for key, row in first.items():
        cache = DynamicCache(config=getattr(model, "config", None))
        model(input_ids=row[: spans[key]][None], cache=cache, use_cache=True)
        if not all(type(layer).__name__ == "DynamicLayer" for layer in cache.layers):
            return None
        caches[key] = cache
    reference = next(iter(caches.values())).layers
    rows_by_key = {key: torch.tensor([i for i, k in enumerate(keys) if k == key], device=rows[0].device)
                   for key in caches}
    layers = []
    for depth, layer in enumerate(reference):
        keys_t = layer.keys.new_zeros((len(rows), *layer.keys.shape[1:2], width, layer.keys.shape[-1]))
        values_t = layer.values.new_zeros((len(rows), *layer.values.shape[1:2], width, layer.values.shape[-1]))
        for key, rows_of_key in rows_by_key.items():  # one copy per column, broadcast over its rows
            keys_t[rows_of_key, :, width - spans[key]:] = caches[key].layers[depth].keys
            values_t[rows_of_key, :, width - spans[key]:] = caches[key].layers[depth].values
        layers.append((keys_t, values_t))
    prefix_ids, prefix_mask = left_padded([r[: spans[k]] for r, k in zip(rows, keys)], pad_id, width)
    rest_ids, rest_mask = left_padded([r[spans[k]:] for r, k in zip(rows, keys)], pad_id)
    cache = DynamicCache(ddp_cache_data=layers, config=getattr(model, "config", None))
    return torch.cat([prefix_ids, rest_ids], 1), torch.cat([prefix_mask, rest_mask], 1), cache
