"""Greedy decoding under CPU bf16 autocast: frozen weights cast at every op against cast once a pass.

Autocast keeps a weight's bf16 copy for the rest of its region only when the weight requires
grad, so the frozen base of an adapter method is cast again at every decoding step.
:func:`clbench.engine.precision.casts_kept` marks the frozen weights for the span of a pooled
decode, so each is cast once. Three contenders, interleaved round by round in one process (who
goes first rotates), on SmolLM2-135M-Instruct with every weight frozen (what a LoRA run's base
is; ``clbench models fetch smollm2-135m-instruct``):

- ``fp32``: no autocast (a ``32-true`` run, every committed leaderboard);
- ``bf16 per op``: ``torch.autocast("cpu", torch.bfloat16)``, a ``bf16-mixed`` run before;
- ``bf16 kept``: the same inside ``casts_kept``, a ``bf16-mixed`` run now.

A decoding step's time is ``(t(prefill + S + 1 tokens) - t(prefill + 1 token)) / S`` over
``--rows`` random prompts of ``--prompt`` tokens, each contender's greedy tokens compared with
``bf16 per op``'s. On a CPU without bf16 units (no ``avx512_bf16``/``amx_bf16``) bf16 matmuls are
emulated and the figures say nothing about a bf16-mixed run there (none defaults to it).

    OMP_NUM_THREADS=1 python perf/autocast_casts.py                       # rows 8 and 64, 3 rounds
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--prompt", type=int, default=48, help="prompt tokens")
    parser.add_argument("--steps", type=int, default=16, help="decoding steps timed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()

    import torch

    from clbench.cpu_kernels import cpu_flags
    from clbench.engine.precision import BF16_FLAGS, casts_kept
    from clbench.models.lm.causal_lm import hf_causal_lm

    torch.set_num_threads(1)
    model = hf_causal_lm(path=args.model).eval().requires_grad_(False)
    units = [f for f in BF16_FLAGS if f in cpu_flags()]
    print(f"{args.model}, one thread, bf16 units: {', '.join(units) or 'none'}; {args.steps} steps, "
          f"{args.prompt}-token prompts, medians of {args.rounds} rounds\n")

    def contexts(name: str):
        if name == "fp32":
            return [contextlib.nullcontext()]
        return [torch.autocast("cpu", torch.bfloat16)] + ([casts_kept(model)] if name == "bf16 kept" else [])

    def decode(name: str, ids, new: int):
        with contextlib.ExitStack() as stack, torch.no_grad():
            for ctx in contexts(name):
                stack.enter_context(ctx)
            start = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False)
            return time.perf_counter() - start, out

    names = ["fp32", "bf16 per op", "bf16 kept"]
    print("| rows | fp32 ms/step | bf16 per op | bf16 kept | kept / per op | kept / fp32 | prefill s: fp32, per op, "
          "kept | tokens unlike per op: fp32, kept |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for rows in args.rows:
        ids = torch.randint(100, 40000, (rows, args.prompt), generator=torch.Generator().manual_seed(rows))
        step, prefill, tokens = {n: [] for n in names}, {n: [] for n in names}, {}
        for name in names:  # warm-up
            decode(name, ids, 2)
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                first, _ = decode(name, ids, 1)
                whole, out = decode(name, ids, args.steps + 1)
                step[name].append((whole - first) / args.steps * 1000)
                prefill[name].append(first)
                tokens[name] = out[:, args.prompt:]
        med = {n: statistics.median(step[n]) for n in names}
        unlike = [int((tokens[n] != tokens["bf16 per op"]).any(1).sum()) for n in ("fp32", "bf16 kept")]
        print(f"| {rows} | {med['fp32']:.1f} | {med['bf16 per op']:.1f} | {med['bf16 kept']:.1f} "
              f"| {med['bf16 per op'] / med['bf16 kept']:.2f}x | {med['fp32'] / med['bf16 kept']:.2f}x "
              f"| {', '.join(f'{statistics.median(prefill[n]):.2f}' for n in names)} "
              f"| {unlike[0]}, {unlike[1]} of {rows} |")


if __name__ == "__main__":
    main()
