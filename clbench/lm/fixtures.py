"""A tiny randomly initialised causal LM on disk, for tests and quick trials.

Real checkpoints cannot be downloaded everywhere clbench runs. A tiny model written with
``save_pretrained`` next to its tokenizer is a folder of the same shape (config.json,
model.safetensors, tokenizer.json), so tests load it through ``hf_causal_lm(path=...)``, the
path a user's real checkpoint takes.
"""

from __future__ import annotations

from pathlib import Path

import torch


def tiny_config(architecture: str = "qwen3", *, layers: int = 2, hidden: int = 64, heads: int = 4,
                kv_heads: int | None = None, intermediate: int | None = None, max_positions: int = 512) -> dict:
    """``config`` overrides for a small model of ``architecture``, in its own field names.

    Head size is ``hidden // heads`` (Qwen3's default ``head_dim`` is 128 whatever the width,
    so it is set explicitly); fields an architecture lacks (GPT-2 has no grouped KV heads) are left out.
    """
    from transformers import CONFIG_MAPPING

    from clbench.lm.models import _known_keys

    known = _known_keys(CONFIG_MAPPING[architecture])
    wanted = {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads or max(1, heads // 2), "head_dim": hidden // heads,
              "intermediate_size": intermediate or 2 * hidden, "max_position_embeddings": max_positions}
    return {k: v for k, v in wanted.items() if k in known}


def write_tiny_model(out_dir: str | Path, tokenizer_dir: str | Path, architecture: str = "qwen3", *,
                     layers: int = 2, hidden: int = 64, heads: int = 4, seed: int = 0, **sizes: int) -> Path:
    """Save a random ``architecture`` model and the tokenizer from ``tokenizer_dir`` to ``out_dir``.

    The weights depend only on ``seed`` (the global RNG is left as it was); ``sizes`` go to
    :func:`tiny_config` (``kv_heads``, ``intermediate``, ``max_positions``).
    """
    from transformers.utils import logging as hf_logging

    from clbench.lm.models import hf_causal_lm

    config = tiny_config(architecture, layers=layers, hidden=hidden, heads=heads, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = hf_causal_lm(architecture=architecture, config=config, tokenizer=str(tokenizer_dir))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-shard bar per tiny model is noise in test logs
    try:
        return model.save_pretrained(out_dir)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def sample_texts(n: int = 200, seed: int = 0) -> list[str]:
    """``n`` short prompt/answer lines of a few fixed patterns: enough to train a tokenizer on."""
    import random

    rng = random.Random(seed)
    names = ["cat", "dog", "bird", "fish", "fox", "owl"]
    texts = []
    for _ in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        x, y = rng.sample(names, 2)
        texts.append(rng.choice([f"Question: {a} + {b} = ? Answer: {a + b}",
                                 f"The {x} sees the {y}. Who sees? Answer: the {x}",
                                 f"x = <NUM_LIT> + {a}\nprint('<STR_LIT>', x)"]))
    return texts
