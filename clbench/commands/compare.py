"""``clbench compare [DIR]``: strategies across task orders (per-order scores, tau, paired test)."""

from __future__ import annotations

import argparse

from clbench.commands.leaderboard import DEFAULT_OUTPUT


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare strategies across task orders: worst order, range, Kendall's tau, "
                                       "paired test",
                       description="Per benchmark: each strategy's score per task order, mean ± std over orders, "
                                   "worst order and range; Kendall's tau between the per-order rankings; a paired "
                                   "test between two strategies (default: the two best).")
    p.add_argument("dir", nargs="?", default=DEFAULT_OUTPUT, help=f"leaderboard directory (default: {DEFAULT_OUTPUT})")
    p.add_argument("--metric", "-m", default="acc", help="score to compare (default: acc)")
    p.add_argument("--benchmark", help="one benchmark only")
    p.add_argument("--a", help="first strategy of the paired test")
    p.add_argument("--b", help="second strategy of the paired test")
    p.add_argument("--json", metavar="PATH", help="also write the comparison as JSON")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from clbench.io import write_json
    from clbench.leaderboard.compare import compare, print_comparison
    from clbench.leaderboard.entries import load_entries
    from clbench.leaderboard.execute import manifest_hashes

    suite = manifest_hashes(args.dir)  # with a suite manifest, compare the suite's grid only
    report = compare(load_entries(args.dir, suite), metric=args.metric, benchmark=args.benchmark, a=args.a, b=args.b,
                     sequence=suite)
    print_comparison(report)
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    return 0
