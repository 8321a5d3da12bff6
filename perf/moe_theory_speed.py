"""Rounds per second of the vectorised MoE-in-CL simulation (Algorithm 1, Eq. 5 updates,
closed-form gating gradient, model error / F_t / G_t every round):

    python perf/moe_theory_speed.py                       # 2,000 rounds, M = 10, 1 and 10 seeds
    python perf/moe_theory_speed.py --rounds 2000 --experts 20 --seeds 1 10 100

One Python step per round over tensors batched across seeds; the paper's Fig. 2 (T = 2,000)
takes seconds, not minutes. Runs on one thread (small tensors: more threads only add waiting).
"""

from __future__ import annotations

import argparse
import time

import torch

from clbench.strategies.moe_theory import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--experts", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 10])
    args = parser.parse_args()
    torch.set_num_threads(1)
    simulate([0], 20, args.experts)  # warm-up (imports, first kernels)
    for count in args.seeds:
        start = time.perf_counter()
        simulate(list(range(count)), args.rounds, args.experts)
        elapsed = time.perf_counter() - start
        print(f"{args.rounds} rounds, M={args.experts}, {count} seed(s) at once: {elapsed:.2f} s, "
              f"{args.rounds / elapsed:,.0f} rounds/s ({count * args.rounds / elapsed:,.0f} run-rounds/s)")


if __name__ == "__main__":
    main()
