"""``clbench leaderboard run|render|verify``: run a suite into a leaderboard directory, render it, rerun it.

``run`` with no arguments runs the quickstart suite into ``./leaderboard``; rerunning it does
only what is missing. ``--launcher local|slurm`` spreads the grid over worker processes or
cluster jobs (docs/cluster.md). ``render`` writes ``README.md`` and ``index.html`` into the
directory. ``verify`` reruns entries and compares their numbers with the committed ones.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from clbench.cli import check_folder
from clbench.errors import UserError

DEFAULT_OUTPUT = "leaderboard"
LAUNCHERS = ("serial", "local", "slurm", "submitit-local")
CLUSTER_LAUNCHERS = ("slurm", "submitit-local")
_SBATCH_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def register(sub) -> None:
    p = sub.add_parser("leaderboard", help="run a suite into a leaderboard directory, render its tables and page")
    lb = p.add_subparsers(dest="leaderboard_command", metavar="ACTION", required=True)
    run = lb.add_parser("run", help="run the suite's missing entries, print the leaderboard and write its page",
                        description="Run every grid point of a suite that has no entry yet in the output directory "
                                    "(interrupt and rerun freely), then print the leaderboard and write its README.md "
                                    "and index.html there. Several processes may run into one directory at once: "
                                    "each grid point is locked while it runs.")
    run.add_argument("--suite", "-s", help="suite YAML (default: configs/suites/quickstart.yaml)")
    run.add_argument("--output", "-o", default=DEFAULT_OUTPUT,
                     help=f"leaderboard directory (default: {DEFAULT_OUTPUT})")
    run.add_argument("--retry-failed", action="store_true", help="rerun grid points whose entry says 'failed'")
    run.add_argument("--force", action="store_true",
                     help="rerun every grid point from scratch, replacing its entry when the new run ends "
                          "(after changing code: entries are named by config, not by code)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar (one line per run is still printed)")
    run.add_argument("--no-render", action="store_true",
                     help="do not write README.md and index.html at the end (render later with "
                          "'clbench leaderboard render DIR')")
    run.add_argument("--allow-dirty", action="store_true",
                     help="write entries into a folder of clbench's own repository even though tracked files have "
                          "uncommitted changes (the entries record it; render marks them, verify cannot rerun them)")
    grid = run.add_argument_group("launchers", "where the grid points run (docs/cluster.md)")
    grid.add_argument("--launcher", choices=LAUNCHERS, default="serial",
                      help="serial: one after another in this process (default); local: --jobs worker processes; "
                           "slurm: one job-array task per grid point; submitit-local: the slurm path on this machine")
    grid.add_argument("--jobs", "-j", type=int, metavar="N",
                      help="local: worker processes at once (default: one per GPU, else CPUs / threads); "
                           "slurm: array tasks at once")
    grid.add_argument("--partition", help="slurm partition")
    grid.add_argument("--gpus-per-job", type=int, metavar="N", help="GPUs per slurm job (gpus_per_node)")
    grid.add_argument("--cpus-per-job", type=int, metavar="N", help="CPUs per slurm job (default: the suite's threads)")
    grid.add_argument("--time-min", type=int, metavar="MIN", help="slurm time limit per job in minutes (default 60)")
    grid.add_argument("--mem-gb", type=float, metavar="GB", help="memory per slurm job")
    grid.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                      help="extra '#SBATCH --KEY=VALUE' line (repeatable), e.g. account=myproject")
    grid.add_argument("--no-wait", action="store_true",
                      help="slurm: submit and return; rerun the same command later to collect the results")
    run.set_defaults(handler=handle_run)
    render = lb.add_parser("render", help="write README.md and index.html from a leaderboard directory's entries")
    render.add_argument("dir", nargs="?", default=DEFAULT_OUTPUT,
                        help=f"leaderboard directory (default: {DEFAULT_OUTPUT})")
    render.set_defaults(handler=handle_render)
    verify = lb.add_parser(
        "verify", help="rerun a leaderboard's entries from their recorded configs and compare the numbers",
        description="Rerun entries of a leaderboard directory from their recorded configs (in a temporary folder; "
                    "DIR is only read) and compare their R matrices and scores with the committed ones. One line "
                    "per entry: ok, differs by X at R[i][j], or cannot rerun: why. Exit status 0 if every entry is "
                    "ok, 1 otherwise, 2 on bad input.")
    verify.add_argument("dir", help="leaderboard directory (e.g. leaderboard)")
    verify.add_argument("ids", nargs="*", metavar="ENTRY_ID",
                        help="entries to verify: config hashes (file names) or unique prefixes (default: all)")
    verify.add_argument("--sample", type=int, metavar="N",
                        help="verify only the N cheapest ok entries (least recorded wall time, ties by hash)")
    verify.add_argument("--tolerance", type=float, default=0.0, metavar="T",
                        help="largest absolute difference accepted (default 0: exact, for the machine class that "
                             "made the entries; CPU rounding differs between CPUs and torch builds)")
    verify.add_argument("--same-code", action="store_true",
                        help="refuse (cannot rerun) entries made by a commit whose code differs from the checkout's, "
                             "instead of rerunning them with the checked-out code")
    verify.add_argument("--trust-code", action="store_true",
                        help="rerun entries whose configs name code that is not a registered component of an installed "
                             "package (a .py file, any import path), or ask more than their suite: only for a folder "
                             "whose code you trust, as rerunning imports and runs it")
    verify.set_defaults(handler=handle_verify)


def _slurm_options(text: list[str]) -> dict:
    options = {}
    for item in text:
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not eq or not _SBATCH_KEY.match(key) or not value.strip():
            raise UserError(f"expected KEY=VALUE, got {item!r}", where="--slurm-option",
                            fix="write e.g. --slurm-option account=myproject (one sbatch option each)")
        options[key] = value.strip()
    return options


def check_launcher_args(args: argparse.Namespace) -> dict:
    """The command line's launcher options, checked (one-line errors); returns the slurm ones."""
    launcher = args.launcher
    cluster = {"partition": args.partition, "gpus_per_node": args.gpus_per_job, "cpus_per_task": args.cpus_per_job,
               "timeout_min": args.time_min, "mem_gb": args.mem_gb, "jobs": args.jobs,
               "additional": _slurm_options(args.slurm_option)}
    flags = {"--partition": args.partition, "--gpus-per-job": args.gpus_per_job, "--cpus-per-job": args.cpus_per_job,
             "--time-min": args.time_min, "--mem-gb": args.mem_gb, "--slurm-option": args.slurm_option or None,
             "--no-wait": args.no_wait or None}
    for flag, value in flags.items():
        if value is not None and launcher not in CLUSTER_LAUNCHERS:
            raise UserError(f"{flag} applies to the slurm launcher only", where=flag,
                            fix="add --launcher slurm, or leave it out")
    if args.jobs is not None:
        if launcher == "serial":
            raise UserError("the serial launcher runs one grid point at a time", where="--jobs",
                            fix="add --launcher local to run several at once")
        if args.jobs < 1:
            raise UserError(f"expected at least 1, got {args.jobs}", where="--jobs", fix="e.g. --jobs 4")
    for flag, value, least in (("--gpus-per-job", args.gpus_per_job, 0), ("--cpus-per-job", args.cpus_per_job, 1),
                               ("--time-min", args.time_min, 1)):
        if value is not None and value < least:
            raise UserError(f"expected at least {least}, got {value}", where=flag, fix="give a whole number")
    if args.mem_gb is not None and not args.mem_gb > 0:
        raise UserError(f"expected a positive number of GB, got {args.mem_gb}", where="--mem-gb", fix="e.g. --mem-gb 32")
    return cluster


