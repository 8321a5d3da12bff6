"""perf/decode_profile.py: its groups find the products, the cache's growth and attention of a
real step, and its in-place cache holds and computes what the dynamic cache does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("decode_profile", ROOT / "perf" / "decode_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model():
    from clbench.models.lm.causal_lm import hf_causal_lm

    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256}
    torch.manual_seed(0)
    return hf_causal_lm(architecture="llama", config=config, tokenizer="trace-mini").eval()


def test_a_decoding_steps_time_is_sorted_into_products_cache_attention_and_the_rest(script, model):
    wall, shares = script.profile_steps(model, rows=3, prompt=6, steps=2)
    assert wall > 0 and set(shares) == {"products", "cache", "attention", "other"}
    # every group's ops ran (a renamed op would leave its group at 0), and the shares partition the time
    assert all(shares[g] > 0 for g in ("products", "cache", "attention")) and 0 <= shares["other"] < 1
    assert abs(sum(shares.values()) - 1) < 1e-9


def test_the_in_place_cache_holds_what_the_dynamic_one_holds_and_is_timed_beside_it(script, model):
    from transformers import DynamicCache

    ids = script.prompts(model, rows=3, prompt=6)
    # 70 steps outgrow the room reserved at the prefill (64), so the buffer is grown once on the way
    caches = [DynamicCache(), script.in_place_cache(2)]
    logits = [script.decode(model, cache, ids, 0)(70) for cache in caches]
    assert all(a.equal(b) for a, b in zip(*logits))
    for dynamic, in_place in zip(caches[0].layers, caches[1].layers):
        assert in_place.keys.equal(dynamic.keys) and in_place.values.equal(dynamic.values)
        assert in_place.buffers[0].shape[-2] > in_place.keys.shape[-2] == 6 + 70  # views of a larger buffer
    times, equal = script.compare_in_place(model, rows=3, prompt=6, steps=2, rounds=2)
    assert equal and {k: len(v) for k, v in times.items()} == {"dynamic": 2, "in place": 2}
