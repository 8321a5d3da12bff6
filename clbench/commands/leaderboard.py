"""``clbench leaderboard run|render``: run a suite into a leaderboard directory, render it.

``run`` with no arguments runs the quickstart suite into ``./leaderboard``; rerunning it does
only what is missing. ``render`` writes ``README.md`` and ``index.html`` into the directory.
"""

from __future__ import annotations

import argparse

DEFAULT_OUTPUT = "leaderboard"


def register(sub) -> None:
    p = sub.add_parser("leaderboard", help="run a suite into a leaderboard directory, render its tables and page")
    lb = p.add_subparsers(dest="leaderboard_command", metavar="ACTION", required=True)
    run = lb.add_parser("run", help="run the suite's missing entries and print the leaderboard",
                        description="Run every grid point of a suite that has no entry yet in the output directory "
                                    "(interrupt and rerun freely), then print the leaderboard. Several processes may "
                                    "run into one directory at once: each grid point is locked while it runs.")
    run.add_argument("--suite", "-s", help="suite YAML (default: configs/suites/quickstart.yaml)")
    run.add_argument("--output", "-o", default=DEFAULT_OUTPUT,
                     help=f"leaderboard directory (default: {DEFAULT_OUTPUT})")
    run.add_argument("--retry-failed", action="store_true", help="rerun grid points whose entry says 'failed'")
    run.add_argument("--force", action="store_true",
                     help="rerun every grid point from scratch, replacing its entry when the new run ends "
                          "(after changing code: entries are named by config, not by code)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar (one line per run is still printed)")
    run.set_defaults(handler=handle_run)
    render = lb.add_parser("render", help="write README.md and index.html from a leaderboard directory's entries")
    render.add_argument("dir", nargs="?", default=DEFAULT_OUTPUT,
                        help=f"leaderboard directory (default: {DEFAULT_OUTPUT})")
    render.set_defaults(handler=handle_render)


def handle_run(args: argparse.Namespace) -> int:
    from clbench.leaderboard.entries import load_entries
    from clbench.leaderboard.suite import default_suite_path, load_suite
    from clbench.leaderboard.table import build_tables, console_for_tables, print_tables

    suite = load_suite(args.suite or default_suite_path())
    console = console_for_tables()
    from clbench.leaderboard.execute import run_suite  # after the suite is known to be valid

    outcome = run_suite(suite, args.output, progress=not args.no_progress, retry_failed=args.retry_failed,
                        force=args.force, console=console)
    hashes = [r.hash for r in suite.runs]
    print_tables(build_tables(load_entries(args.output, hashes), hashes, source=args.output), console)
    done = len(outcome.ran) + len(outcome.resumed) + len(outcome.recovered)
    elsewhere = f", {len(outcome.elsewhere)} finished by another process" if outcome.elsewhere else ""
    console.print(f"{done} ran, {len(outcome.failed)} failed, {len(outcome.skipped)} already done{elsewhere}; "
                  f"render with: clbench leaderboard render {args.output}", highlight=False)
    return 0


def handle_render(args: argparse.Namespace) -> int:
    from clbench.leaderboard.render import render

    readme, index = render(args.dir)
    print(f"wrote {readme} and {index}")
    return 0
