"""The leaderboard in the terminal: ``clbench leaderboard run`` and ``render`` print one rich
table per benchmark, with the notes of :mod:`clbench.leaderboard.notes`."""

from __future__ import annotations

from clbench.leaderboard.notes import gmean_note, groups_note, groups_text, unranked_note
from clbench.leaderboard.cell_text import fmt, runs_cell
from clbench.leaderboard.table import BenchmarkTable
from clbench.metrics.score_registry import CORE_SCORES


def console_for_tables():
    """A rich console; when output is not a terminal (CI logs, pipes), wide enough for the tables."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def print_tables(tables: list[BenchmarkTable], console=None) -> None:
    """The leaderboard in the terminal: one rich table per benchmark.

    A terminal too narrow for every score column gets the core ones (ACC to Forgetting) and a
    note naming the rest, rather than cells wrapped over three lines.
    """
    from rich import box
    from rich.table import Table
    from rich.text import Text

    console = console or console_for_tables()
    for t in tables:
        label_width = max([len(r.label) for r in t.rows] + [8])
        scores, narrow = t.scores, 30 + label_width + 14 * len(t.scores) > console.width
        if narrow:
            scores = [s for s in t.scores if s in CORE_SCORES]
        table = Table(title=f"{t.label}: mean ± 95% interval over task orders (%), {t.ranked_by()}",
                      title_justify="left", box=box.SIMPLE_HEAVY, padding=(0, 1))
        table.add_column("rank", justify="right")
        table.add_column("group", justify="center")
        table.add_column("strategy", style="bold", no_wrap=True)
        table.add_column("runs", justify="right")
        for score in scores:
            table.add_column(t.title(score), justify="right", no_wrap=True)
        if not narrow:
            table.add_column("wall s", justify="right")
        for row in t.rows:
            cells = [fmt(row.stats.get(s), score=t.score(s)) for s in scores]
            if narrow:
                cells = [c.replace(" ± ", "±") for c in cells]
            else:
                wall = row.wall_seconds
                cells.append(f"{wall:.1f}" if wall is not None else "—")
            group = (t.groups.letters.get(row.label) if t.groups else None) or "—"
            # a label is the entries' words (a received folder's): text, never rich markup
            table.add_row(str(row.rank or "—"), group, Text(row.label), runs_cell(row), *cells)
        console.print(table)
        for note in (groups_note(t), unranked_note(t), groups_text(t)):
            if note:  # plain text (the unranked reason is the suite's words): no rich markup read in it
                console.print(f"  {note}", style="dim", highlight=False, markup=False)
        hidden = [t.title(s) for s in t.scores if s not in scores] + (["wall time"] if narrow else [])
        if hidden:
            console.print(f"  (also {', '.join(hidden)}: widen the terminal, or see the rendered README.md)",
                          style="dim", highlight=False)
        note = gmean_note(t) if any(s in scores for s in ("gmean_final", "global_gmean")) else None
        if note:
            console.print(f"  {note}", style="dim", highlight=False)
    if not tables:
        console.print("no entries")
