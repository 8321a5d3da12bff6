"""EWC's Fisher and MAS's importance on an MLP: the factored path against per-sample gradients.

    OMP_NUM_THREADS=1 python perf/fisher_speed.py [--samples 2048] [--rounds 3] [--chunk 256]

The Fashion-MNIST suite's model (784-400-400-10 ReLU MLP, random weights, random images) and
``--samples`` samples, one torch thread. Each round times both paths of
:func:`clbench.strategies.ewc.diagonal_fisher` and :func:`clbench.strategies.mas.output_importance`
in turn (the factored one, :func:`~clbench.strategies.ewc.linear_gradient_moments`, and the
per-sample ``vmap`` one it replaces on such models), so that load from other processes falls on
both alike; the best round of each is printed with the ratio, and the largest relative
difference between the two results (rounding only).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=256, help="samples per chunk (EWC's automatic choice: 256)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from torch import nn

    from clbench.data.datasets import ArrayDataset
    from clbench.strategies import ewc, mas

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 400), nn.ReLU(), nn.Linear(400, 400), nn.ReLU(),
                          nn.Linear(400, 10))
    images = torch.randint(0, 256, (args.samples, 1, 28, 28), dtype=torch.uint8)
    dataset = ArrayDataset(images, torch.randint(0, 10, (args.samples,)), lambda x: x.float() / 255)
    factored = ewc.linear_gradient_moments

    def per_sample(*_args, **_kwargs):
        return False

    print(f"{args.samples} samples, chunks of {args.chunk}, best of {args.rounds} rounds (s)")
    print("| | factored | per-sample | ratio | largest relative difference |\n|---|---|---|---|---|")
    for label, estimate in (("EWC Fisher", ewc.diagonal_fisher), ("MAS importance", mas.output_importance)):
        best = {"factored": float("inf"), "per-sample": float("inf")}
        results = {}
        estimate(model, dataset, batch_size=args.chunk)  # warm-up (first-call tracing)
        for _ in range(args.rounds):
            for path, fn in (("factored", factored), ("per-sample", per_sample)):
                ewc.linear_gradient_moments = mas.linear_gradient_moments = fn
                start = time.perf_counter()
                results[path] = estimate(model, dataset, batch_size=args.chunk)
                best[path] = min(best[path], time.perf_counter() - start)
        ewc.linear_gradient_moments = mas.linear_gradient_moments = factored
        gap = max(float((results["factored"][n] - results["per-sample"][n]).abs().max()
                        / results["per-sample"][n].abs().max()) for n in results["factored"])
        print(f"| {label} | {best['factored']:.2f} | {best['per-sample']:.2f} | "
              f"{best['per-sample'] / best['factored']:.1f}x | {gap:.1e} |", flush=True)


if __name__ == "__main__":
    main()
