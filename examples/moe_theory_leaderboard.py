"""The theory paper's figures from a moe-theory leaderboard's entries (runner path):

    python examples/moe_theory_leaderboard.py leaderboards/moe-theory

For every number of experts M and termination on/off, the forgetting ``F_t`` and generalisation
error ``G_t`` curves (Eqs. 15-16, from each entry's R matrix of model errors), mean over the
suite's seeds, go into ``DIR/curves.png``; the final ``F_T`` and ``G_T`` (mean ± sample std over
seeds) and the off/on ratios are printed as a markdown table (quoted in docs/moe-theory.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import torch

from clbench.metrics.theory import forgetting_curve, generalisation_curve
from clbench.results.record import Status


def curves(board: Path) -> dict[tuple[int, bool], list[tuple[torch.Tensor, torch.Tensor]]]:
    """``(M, terminate) -> [(F_t, G_t) per seed]`` from the folder's finished entries."""
    out: dict[tuple[int, bool], list] = defaultdict(list)
    for path in sorted((board / "entries").glob("*.json")):
        entry = json.loads(path.read_text())
        if entry.get("status") != Status.OK:
            continue
        cfg = entry["config"]
        key = (int(cfg["model"]["init_args"]["num_experts"]), bool(cfg["strategy"]["init_args"]["terminate"]))
        r = torch.tensor(entry["r_matrix"], dtype=torch.float64)
        out[key].append((forgetting_curve(r), generalisation_curve(r)))
    return dict(sorted(out.items()))


def _stat(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def table(runs: dict) -> str:
    lines = ["| M | termination | seeds | F_T | G_T | F_T off / on | G_T off / on |", "|---|---|---|---|---|---|---|"]
    finals = {key: ([float(f[-1]) for f, _ in v], [float(g[-1]) for _, g in v]) for key, v in runs.items()}
    for (m, on), (f, g) in finals.items():
        ratio_f = ratio_g = "–"
        if on and (m, False) in finals:
            ratio_f = f"{statistics.fmean(finals[(m, False)][0]) / statistics.fmean(f):.2f}"
            ratio_g = f"{statistics.fmean(finals[(m, False)][1]) / statistics.fmean(g):.2f}"
        lines.append(f"| {m} | {'on' if on else 'off'} | {len(f)} | {_stat(f)} | {_stat(g)} | {ratio_f} | {ratio_g} |")
    return "\n".join(lines)


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    colours = dict(zip(sorted({m for m, _ in runs}), plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for (m, on), seeds in runs.items():
        for ax, k, name in ((axes[0], 0, "forgetting $F_t$"), (axes[1], 1, "generalisation error $G_t$")):
            mean = torch.stack([s[k] for s in seeds]).mean(0)
            rounds = range(1, len(mean) + 1)
            ax.plot(rounds, mean, color=colours[m], linestyle="-" if on else "--",
                    label=f"M={m}, termination {'on' if on else 'off'}")
            ax.set_xlabel("round t")
            ax.set_ylabel(name)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"moe-theory leaderboard: mean over {len(next(iter(runs.values())))} seeds (runner path)")
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("board", type=Path, help="leaderboard folder (with entries/)")
    args = parser.parse_args()
    runs = curves(args.board)
    if not runs:
        raise SystemExit(f"no finished entries in {args.board / 'entries'}")
    plot(runs, args.board / "curves.png")
    print(table(runs))
    print(f"\nwrote {args.board / 'curves.png'}")


if __name__ == "__main__":
    main()