def handle_run(args: argparse.Namespace) -> int:
    from clbench.leaderboard.entries import entries_dir, load_entries
    from clbench.leaderboard.manifest import manifest_unranked
    from clbench.leaderboard.suite import default_suite_path, load_suite
    from clbench.leaderboard.table import build_tables
    from clbench.leaderboard.terminal import console_for_tables, print_tables

    check_folder(args.output, "--output")
    cluster = check_launcher_args(args)
    suite = load_suite(args.suite or default_suite_path())
    from clbench.leaderboard.cell import pin_kernels

    pin_kernels(suite.cpu_kernels, str(suite.path))  # before torch is imported: the serial runs hold it too
    console = console_for_tables()
    common = dict(progress=not args.no_progress, retry_failed=args.retry_failed, force=args.force,
                  allow_dirty=args.allow_dirty, console=console)
    if args.launcher == "local":
        from clbench.leaderboard.launch import default_jobs, run_local

        jobs = args.jobs or suite.launcher.get("local", {}).get("jobs") or default_jobs(suite)
        outcome = run_local(suite, args.output, jobs=jobs, **common)
    elif args.launcher in CLUSTER_LAUNCHERS:
        from clbench.leaderboard.slurm import cluster_options, run_cluster

        outcome = run_cluster(suite, args.output, launcher=args.launcher, options=cluster_options(suite, cluster),
                              wait=not args.no_wait, **common)
    else:
        from clbench.leaderboard.execute import run_suite  # after the suite is known to be valid

        outcome = run_suite(suite, args.output, **common)
    hashes = [r.hash for r in suite.runs]
    if not (outcome.ran or outcome.resumed or outcome.recovered or outcome.failed or outcome.submitted
            or outcome.elsewhere):
        # Every entry was already there (a fresh clone holds the committed ones): say so before the
        # table, or the numbers below read as if this command had just made them.
        console.print(f"nothing ran: all {len(hashes)} grid points already have an entry in {args.output}, so the "
                      f"table shows those entries; to run the suite yourself: clbench leaderboard run "
                      f"--output runs/{suite.name}", highlight=False)
    finished = entries_dir(args.output).is_dir()  # with --no-wait, maybe nothing has finished yet
    if finished:
        print_tables(build_tables(load_entries(args.output, hashes), hashes, source=args.output,
                                  unranked=manifest_unranked(args.output)), console)
    done = len(outcome.ran) + len(outcome.resumed) + len(outcome.recovered)
    elsewhere = f", {len(outcome.elsewhere)} finished by another process" if outcome.elsewhere else ""
    queued = f", {len(outcome.submitted)} still queued or running" if outcome.submitted else ""
    console.print(f"{done} ran, {len(outcome.failed)} failed, {len(outcome.skipped)} already done{elsewhere}{queued}",
                  highlight=False)
    from clbench.leaderboard.render import INDEX, README

    page = [Path(args.output) / README, Path(args.output) / INDEX]
    # paths are printed unwrapped (print, not the console), so that they can be copied whole
    if args.no_render or not finished:
        print(f"render the page with: clbench leaderboard render {args.output}", flush=True)
    elif done or outcome.elsewhere or not all(p.is_file() for p in page):
        _render(args.output, partial=bool(outcome.submitted))
    else:  # nothing new: leave the page as it is (a received folder may be read-only)
        print(f"no new entries, so the page is as it was: {page[0]}, {page[1]} (rewrite it with: "
              f"clbench leaderboard render {args.output})", flush=True)
    return 0


