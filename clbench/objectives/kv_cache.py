"""The KV cache greedy evaluation decodes with: transformers' dynamic one, or its static one.

The dynamic cache (the default) grows by one position a step and attention reads exactly the
positions filled so far. The static cache is allocated once per batch at its final length and
written in place; attention reads the whole allocation under a mask. Its use is on a GPU: a
decoding step of fixed shapes is what ``torch.compile`` turns into CUDA graphs, and transformers'
``generate`` compiles the step by itself there when it is handed a static cache (on a CPU it
runs the static cache eagerly and is no faster than the dynamic one: a pass took 1.05-1.16x
as long per round in ``perf/lm_generation.py --static``, within the rounds' spread). A
compiled graph is specialised to its shapes, so the length is rounded up to a multiple of
:data:`STATIC_STEP`: batches of near-equal prompts then share a graph instead of each
compiling its own.

A model whose forward hooks change what its forward sees (:func:`forward_hooked`) decodes with
the dynamic cache whatever the setting.

Attending over the allocation under a mask is not the dynamic cache's computation: its
reductions may round differently, and a near tie between two tokens may flip (on a CPU too: a
whole run of ``configs/examples/trace-mini-seq_ft.yaml`` kept its R matrix, but one task's score
before training, from random logits, moved by 0.001: a generated text changed). Which cache a run
uses is therefore a setting of the objective (``kv_cache``), recorded with the run, and
``perf/gpu_report.py`` counts the rows whose text differs from the dynamic cache's.
"""

from __future__ import annotations

import math
from typing import Any, Literal

#: Positions a static cache's length is rounded up to a multiple of (our choice: a pass's batch
#: widths then fall on a handful of lengths, a few positions more per row than needed).
STATIC_STEP = 64

KVCache = Literal["dynamic", "static"]


def forward_hooked(model: Any) -> bool:
    """Whether a forward hook may change what ``model``'s forward sees (MoSEs prepends its prompts
    and widens the attention mask): its positions are then not the prompt's, so neither a shared
    prefix nor a static cache sized from the prompt fits it, and it decodes as ``generate`` alone
    does, with the dynamic cache."""
    return any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def static_length(positions: int) -> int:
    """The allocated length of a static cache that must hold ``positions``."""
    return max(1, math.ceil(positions / STATIC_STEP)) * STATIC_STEP


def static_cache(model: Any, positions: int, filled: Any = None) -> Any:
    """transformers' ``StaticCache`` for ``model`` holding at least ``positions`` (rounded up by
    :func:`static_length`); ``filled``, a dynamic cache of the first positions (a shared
    prefix, :func:`~clbench.objectives.generation_pool.shared_prefix_cache`), is written into
    it, so decoding starts after them as it would from ``filled`` itself."""
    from transformers import StaticCache

    cache = StaticCache(config=getattr(model, "hf", model).config, max_cache_len=static_length(positions))
    if filled is not None:
        for layer, source in zip(cache.layers, filled.layers, strict=True):
            layer.update(source.keys, source.values)
    return cache
