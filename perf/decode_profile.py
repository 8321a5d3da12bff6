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
    OMP_NUM_THREADS=1 python perf/decode_profile.py --in-place         # and the cache written in place

A whole untimed round (prefill and steps on a cache of its own) runs first: the first time a
process grows its caches, ``aten::cat`` pays for fresh pages, which a pass's later batches reuse.

``--in-place`` also times the steps with a cache that writes each step's keys and values into
room reserved at the prefill and hands attention views of the filled positions (:class:`InPlaceLayer`),
in rounds interleaved with the dynamic cache's, and says whether every step's logits are
bit-equal to the dynamic cache's.
"""

from __future__ import annotations

import argparse
import statistics
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
    parser.add_argument("--in-place", action="store_true", help="also time a cache written in place")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of --in-place")
    args = parser.parse_args()

    import torch

    from clbench.cpu_kernels import in_effect
    from clbench.models.lm.causal_lm import hf_causal_lm

    torch.set_num_threads(1)
    model = hf_causal_lm(path=args.model).eval().requires_grad_(False)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"{args.model}, float32, one thread, {in_effect()} kernels; {args.prompt}-token prompts, "
          f"{args.steps} steps profiled; "
          f"weights {weight_bytes / 1e6:.0f} MB\n")
    print("| rows | ms/step | ms/token | products | cache | attention | other | weights' MB / products' s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")

    for rows in args.rows:
        wall, shares = profile_steps(model, rows, args.prompt, args.steps)
        products_s = shares["products"] * wall
        print(f"| {rows} | {wall * 1e3:.1f} | {wall * 1e3 / rows:.2f} | "
              + " | ".join(f"{shares[g]:.0%}" for g in ("products", "cache", "attention", "other"))
              + f" | {weight_bytes / 1e6 / products_s:,.0f} |")
    if args.in_place:
        print("\n| rows | dynamic ms/step | in place ms/step | dynamic / in place: median, rounds' range "
              "| logits bit-equal |")
        print("|---:|---:|---:|---:|---|")
        for rows in args.rows:
            times, equal = compare_in_place(model, rows, args.prompt, args.steps, args.rounds)
            dynamic, in_place = (statistics.median(times[k]) for k in ("dynamic", "in place"))
            ratios = [d / i for d, i in zip(times["dynamic"], times["in place"])]
            print(f"| {rows} | {dynamic * 1e3:.1f} | {in_place * 1e3:.1f} | {statistics.median(ratios):.2f}, "
                  f"{min(ratios):.2f}-{max(ratios):.2f} | {equal} |")


def prompts(model, rows: int, prompt: int):
    """``rows`` random prompts of ``prompt`` tokens, the same for the same ``rows``."""
    import torch

    vocab = model.config.vocab_size
    return torch.randint(min(100, vocab // 2), vocab, (rows, prompt), generator=torch.Generator().manual_seed(rows))


def decode(model, cache, ids, steps: int):
    """Prefill ``ids`` into ``cache``, then ``steps`` greedy steps; returns a function that runs
    ``n`` more and returns their logits (the last position's, one tensor per step)."""
    import torch

    with torch.no_grad():
        state = {"token": model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1:].argmax(-1),
                 "mask": torch.ones_like(ids)}

    @torch.no_grad()
    def more(n: int) -> list:
        logits = []
        for _ in range(n):
            state["mask"] = torch.cat([state["mask"], state["mask"][:, :1]], 1)
            out = model(input_ids=state["token"], attention_mask=state["mask"], cache=cache, use_cache=True,
                        logits_to_keep=1).logits[:, -1]
            state["token"] = out.argmax(-1, keepdim=True)
            logits.append(out)
        return logits

    more(steps)
    return more


def profile_steps(model, rows: int, prompt: int, steps: int) -> tuple[float, dict[str, float]]:
    """Seconds per decoding step of ``rows`` random prompts, and each group's share of the ops' own time."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    ids = prompts(model, rows, prompt)
    decode(model, DynamicCache(), ids, 2 + 2 * steps)  # the untimed round: the allocator's pages, then reused
    more = decode(model, DynamicCache(), ids, 2)
    start = time.perf_counter()  # timed without the profiler, whose bookkeeping costs per op
    more(steps)
    wall = (time.perf_counter() - start) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        more(steps)
    own = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(own.values())
    shares = {g: sum(t for k, t in own.items() if k in names) / total for g, names in GROUPS.items()}
    shares["other"] = 1 - sum(shares.values())
    return wall, shares


def in_place_cache(layers: int):
    """A dynamic cache whose layers write in place (:class:`InPlaceLayer`)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):
        """Keys and values written into a buffer with room for 64 more positions, grown by copying
        when full; ``keys``/``values`` are views of the filled positions, as many as the dynamic
        cache would hold, so attention computes over the same positions."""

        room = 64

        def __init__(self):
            super().__init__()
            self.buffers = None

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            filled = self.keys.shape[-2] if self.keys.numel() else 0
            new = key_states.shape[-2]
            if self.buffers is None or filled + new > self.buffers[0].shape[-2]:
                size = filled + new + self.room
                grown = [t.new_empty((*t.shape[:2], size, t.shape[-1])) for t in (key_states, value_states)]
                if filled:
                    for buffer, old in zip(grown, (self.keys, self.values)):
                        buffer[..., :filled, :] = old
                self.buffers = grown
            for buffer, states in zip(self.buffers, (key_states, value_states)):
                buffer[..., filled:filled + new, :] = states
            self.keys, self.values = (b[..., :filled + new, :] for b in self.buffers)
            return self.keys, self.values

    cache = DynamicCache()
    cache.layers = [InPlaceLayer() for _ in range(layers)]
    return cache


def compare_in_place(model, rows: int, prompt: int, steps: int, rounds: int) -> tuple[dict[str, list[float]], bool]:
    """Seconds per step of the dynamic cache and the in-place one, in rounds that alternate who
    goes first; and whether every step's logits were bit-equal."""
    from transformers import DynamicCache

    ids = prompts(model, rows, prompt)
    caches = {"dynamic": DynamicCache, "in place": lambda: in_place_cache(model.config.num_hidden_layers)}
    for make in caches.values():
        decode(model, make(), ids, 2 + steps)  # untimed
    times: dict[str, list[float]] = {name: [] for name in caches}
    equal = True
    for k in range(rounds):
        logits = {}
        for name in (list(caches) if k % 2 == 0 else list(caches)[::-1]):
            more = decode(model, caches[name](), ids, 2)
            start = time.perf_counter()
            logits[name] = more(steps)
            times[name].append((time.perf_counter() - start) / steps)
        equal &= all(a.equal(b) for a, b in zip(logits["dynamic"], logits["in place"]))
    return times, equal


if __name__ == "__main__":
    main()
