"""``clbench compare [DIR]``: strategies across task orders (per-order scores, tau, paired test)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from clbench.cli.leaderboard import DEFAULT_OUTPUT
from clbench.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare strategies across task orders: worst order, range, Kendall's tau, "
                                       "paired test",
                       description="Per benchmark: each strategy's score per task order, mean ± 95% interval over "
                                   "task orders and its rank group (paired t-tests with Holm's correction, as the "
                                   "leaderboard's tables), mean ± std over orders, worst order and range; Kendall's tau "
                                   "between the per-order rankings; a paired test between two strategies (default: the "
                                   "two best) with its power.")
    p.add_argument("dir", nargs="?", default=DEFAULT_OUTPUT, help=f"leaderboard directory (default: {DEFAULT_OUTPUT})")
    p.add_argument("--metric", "-m", default="acc", help="score to compare (default: acc)")
    p.add_argument("--benchmark", help="one benchmark only")
    p.add_argument("--a", help="first strategy of the paired test")
    p.add_argument("--b", help="second strategy of the paired test")
    p.add_argument("--plan", action="store_true",
                   help="also plan the paired test: the task orders it needs for 80%% power (at α = 0.05 planned, "
                        "and at the table's Holm level) and what they cost in machine hours, from the entries")
    p.add_argument("--gap", type=gap, metavar="G",
                   help="with --plan: the difference to plan for, as tables show it (points for a percentage, "
                        "e.g. a paper's 6.7); default the observed one")
    p.add_argument("--json", metavar="PATH", help="also write the comparison as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write it as Markdown tables to paste (groups, 95%% "
                                                      "intervals, every pair's test); '-' prints them instead of the "
                                                      "terminal tables")
    p.set_defaults(handler=handle)


def gap(text: str) -> float:
    import math

    value = float(text)  # argparse words a ValueError as "invalid gap value"
    if not math.isfinite(value) or value <= 0:
        raise ValueError(text)
    return value


def check_writable(path: str | Path, where: str) -> None:
    """Refuse, before any work, a JSON destination that cannot be written: a folder, a path
    through a file, or a place without write permission. Missing folders are created later."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a folder", where=where, fix=f"give a file name, e.g. {path / 'compare.json'}")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"cannot write {path}: {parent} is a file, not a folder", where=where,
                        fix="give a path inside a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {path}: no permission to write in {parent}", where=where,
                        fix="give a path in a folder you can write to")


def handle(args: argparse.Namespace) -> int:
    from clbench.api import compare
    from clbench.io import write_json, write_text
    from clbench.leaderboard.compare import comparison_markdown, print_comparison
    from clbench.leaderboard.manifest import left_out

    if args.json:
        check_writable(args.json, "--json")
    if args.markdown and args.markdown != "-":
        check_writable(args.markdown, "--markdown")
    if args.gap is not None and not args.plan:
        raise UserError("--gap is the difference a plan is made for", where="--gap", fix="add --plan")
    report = compare(args.dir, metric=args.metric, benchmark=args.benchmark, a=args.a, b=args.b, plan=args.plan,
                     gap=args.gap)
    note = left_out(args.dir)
    if note:  # on stderr: stdout stays the report (--markdown - pipes it)
        print(note, file=sys.stderr)
    if args.markdown == "-":
        print(comparison_markdown(report), end="")
    else:
        print_comparison(report)
    if args.markdown and args.markdown != "-":
        try:
            write_text(args.markdown, comparison_markdown(report))
        except OSError as err:
            raise UserError(f"cannot write {args.markdown}: {err.strerror or err}", where="--markdown",
                            fix="give a path in a folder you can write to") from None
        print(f"wrote {args.markdown}")
    if args.json:
        try:
            write_json(args.json, report)  # creates missing folders
        except OSError as err:
            raise UserError(f"cannot write {args.json}: {err.strerror or err}", where="--json",
                            fix="give a path in a folder you can write to") from None
        print(f"wrote {args.json}")
    return 0
