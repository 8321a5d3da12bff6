"""Leaderboard render speed: this checkout's renderer against a baseline revision's.

    python perf/render_speed.py                                    # leaderboards/fashion-mnist-split, base HEAD
    python perf/render_speed.py --board leaderboards/thesis --rounds 5 --base-rev HEAD~3
    python perf/render_speed.py --base /path/to/an/older/checkout  # a baseline checkout you made

``clbench leaderboard render`` on a copy of the board (never the board itself), each render a
fresh process pinned to one core (``taskset -c CORE``, one BLAS/torch thread), the baseline and
the current code alternating round by round so that load from other processes falls on both
alike; the best of the rounds is printed, and the ratio. The baseline is the code of
``--base-rev`` (default ``HEAD``: the committed renderer, against the working tree's edits),
checked out by ``git worktree add`` into a temporary folder that is removed afterwards, and
imported from there through ``PYTHONPATH``.

Each process reports its phases: importing the renderer, the whole render, the run pages
(``render_run_page``) within it, the PNGs drawn (``png_uri`` calls, and their seconds) and the
bytes of the pages written. Numbers are of one core: on a machine with more runnable processes
than cores they grow, but the ratio of the interleaved rounds holds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _child(board: str) -> None:
    """One render of ``board`` (a scratch copy), its phases as one JSON line on stdout."""
    start = time.perf_counter()
    from clbench.leaderboard import render as R

    imported = time.perf_counter()
    spent = {"pages": 0.0, "png": 0.0, "pngs": 0}

    def timed(fn, key, count=None):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - t
                if count:
                    spent[count] += 1
        return wrapper

    R.render_run_page = timed(R.render_run_page, "pages")
    R.png_uri = timed(R.png_uri, "png", "pngs")  # every figure the pages embed goes through it
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        R.render(board)
    done = time.perf_counter()
    pages = sum(p.stat().st_size for p in Path(board, "pages").glob("*.html"))
    print(json.dumps({"import": imported - start, "render": done - imported, "pages": spent["pages"],
                      "png": spent["png"], "pngs": spent["pngs"], "bytes": pages,
                      "module": R.__file__}))


def _run(code: Path | None, board: Path, scratch: Path, core: int) -> dict:
    copy = scratch / "board"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(board, copy)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MPLBACKEND": "Agg"}
    if code is not None:
        env["PYTHONPATH"] = str(code) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(copy)]
    if shutil.which("taskset"):
        command = ["taskset", "-c", str(core), *command]
    out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=scratch)
    if out.returncode:
        raise SystemExit(f"render failed ({code or 'current'}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    want = (code or REPO).resolve()
    if not Path(result["module"]).resolve().is_relative_to(want):
        raise SystemExit(f"imported {result['module']}, not the renderer under {want}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--board", default="leaderboards/fashion-mnist-split", help="a leaderboard folder (copied)")
    parser.add_argument("--base-rev", default="HEAD", help="git revision of the baseline renderer (default HEAD)")
    parser.add_argument("--base", help="a checkout of the baseline instead of a worktree of --base-rev")
    parser.add_argument("--rounds", type=int, default=3, help="renders of each, alternating (best is printed)")
    parser.add_argument("--core", type=int, default=max(0, (os.cpu_count() or 1) - 1), help="the core to pin to")
    parser.add_argument("--no-base", action="store_true", help="time the current renderer only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0

    board = (REPO / args.board).resolve()
    with tempfile.TemporaryDirectory(prefix="render-speed-") as tmp:
        tmp = Path(tmp)
        base, worktree = None, None
        if not args.no_base:
            if args.base:
                base = Path(args.base).resolve()
            else:
                worktree = tmp / "base"
                subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(worktree),
                                args.base_rev], check=True)
                base = worktree
        try:
            results: dict[str, list[dict]] = {"base": [], "current": []}
            for k in range(args.rounds):
                order = [("base", base), ("current", None)] if base else [("current", None)]
                for name, code in order if k % 2 == 0 else order[::-1]:
                    (tmp / name).mkdir(exist_ok=True)
                    results[name].append(_run(code, board, tmp / name, args.core))
        finally:
            if worktree is not None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"render {args.board}: best of {args.rounds} rounds, one process each, pinned to core {args.core} "
          f"(OMP_NUM_THREADS=1); load average {load:.2f} on {os.cpu_count()} cores")
    print(f"{'':<10}{'import s':>10}{'render s':>10}{'pages s':>10}{'PNGs':>7}{'PNG s':>9}{'pages MB':>10}")
    best = {}
    for name, runs in results.items():
        if not runs:
            continue
        b = min(runs, key=lambda r: r["render"])
        best[name] = b
        label = f"{name} ({args.base_rev})" if name == "base" and not args.base else name
        print(f"{label:<10}{b['import']:>10.2f}{b['render']:>10.2f}{b['pages']:>10.2f}{b['pngs']:>7d}{b['png']:>9.2f}"
              f"{b['bytes'] / 1e6:>10.2f}")
    if "base" in best:
        print(f"speed-up: render x{best['base']['render'] / best['current']['render']:.1f}, run pages "
              f"x{best['base']['pages'] / max(best['current']['pages'], 1e-9):.1f}, PNGs {best['base']['pngs']} -> "
              f"{best['current']['pngs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
