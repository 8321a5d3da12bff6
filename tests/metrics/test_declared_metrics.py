"""A metric added in one place (a strategy's ``extra_metrics``) is computed on every test column,
recorded with the direction its class declares, and ranked that way by tables, pages and
comparisons; a metric whose direction nobody declares is refused."""

from __future__ import annotations

import pytest
from torchmetrics import Metric
from torchmetrics.classification import MulticlassHammingDistance

from clbench import Strategy
from clbench.errors import UserError
from clbench.metrics import declare
from helpers import tiny_config, typed_entries


class HammingNaive(Strategy):
    """Plain fine-tuning that also reports the Hamming distance (the error rate; torchmetrics
    declares ``higher_is_better = False``) on every test column: the one place it is added."""

    extra_metrics = (declare("hamming", MulticlassHammingDistance,
                             lambda objective: MulticlassHammingDistance(objective.num_classes, average="micro"),
                             title="Hamming"),)


def test_an_added_lower_is_better_metric_is_recorded_and_ranked_lower_first():
    import clbench
    from clbench.leaderboard.compare import compare
    from clbench.leaderboard.entries import entry_from_result
    from clbench.leaderboard.render import _table_context
    from clbench.leaderboard.table import build_tables

    entries = []
    for lr in (0.01, 1e-5):  # two rows: a trained model and one that barely moves
        cfg = tiny_config(strategy={"class_path": f"{__file__}:HammingNaive"},
                          train={"optimizer": {"init_args": {"lr": lr}}},
                          benchmark={"init_args": {"domains": ["rot0", "rot90"]}})
        result = clbench.run(cfg).record
        assert result["metrics"]["hamming"] == {"title": "Hamming", "higher_is_better": False, "percent": True,
                                                "class": "torchmetrics.classification.hamming:"
                                                         "MulticlassHammingDistance"}
        final = result["matrices"]["hamming"][-1]
        assert final == pytest.approx([1 - acc for acc in result["r_matrix"][-1]], abs=1e-6)  # 1 - accuracy
        entries.append(entry_from_result(result))

    entries = typed_entries(entries)
    (table,) = build_tables(entries)
    assert "hamming_final" in table.scores and table.higher["hamming_final"] is False
    assert table.title("hamming_final") == "Hamming ↓"
    good, bad = sorted(table.rows, key=lambda row: row.stats["acc"].mean, reverse=True)
    assert good.stats["hamming_final"].mean < bad.stats["hamming_final"].mean
    # the comparison ranks the lower error first; the page sorts its column ascending first
    report = compare(entries, metric="hamming_final")
    assert report["higher_is_better"] is False
    assert [s["label"] for s in report["benchmarks"][0]["strategies"]] == [good.label, bad.label]
    column = next(c for c in _table_context(table)["columns"] if c["key"] == "hamming_final")
    assert column == {"key": "hamming_final", "title": "Hamming ↓", "type": "num", "first": "asc"}

    # an entry that did not record the metric's direction is refused, never ranked as higher-is-better
    unrecorded = [{**e.document, "metrics": {k: v for k, v in e.document["metrics"].items() if k != "hamming"}} for e in entries]
    with pytest.raises(UserError, match="score 'hamming_final' has no known direction"):
        build_tables(typed_entries(unrecorded))


class Undirected(Metric):
    """A metric whose class says nothing of its direction (torchmetrics' default: None)."""

    def __init__(self):
        super().__init__()

    def update(self, *args):
        pass

    def compute(self):
        return 0.0


def test_a_metric_without_a_direction_is_refused_where_it_is_declared():
    with pytest.raises(UserError, match=r"metric 'spread' \(.*Undirected\) declares no direction.*"
                                        r"higher_is_better=True\|False"):
        declare("spread", Undirected)
    assert declare("spread", Undirected, higher_is_better=False).higher_is_better is False
    # torchmetrics' class attribute, when it has one, is the direction; a bounded one is a percentage
    assert declare("hamming", MulticlassHammingDistance).info() == {
        "title": "hamming", "higher_is_better": False, "percent": True,
        "class": "torchmetrics.classification.hamming:MulticlassHammingDistance"}


def test_an_objective_whose_direction_contradicts_its_primary_metric_is_refused():
    """R's direction is declared once by the objective and once by its primary metric's class:
    they must agree, or every method would be ranked backwards with no other sign."""
    from clbench.metrics.declared import column_metrics
    from clbench.metrics.regression import SquaredError
    from clbench.objectives.classification import Classification
    from clbench.objectives.regression import Regression

    class ErrorsAsAccuracy(Regression):
        higher_is_better = True  # its primary metric, the squared error, is lower-is-better

    class Agreeing(Regression):
        pass

    with pytest.raises(UserError, match=r"says R is higher-is-better, but its primary metric 'mse' "
                                        r"\(clbench\.metrics\.regression:SquaredError\) is lower-is-better"):
        column_metrics(ErrorsAsAccuracy(), None, None)
    assert isinstance(next(iter(column_metrics(Agreeing(), None, None).values())), SquaredError)
    classification = Classification()
    classification.num_classes = 4
    assert next(iter(column_metrics(classification, None, None)))  # accuracy, higher: accepted
