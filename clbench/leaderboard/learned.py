"""Which tasks each method learned: R's diagonal per task against the untrained score and a floor.

A continual-learning score reads forgetting off R's rows, but a method that never learned a task
has nothing to forget: its BWT near 0 says nothing. Before comparing methods a reader needs, per
task, the score right after training on it (R's diagonal: its mean over the runs, the lowest in
brackets) and after the last task, and in how many (order, task) pairs the diagonal clears

* the untrained model's score on the task (``r_init``) by more than twice the difference's
  standard error (both test-set errors, ``r_stderr`` and ``r_init_stderr``); and
* where given, a floor: the score a model reaches without the task's rule, such as the share of
  the test set's commonest answer (a model that learned the format only answers one letter for
  every prompt), by more than twice the diagonal's standard error. The floor is a fact of the
  same test set, not an estimate, so it adds no error of its own.

Entries that recorded no test-set error (result schema 1) count as "—".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from clbench.leaderboard.table import BenchmarkTable, Row

SIGMAS = 2  # "clears": by more than this many standard errors


@dataclass
class TaskRecord:
    """One row's figures for one task over its runs."""

    diagonal: list[float] = field(default_factory=list)
    final: list[float] = field(default_factory=list)
    above_untrained: int | None = 0  # None: some run recorded no test-set error
    above_floor: int | None = 0


def task_names(table: BenchmarkTable) -> list[str]:
    """The table's tasks in the stream's first order (the first entry of the table's first order)."""
    for order in table.orders:
        for row in table.rows:
            for e in row.ok:
                if e.order_label == order:
                    return list(e.experiences)
    return []


def learned(row: Row, floor: dict[str, float] | None = None) -> dict[str, TaskRecord]:
    """``row``'s :class:`TaskRecord` per task name; ``floor`` maps a task to its floor (a fraction)."""
    out: dict[str, TaskRecord] = {}
    for e in row.ok:
        if len(e.r_matrix) != len(e.experiences):  # one stage over every task (joint): no diagonal
            continue
        known = e.r_stderr is not None and e.r_init_stderr is not None
        for i, task in enumerate(e.experiences):
            rec = out.setdefault(task, TaskRecord())
            value = e.r_matrix[i][i]
            rec.diagonal.append(value)
            rec.final.append(e.r_matrix[-1][i])
            if not known:
                rec.above_untrained = rec.above_floor = None
                continue
            se = e.r_stderr[i][i]
            if rec.above_untrained is not None:
                rec.above_untrained += value - e.r_init[i] > SIGMAS * math.hypot(se, e.r_init_stderr[i])
            if rec.above_floor is not None and floor is not None:
                rec.above_floor += value - floor[task] > SIGMAS * se
    return out
