"""Fig. 2 and App. A.7 of "Theory on Mixture-of-Experts in Continual Learning", measured with
the vectorised simulation (``clbench.strategies.moe_theory.simulate``):

    python examples/moe_theory_figures.py                       # plots into moe-theory-figures/
    python examples/moe_theory_figures.py --seeds 10 --rounds 2000 --output DIR

Prints the numbers quoted in docs/moe-theory.md and writes ``fig2.png`` (forgetting and
generalisation error with/without termination, mean over seeds, M in {1, 5, 10, 20}) and
``loads.png`` (per-cluster expert loads after termination for each Gamma, one seed).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from clbench.strategies.moe_theory import simulate

SIGMA0 = 0.4


def cluster_balance(result: dict, num_clusters: int) -> tuple[float, float]:
    """After termination: (experts per cluster holding >= 10% of its rounds, normalised entropy
    of a cluster's expert shares), averaged over clusters and runs."""
    counts, entropies = [], []
    M = result["experts"].shape[1]
    for b in range(result["expert"].shape[0]):
        start = max(int(result["stopped_at"][b]), result["explore"])
        clusters = result["clusters"][b][result["task"][b, start:]]
        experts = result["expert"][b, start:]
        for k in range(num_clusters):
            share = torch.bincount(experts[clusters == k], minlength=M).double()
            if share.sum() == 0:
                continue
            share /= share.sum()
            used = share[share > 0]
            counts.append(float((share >= 0.1).sum()))
            entropies.append(float(-(used * used.log()).sum() / torch.log(torch.tensor(float(M)))))
    return sum(counts) / len(counts), sum(entropies) / len(entropies)


def fig2(seeds: list[int], rounds: int, output: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    print(f"Fig. 2: N=6, K=3, eta=alpha=0.5, lam=0.3, Gamma=sigma0^1.25, {len(seeds)} seeds, T={rounds}")
    print(f"{'M':>3} {'term':>5} {'F_T mean':>9} {'F_T med':>8} {'G_T mean':>9} {'G_T med':>8} "
          f"{'E late':>7} {'F swing':>8} {'T2 med':>7}")
    for M in (1, 5, 10, 20):
        for col, terminate in enumerate((True, False)):
            r = simulate(seeds, rounds, M, terminate=terminate)
            F, G = r["forgetting"], r["generalisation"]
            late = rounds // 2
            swing = (F[:, late:].amax(1) - F[:, late:].amin(1)).mean()
            stop = r["stopped_at"].double().median() if terminate else float("nan")
            print(f"{M:>3} {str(terminate):>5} {F[:, -1].mean():9.3f} {F[:, -1].median():8.3f} "
                  f"{G[:, -1].mean():9.3f} {G[:, -1].median():8.3f} {r['error'][:, late:].mean():7.3f} "
                  f"{swing:8.3f} {stop:7.0f}")
            for row, curve in enumerate((F, G)):
                axes[row, col].plot(range(1, rounds + 1), curve.mean(0), label=f"M={M}")
    for col, title in enumerate(("with termination", "without termination")):
        axes[0, col].set_title(f"forgetting F_t, {title}")
        axes[1, col].set_title(f"generalisation error G_t, {title}")
        axes[1, col].set_xlabel("round t")
        axes[1, col].set_xscale("log")
    axes[0, 0].legend()
    fig.tight_layout()
    fig.savefig(output / "fig2.png", dpi=110)
    plt.close(fig)


def loads(seeds: list[int], rounds: int, output: Path) -> None:
    import matplotlib.pyplot as plt

    lam = SIGMA0 ** 1.25
    gammas = {"sigma0^0.75": SIGMA0 ** 0.75, "sigma0": SIGMA0, "sigma0^1.25": SIGMA0 ** 1.25,
              "sigma0^1.5": SIGMA0 ** 1.5}
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2), sharey=True)
    for tasks, reps, label in ((6, seeds, "Fig. 8 setting: M=5, N=6, K=3"),
                               (30, list(range(100)), "Fig. 9 setting: M=5, N=30, K=3, 100 runs")):
        print(f"\nApp. A.7, {label}, lam=sigma0^1.25={lam:.3f}, T={rounds}")
        print(f"{'Gamma':>12} {'value':>6} {'experts/cluster':>16} {'share entropy':>14} {'F_T':>7} {'G_T':>7}")
        for i, (name, gamma) in enumerate(gammas.items()):
            r = simulate(reps, rounds, 5, lam=lam, gamma=gamma, num_tasks=tasks)
            per_cluster, entropy = cluster_balance(r, 3)
            print(f"{name:>12} {gamma:6.3f} {per_cluster:16.2f} {entropy:14.3f} "
                  f"{r['forgetting'][:, -1].mean():7.3f} {r['generalisation'][:, -1].mean():7.3f}")
            if tasks == 6:
                start = max(int(r["stopped_at"][0]), r["explore"])
                clusters = r["clusters"][0][r["task"][0, start:]]
                experts = r["expert"][0, start:]
                for k in range(3):
                    share = torch.bincount(experts[clusters == k], minlength=5)
                    axes[i].bar(torch.arange(5) + 0.25 * (k - 1), share, width=0.25, label=f"cluster {k + 1}")
                axes[i].set_title(f"Gamma={name} ({'>' if gamma > lam + 1e-12 else '<='} lam)")
                axes[i].set_xlabel("expert")
    axes[0].set_ylabel("rounds after termination (seed 0)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(output / "loads.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--output", type=Path, default=Path("moe-theory-figures"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    torch.set_num_threads(1)
    args.output.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    fig2(list(range(args.seeds)), args.rounds, args.output)
    loads(list(range(args.seeds)), args.rounds, args.output)
    print(f"\nplots in {args.output}/ ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
