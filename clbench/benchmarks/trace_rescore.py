"""Both scorings of TRACE runs from their recorded generations: how far TRACE's own scoring
(``scoring: trace``) and the lenient one (``scoring: normalized``) put the same outputs apart.

    python -m clbench.benchmarks.trace_rescore PATH [PATH ...]

``PATH`` is a run folder (``result.json`` beside ``predictions/<task>.jsonl``, as ``clbench run``
writes it) or a leaderboard directory, whose runs' generations stay in ``runs/<hash>/predictions/``
on the machine that ran ``clbench leaderboard run`` (entries record where, not the texts, and
``runs/`` is not committed). Prints, per task, the mean over runs of the final model's score
under each scoring and their difference, and the same for OP (the mean over tasks).

Only the final stage's generations are kept, so this rescores the last row of R (the per-task
columns and OP of the papers' tables), not BWT. A run scored ``normalized`` recorded its
generations stripped: its ``trace`` scores then miss what surrounding whitespace would have cost
(a small overestimate); a ``trace`` run's generations are as decoded, so both scorings are exact
(the lenient metrics strip by themselves).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clbench.errors import UserError
from clbench.results.record import Status

FIX = "give run folders written by 'clbench run', or a leaderboard directory that still holds its runs/ folder"


def _runs(path: Path) -> list[tuple[str, dict, Path]]:
    """(label, result or entry, folder its ``predictions`` paths are relative to) of each run under ``path``."""
    if (path / "result.json").is_file():
        return [(str(path), json.loads((path / "result.json").read_text(encoding="utf-8")), path)]
    if (path / "entries").is_dir():
        runs = []
        for file in sorted((path / "entries").glob("*.json")):
            entry = json.loads(file.read_text(encoding="utf-8"))
            if entry.get("status") == Status.OK:
                label = f"{entry['strategy']['name']} {entry.get('order_label', '')} seed {entry.get('seed')}"
                runs.append((label, entry, path / "runs" / str(entry.get("config_hash"))))
        return runs
    raise UserError("neither a run folder (result.json) nor a leaderboard directory (entries/)", where=str(path),
                    fix=FIX)


def _rows(file: Path) -> list[dict]:
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]


def rescore(paths: list[str | Path]) -> tuple[dict[str, dict[str, list[float]]], list[str]]:
    """({task: {"trace": [...], "normalized": [...]}} over the runs that kept generations, the
    runs passed over for want of them)."""
    from clbench.metrics.text import TEXT_METRICS, TRACE_SCORINGS

    scores: dict[str, dict[str, list[float]]] = {}
    missing = []
    for path in paths:
        for label, result, folder in _runs(Path(path)):
            files = (result.get("objective") or {}).get("predictions") or {}
            tasks = [t for t in files if t in TRACE_SCORINGS["trace"]]
            if not tasks or not all((folder / files[t]).is_file() for t in tasks):
                missing.append(label)
                continue
            for task in tasks:
                rows = _rows(folder / files[task])
                preds, refs, prompts = ([r[k] for r in rows] for k in ("prediction", "answer", "prompt"))
                for scoring, metrics in TRACE_SCORINGS.items():
                    values = TEXT_METRICS[metrics[task]]().sample_scores(preds, refs, prompts)
                    scores.setdefault(task, {"trace": [], "normalized": []})[scoring].append(
                        sum(values) / len(values) if values else float("nan"))
    return scores, missing


def table(scores: dict[str, dict[str, list[float]]]) -> str:
    """Markdown: per task and for OP, the mean over runs of each scoring and their difference (points)."""
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    lines = ["| task | runs | trace | normalized | normalized − trace |", "|---|---:|---:|---:|---:|"]
    for task, by in scores.items():
        t, n = mean(by["trace"]), mean(by["normalized"])
        lines.append(f"| {task} | {len(by['trace'])} | {100 * t:.1f} | {100 * n:.1f} | {100 * (n - t):+.1f} |")
    counts = {len(by["trace"]) for by in scores.values()}
    if len(counts) == 1:  # every run has every task: a run's OP is the mean of its tasks
        n = counts.pop()
        op = {s: mean([mean([by[s][i] for by in scores.values()]) for i in range(n)]) for s in ("trace", "normalized")}
        lines.append(f"| OP | {n} | {100 * op['trace']:.1f} | {100 * op['normalized']:.1f} | "
                     f"{100 * (op['normalized'] - op['trace']):+.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clbench.benchmarks.trace_rescore",
                                     description="Score TRACE runs' recorded generations both ways.")
    parser.add_argument("paths", nargs="+", help="run folders or leaderboard directories")
    args = parser.parse_args(argv)
    try:
        scores, missing = rescore(args.paths)
        if not scores:
            raise UserError(f"no run with recorded generations ({len(missing)} without)", where=" ".join(args.paths),
                            fix=FIX)
    except UserError as err:
        print(f"clbench: error: {err.one_line()}", file=sys.stderr)
        return err.exit_code
    print(table(scores))
    if missing:
        print(f"\n{len(missing)} run(s) without recorded generations left out: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
