"""Where one greedy decoding step of a language model spends its time on the CPU.

Evaluation decodes a few tokens per row; whether a faster step needs cheaper products (fewer
bytes per weight, more rows per read) or less overhead (a static cache, a compiled step) is a
question of what a step is made of. This script prefills ``--rows`` random prompts of
``--prompt`` tokens into transformers' dynamic cache, times ``--steps`` decoding steps as
``generate`` runs them (the model's forward over each row's newest token, one position of
logits, argmax), then runs as many more under the torch profiler and sorts the ops' own CPU
time into:

- ``products``: matrix products (``aten::mm``/``addmm``/``bmm``), the layers' and the LM head's;
- ``cache``: ``aten::cat``, the dynamic cache growing by one position a step;
- ``attention``: scaled dot-product attention;
- ``other``: everything else (norms, rotary embedding, activations, views, the argmax).

It also prints the bytes of the weights a step reads once (every parameter: the tied LM head
reads the whole embedding) over the products' time: near what one core draws from memory, the
products are bound by memory, not arithmetic. SmolLM2-135M-Instruct by default
(``clbench models fetch smollm2-135m-instruct``), float32, one thread:

    OMP_NUM_THREADS=1 python perf/decode_profile.py                    # rows 8 and 64
"""

from __future__ import annotations

import argparse
import time

GROUPS = {"products": ("aten::mm", "aten::addmm", "aten::bmm"), "cache": ("aten::cat",),
          "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
                        "aten::_scaled_dot_product_efficient_attention")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--prompt", type=int, default=48, help="prompt tokens")
    parser.add_argument("--steps", type=int, default=8, help="decoding steps timed, then as many profiled")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()

    import torch

    from clbench.cpu_kernels import in_effect
    from clbench.models.lm.causal_lm import hf_causal_lm

    torch.set_num_threads(1)
    model = hf_causal_lm(path=args.model).eval().requires_grad_(False)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"{args.model}, float32, one thread, {in_effect()} kernels; {args.prompt}-token prompts, {args.steps} steps profiled; "
          f"weights {weight_bytes / 1e6:.0f} MB\n")
    print("| rows | ms/step | ms/token | products | cache | attention | other | weights' MB / products' s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")

    for rows in args.rows:
        wall, shares = profile_steps(model, rows, args.prompt, args.steps)
        products_s = shares["products"] * wall
        print(f"| {rows} | {wall * 1e3:.1f} | {wall * 1e3 / rows:.2f} | "
              + " | ".join(f"{shares[g]:.0%}" for g in ("products", "cache", "attention", "other"))
              + f" | {weight_bytes / 1e6 / products_s:,.0f} |")


def profile_steps(model, rows: int, prompt: int, steps: int) -> tuple[float, dict[str, float]]:
    """Seconds per decoding step of ``rows`` random prompts, and each group's share of the ops' own time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    @torch.no_grad()
    def decode(cache, token, mask, steps):
        for _ in range(steps):
            mask = torch.cat([mask, mask[:, :1]], 1)
            out = model(input_ids=token, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        return token, mask

    vocab = model.config.vocab_size
    ids = torch.randint(min(100, vocab // 2), vocab, (rows, prompt), generator=torch.Generator().manual_seed(rows))
    with torch.no_grad():
        cache = DynamicCache()
        token = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    token, mask = decode(cache, token.argmax(-1, keepdim=True), torch.ones_like(ids), 2)  # warm-up
    start = time.perf_counter()  # timed without the profiler, whose bookkeeping costs per op
    token, mask = decode(cache, token, mask, steps)
    wall = (time.perf_counter() - start) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode(cache, token, mask, steps)
    own = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(own.values())
    shares = {g: sum(t for k, t in own.items() if k in names) / total for g, names in GROUPS.items()}
    shares["other"] = 1 - sum(shares.values())
    return wall, shares


if __name__ == "__main__":
    main()
