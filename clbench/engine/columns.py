"""The test sets a run evaluates, and the columns of R they fill.

Every experience is one column of R. Experiences that share one test set (CORe50's NI
protocol tests every experience on the same held-out sessions) are evaluated once and that
set's values fanned out to each of their columns. A stream-wide test set, when the stream has
one, is evaluated last and reported apart from R. A shared test set is scored as its first
experience's column (its classes, its task), and routing is attributed to a test set's domain
only when the set belongs to one experience.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clbench.engine.state import ColumnValues


class EvalColumns:
    """The evaluated sets of a stream (``sets``: one per distinct test set, then the stream-wide
    one) and how their values map to R's columns."""

    def __init__(self, experiences: list, global_test: Any = None) -> None:
        self.test_sets: list = []
        self.column_of: list[int] = []  # per experience: the index of its test set
        owners: list[list] = []
        for exp in experiences:
            found = next((i for i, data in enumerate(self.test_sets) if data is exp.test), None)
            if found is None:
                self.test_sets.append(exp.test)
                owners.append([])
                found = len(self.test_sets) - 1
            owners[found].append(exp)
            self.column_of.append(found)
        self.global_test = global_test
        self.has_global_test = global_test is not None
        tail = [None] if self.has_global_test else []
        self.scored_as = [group[0] for group in owners] + tail  # the experience each evaluated set is scored as
        self.domains = [group[0].domain_id if len(group) == 1 else None for group in owners] + tail

    @property
    def sets(self) -> list:
        """What one evaluation reads, in loader order."""
        return self.test_sets + ([self.global_test] if self.has_global_test else [])

    def per_experience(self, values: list) -> list:
        """One value per evaluated set -> one per experience (shared test sets fanned out)."""
        return [values[i] for i in self.column_of]

    def global_value(self, values: list) -> Any:
        """The stream-wide test set's value (None without one)."""
        return values[len(self.test_sets)] if self.has_global_test else None

    def split(self, values: "ColumnValues") -> tuple["ColumnValues", dict[str, Any]]:
        """A pass's values (one per evaluated set) as one per experience (shared test sets fanned
        out), and the stream-wide test set's metrics (``{name: value}``; empty without one)."""
        from clbench.engine.state import ColumnValues

        pick = self.per_experience
        columns = ColumnValues(primary=pick(values.primary), stderr=pick(values.stderr), n=pick(values.n),
                               metrics={k: pick(v) for k, v in values.metrics.items()})
        global_ = {k: self.global_value(v) for k, v in values.metrics.items()} if self.has_global_test else {}
        return columns, global_
