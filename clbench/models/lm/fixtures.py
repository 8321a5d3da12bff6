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

    from clbench.models.lm.causal_lm import known_config_keys

    known = known_config_keys(CONFIG_MAPPING[architecture])
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
    from clbench.models.lm.causal_lm import hf_causal_lm
    from clbench.quiet import no_progress_bars

    config = tiny_config(architecture, layers=layers, hidden=hidden, heads=heads, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = hf_causal_lm(architecture=architecture, config=config, tokenizer=str(tokenizer_dir))
    with no_progress_bars():  # a one-shard bar per tiny model is noise in test logs
        return model.save_pretrained(out_dir)


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


#: A ChatML-style template, as instruct models ship them (SmolLM2, Qwen): turns end with <|im_end|>.
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(out_file: str | Path, tokenizer_dir: str | Path, *, layers: int = 2, hidden: int = 64,
                    heads: int = 4, kv_heads: int = 2, intermediate: int = 128, seed: int = 0,
                    chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """Write a tiny random Llama as a GGUF file, with the tokenizer from ``tokenizer_dir`` embedded.

    The file has what transformers' GGUF loader reads for a llama model and a ``gpt2`` (byte-level
    BPE) tokenizer: the tokenizer's vocabulary and merges, plus ``<|endoftext|>``,
    ``<|im_start|>`` and ``<|im_end|>`` (the end of a turn, and the eos) and a chat template.
    The projection weights are stored quantised (Q8_0, blocks of 32, so ``hidden`` and
    ``intermediate`` must be multiples of 32), the norms and embedding in float32, as llama.cpp
    writes them. The weights depend only on ``seed``. Needs the ``gguf`` package.
    """
    import json

    import gguf
    import numpy as np

    spec = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    specials = {t["content"] for t in spec.get("added_tokens", []) if t.get("special")}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])] + ["<|endoftext|>", "<|im_start|>",
                                                                              "<|im_end|>"]
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    types = [control if t in specials else normal for t in tokens[:-3]] + [control] * 3
    size, head_dim = len(tokens), hidden // heads
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(layers)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)
    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int) -> None:
        if len(shape) == 1:  # norms: ones, as a freshly initialised RMSNorm
            writer.add_tensor(name, np.ones(shape, dtype=np.float32))
            return
        weight = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if name == "token_embd.weight":
            writer.add_tensor(name, weight)
        else:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(weight, q8), raw_dtype=q8)

    tensor("token_embd.weight", size, hidden)
    tensor("output_norm.weight", hidden)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", hidden)
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden)
        tensor(f"blk.{i}.ffn_norm.weight", hidden)
        tensor(f"blk.{i}.ffn_gate.weight", intermediate, hidden)
        tensor(f"blk.{i}.ffn_up.weight", intermediate, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, intermediate)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
