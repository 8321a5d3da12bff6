"""How a leaderboard table's cells are written: a score with its interval, the runs count, the group letters.

Shared by every view of a table (the terminal, ``README.md``, ``index.html``, doc fragments), so
that a number reads the same in each.
"""

from __future__ import annotations

from clbench.leaderboard.table import BenchmarkTable, Row, Stat
from clbench.metrics.score_registry import Score, score as score_meta, shown


def number(value: float | None, score: str | Score | None = None, digits: int = 1) -> str:
    """One value of ``score`` as shown: ``85.1`` (percent), a plain score ``2.41``, or an em dash.
    ``score`` is a built-in key or a table's :meth:`BenchmarkTable.score` (any score)."""
    percent = score is None or (score.percent if isinstance(score, Score) else score_meta(score).percent)
    return shown(value, percent, digits)


TEST_SET_MARK = "‡"  # a one-run interval: its test set's alone


def fmt(stat: Stat | None, digits: int = 1, score: str | Score | None = None) -> str:
    """``85.1 ± 1.2`` in percent (a plain score: ``2.41 ± 0.10``), ± the 95% interval's
    half-width; an interval a bound of the score cut by its ends, ``25.0 [0.0, 81.9]``; one
    unit: ``41.3 ± 2.0‡`` (its test set's interval) or the mean alone; no value shows an em dash."""
    if stat is None:
        return "—"
    mean = number(stat.mean, score, digits)
    if stat.half is None:
        return mean
    if stat.cut:
        return (f"{mean} [{number(stat.low, score, digits)}, {number(stat.high, score, digits)}]"
                + (TEST_SET_MARK if stat.from_test_set else ""))
    return f"{mean} ± {number(stat.half, score, digits)}" + (TEST_SET_MARK if stat.from_test_set else "")


def runs_cell(row: Row) -> str:
    return f"{len(row.ok)}" + (f" (+{len(row.failed)} failed)" if row.failed else "")


def group_cell(table: BenchmarkTable, row: Row) -> str:
    """The row's group letters (— where it has none: no runs, or no groups formed)."""
    return (table.groups.letters.get(row.label) if table.groups else None) or "—"