def _render(folder: str, partial: bool = False) -> None:
    """Write the folder's README.md and index.html and say where they are (and what they leave out)."""
    from clbench.leaderboard.manifest import left_out
    from clbench.leaderboard.render import DETAILS, render

    readme, index = render(folder)
    print(f"wrote {readme}, {index} and {index.parent / DETAILS}/"
          + (" (the runs still queued are missing: rerun the command to add them)" if partial else ""), flush=True)
    note = left_out(folder)
    if note:
        print(note, file=sys.stderr)


def handle_render(args: argparse.Namespace) -> int:
    check_folder(args.dir, "DIR")
    _render(args.dir)
    return 0


def handle_verify(args: argparse.Namespace) -> int:
    from clbench.leaderboard.verify import CANNOT, DIFFERS, NOISE, OK, Verifier, select

    check_folder(args.dir, "DIR")
    paths = select(args.dir, args.ids, args.sample)
    verifier = Verifier(tolerance=args.tolerance, same_code=args.same_code,  # checks --tolerance before any run
                        trust_code=args.trust_code)
    verifier.check(paths)  # every entry's code and bounds, before the first rerun
    if not paths:
        print(f"{args.dir}: no ok entries to verify")
        return 0
    counts = {OK: 0, NOISE: 0, DIFFERS: 0, CANNOT: 0}
    largest = 0.0
    for path in paths:
        verdict = verifier.verify(path)
        counts[verdict.status] += 1
        if verdict.largest is not None:
            largest = max(largest, verdict.largest)
        print(verdict.line, flush=True)
    noise = f", {counts[NOISE]} within noise" if counts[NOISE] else ""
    print(f"{len(paths)} verified: {counts[OK]} ok{noise}, {counts[DIFFERS]} differ, {counts[CANNOT]} cannot be "
          f"rerun; largest difference {largest:.3g}", flush=True)
    return 0 if counts[OK] + counts[NOISE] == len(paths) else 1
