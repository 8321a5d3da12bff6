"""The loop's state as checkpoints store it: a pass's fixed values (R's entries, their errors, the
test-set sizes) have fields of their own, apart from the metrics' names, and a checkpoint written
when they shared the metrics' mapping still resumes."""

from __future__ import annotations

from dataclasses import asdict

from clbench.engine.state import ColumnValues, RunState


def test_a_row_written_with_the_fixed_keys_among_the_metrics_reads_as_typed_values():
    old = {"stage": 1,
           "rows": [{"acc": [0.5, 0.25], "gmean": [0.4, 0.0], "primary": [0.5, 0.25],
                     "primary_stderr": [0.05, 0.04], "primary_n": [100, 100]}],
           "r_init": {"acc": [0.1, 0.1], "primary": [0.1, 0.1]},  # written before the errors were
           "global_rows": [{"gmean": 0.3, "primary": 0.3, "primary_stderr": None, "primary_n": 50}],
           "global_init": {"gmean": 0.0, "primary": 0.0}}
    state = RunState.from_dict(old)
    assert state.rows == [{"primary": [0.5, 0.25], "stderr": [0.05, 0.04], "n": [100, 100],
                           "metrics": {"acc": [0.5, 0.25], "gmean": [0.4, 0.0]}}]
    assert state.r_init == {"primary": [0.1, 0.1], "stderr": [None, None], "n": [None, None],
                            "metrics": {"acc": [0.1, 0.1]}}
    assert state.global_rows == [{"gmean": 0.3}] and state.global_init == {"gmean": 0.0}
    assert RunState.from_dict(asdict(state)) == state  # today's checkpoints read back unchanged
    assert ColumnValues.from_dict(state.rows[0]).metrics == {"acc": [0.5, 0.25], "gmean": [0.4, 0.0]}
