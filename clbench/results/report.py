"""Terminal rendering of a run's result (rich).

Written to a pipe or a log file, rich would assume 80 columns and cut the R matrix of a long
stream; there the console is made as wide as the widest table instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from clbench.metrics.score_registry import REPORT_SCORES, r_percent, score
from clbench.results.record import single_stage


def _shown(value, percent: bool = True) -> str:
    """A percentage as ``85.1``; a value in a unit of its own (a squared error) as ``2.34``."""
    if value is None:
        return "—"
    return f"{100 * value:.1f}" if percent else f"{value:.3g}"


def _computed(env: dict) -> str:
    """`` · 32-true, AVX2 kernels (pinned)``: what a CPU run's last bits depend on, which a language
    model's default precision (bf16-mixed where the CPU has bf16 units) makes machine-dependent."""
    cpu = env.get("cpu")
    if env.get("cuda") or not isinstance(cpu, dict):
        return ""
    pinned = " (pinned)" if cpu.get("pin") else ""
    return f" · {env.get('precision') or '32-true'}, {cpu.get('isa')} kernels{pinned}"


def print_result(result: dict, output: Path | None = None, console=None) -> None:
    from rich.table import Table

    names = result["experiences"]
    r_names, recorded = (result.get("r_metric") or {}).get("names"), result.get("metrics")
    percent = r_percent(r_names, recorded)
    unit = "%" if percent else ", ".join(dict.fromkeys(r_names or []))
    title = (f"{result['strategy']['name']} on {result['benchmark']['name']} · order {result['order_label']} · "
             f"seed {result['seed']}{_computed(result.get('env') or {})}")
    table = Table(title=f"R matrix ({unit}), {title}", title_justify="left")
    table.add_column("after \\ test")
    for name in names:
        table.add_column(name, justify="right")
    table.add_row("init", *[_shown(v, percent) for v in result["r_init"]], style="dim")
    stage_names = ["joint"] if single_stage(result) else names
    for stage, row in zip(stage_names, result["r_matrix"]):
        table.add_row(stage, *[_shown(v, percent) for v in row])
    scores = result["scores"]
    # undefined scores (IM and FWT (ref) without reference models) are left out; the rest are in result.json
    keys = [k for k in REPORT_SCORES if scores.get(k) is not None]
    summary = Table(title=f"scores ({unit}, BWT < 0 means forgetting)", title_justify="left", show_edge=False)
    trace = (result.get("objective") or {}).get("scoring") == "trace"
    for key in keys:
        summary.add_column("OP (TRACE)" if key == "acc" and trace else key, justify="right")
    summary.add_row(*[_shown(scores[k], score(k, r_names, recorded).percent) for k in keys])
    console = console or _console_for(table, summary)
    console.print(table)
    console.print(summary)
    if output is not None:
        console.print(f"wrote {output / 'result.json'} in {result['compute']['wall_seconds']:.1f}s")


def _console_for(*tables):
    """The terminal's console; off a terminal (and without COLUMNS set), one wide enough that
    no table is cut or wrapped."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    unbounded = console.options.update_width(1_000_000)
    width = max(Measurement.get(console, unbounded, t).maximum for t in tables)
    return Console(width=max(width, console.width))
