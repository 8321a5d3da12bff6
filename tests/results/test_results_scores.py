"""One derivation of scores: what a run stores is what re-scoring an entry expects."""

from __future__ import annotations

import pytest

from clbench.api import RunResult
from clbench.config.load import resolve_config
from clbench.errors import UserError
from clbench.leaderboard import entries as E
from clbench.leaderboard.rescore import expected_scores
from clbench.metrics.derive import derive_scores
from clbench.results.record import Status, single_stage
from clbench.results.assemble import RunSummary, assemble


def fake_run(strategy: str, *, single_stage: bool, columns: int = 2) -> RunSummary:
    """What :func:`assemble` knows of a run: two digits domains scored by classification metrics."""
    from clbench.metrics.collection import CLASSIFICATION_METRICS, make_eval_metrics
    from clbench.metrics.declared import recorded

    cfg = resolve_config({"seed": 0, "strategy": strategy, "benchmark": "digits-domains",
                          "logging": {"tensorboard": False}})
    return RunSummary(
        cfg=cfg, scenario_type="domain-il", num_classes=10, objective={"name": "Classification"},
        higher_is_better=True, column_names=["acc"] * columns,
        metrics=recorded([make_eval_metrics(10, imbalance=True) for _ in range(columns)], CLASSIFICATION_METRICS),
        experiences=[f"d{i}" for i in range(columns)], domains=list(range(columns)), single_stage=single_stage, precision="32-true",
        params_total=6, params_trainable=6, adapter_scales=[], strategy_class="clbench.strategies.naive:Naive",
        strategy_params={}, strategy_diagnostics={})


def state(rows: list[dict]) -> dict:
    """The loop's state with R's rows given as ``{"primary": [...], <metric>: [...]}`` (read as a
    checkpoint of that form is: the fixed keys get their own fields)."""
    from dataclasses import asdict

    from clbench.engine.state import RunState

    return asdict(RunState.from_dict({"rows": rows, "r_init": {"primary": [0.1, 0.1], "gmean": [0.0, 0.0]}}))


@pytest.mark.parametrize("single_stage, rows", [
    # a final row [0.5, None] of a secondary metric (G-mean undefined on one test set)
    (False, [{"primary": [0.9, 0.2], "gmean": [0.8, 0.1]}, {"primary": [0.6, 0.7], "gmean": [0.5, None]}]),
    # joint training's one row, with a missing R entry: ACC over both experiences is undefined
    (True, [{"primary": [0.5, None], "gmean": [0.5, None]}]),
])
def test_a_final_row_with_a_missing_entry_is_scored_and_rescored_the_same(single_stage, rows):
    run = fake_run("joint" if single_stage else "naive", single_stage=single_stage)
    result = assemble(run, state(rows), None, wall=1.0, import_seconds=0.0)
    assert result["scores"]["gmean_final"] is None  # a mean over both experiences, one of them missing
    assert result["single_stage"] is single_stage and result["status"] == Status.OK == "ok"
    # what each computed metric is, read from its class (the stock accuracy's title from its declaration)
    assert result["metrics"]["gmean"] == {"title": "G-mean", "higher_is_better": True, "percent": True,
                                          "class": "clbench.metrics.gmean:GeometricMean"}
    assert result["metrics"]["acc"]["title"] == "ACC" and list(result["metrics"]) == ["acc", "gmean", "mauc"]
    assert RunResult.from_record(result).single_stage is single_stage
    if single_stage:
        assert result["scores"]["acc"] is None
    entry = E.entry_from_result(result)
    expected, _ = expected_scores(entry, "entry")
    assert {k: expected[k] for k in result["scores"]} == result["scores"]
    assert E.verify_entry(entry, "entry") is entry  # read back, not refused as edited


def test_derive_scores_means_over_every_experience():
    r = [[0.9, 0.2], [0.6, 0.7]]
    scores = derive_scores(r, [0.1, 0.1], single_stage=False, matrices={"gmean": [[1, 1], [0.5, 0.25]]},
                           global_test={"acc": [0.3, float("nan")]}, compositions=[{"l": {"n_eff": 2.0}},
                                                                                    {"l": {"n_eff": 3.0}}])
    assert scores["acc"] == pytest.approx(0.65) and scores["bwt"] == pytest.approx(-0.3)
    assert scores["gmean_final"] == pytest.approx(0.375)
    assert scores["global_acc"] is None and scores["n_eff"] == 3.0
    joint = derive_scores([[0.5, 0.7]], None, single_stage=True)
    assert joint == {"acc": pytest.approx(0.6), "aia": None, "bwt": None, "fwt": None, "forgetting": None}


def test_n_eff_controls_are_scored_where_the_run_measured_them():
    """A run that measured N_eff's null scores it and N_eff minus it, each a mean over layers; a
    result written before the null (n_eff alone per layer) keeps only n_eff, so it still verifies."""
    layers = {"a": {"n_eff": 3.0, "n_eff_null": 4.0, "n_eff_excess": -1.5},
              "b": {"n_eff": 2.0, "n_eff_null": 4.0, "n_eff_excess": None}}
    r = [[0.9, 0.2], [0.6, 0.7]]
    scores = derive_scores(r, None, single_stage=False, compositions=[{}, layers])
    assert scores["n_eff"] == 2.5 and scores["n_eff_null"] == 4.0
    assert scores["n_eff_excess"] is None  # one layer undefined: the mean over layers is too
    layers["b"]["n_eff_excess"] = -0.5
    assert derive_scores(r, None, single_stage=False, compositions=[{}, layers])["n_eff_excess"] == -1.0
    older = derive_scores(r, None, single_stage=False, compositions=[{}, {"a": {"n_eff": 3.0}}])
    assert older["n_eff"] == 3.0 and not {"n_eff_null", "n_eff_excess"} & set(older)


def test_single_stage_is_read_as_recorded_and_inferred_only_for_older_records():
    from clbench.metrics.scores import SCORE_KEYS

    every = {key: 0.5 for key in SCORE_KEYS}
    assert single_stage({"single_stage": True, "r_matrix": [[0.5]], "scores": every})
    assert not single_stage({"single_stage": False, "r_matrix": [[0.5]], "scores": {"acc": 0.5}})
    # older records: one row of several columns, or one column without the stage-comparing scores
    assert single_stage({"r_matrix": [[0.5, 0.6]], "scores": every})
    assert single_stage({"r_matrix": [[0.5]], "scores": {"acc": 0.5, "bwt": None}})
    assert not single_stage({"r_matrix": [[0.5]], "scores": every})  # a continual run over one experience
    assert not single_stage({"r_matrix": [[0.5, 0.1], [0.4, 0.6]], "scores": every})


def test_a_recorded_single_stage_that_r_contradicts_is_refused():
    run = fake_run("naive", single_stage=False)
    result = assemble(run, state([{"primary": [0.9, 0.2]}, {"primary": [0.6, 0.7]}]), None, wall=1.0,
                      import_seconds=0.0)
    result["single_stage"] = True
    with pytest.raises(UserError, match="r_matrix has 2 row.* but single_stage is true"):
        expected_scores(result, "entry")


def test_statuses_are_a_closed_set():
    assert {str(s) for s in Status} == {"ok", "failed"}
    run = fake_run("naive", single_stage=False)
    entry = E.entry_from_result(assemble(run, state([{"primary": [0.9, 0.2]}, {"primary": [0.6, 0.7]}]), None,
                                         wall=1.0, import_seconds=0.0))
    entry["status"] = "done"
    entry["content_hash"] = E.content_hash(entry)
    with pytest.raises(UserError, match="unknown status 'done'"):
        E.verify_entry(entry, "entry")


@pytest.mark.parametrize("edit, message", [
    (lambda e: e.update(seed="0"), r"entry: seed: input should be a valid integer, got '0'"),
    (lambda e: e["strategy"].pop("name"), r"missing field\(s\) strategy.name"),
    (lambda e: e.pop("r_init"), r"missing field\(s\) r_init"),
    (lambda e: e.update(single_stage="yes"), r"single_stage: input should be a valid boolean"),
])
def test_an_entry_with_a_field_missing_or_of_the_wrong_type_is_one_line(edit, message):
    run = fake_run("naive", single_stage=False)
    entry = E.entry_from_result(assemble(run, state([{"primary": [0.9, 0.2]}, {"primary": [0.6, 0.7]}]), None,
                                         wall=1.0, import_seconds=0.0))
    E.verify_entry(entry, "entry")
    edit(entry)
    entry["content_hash"] = E.content_hash(entry)
    with pytest.raises(UserError, match=message) as info:
        E.verify_entry(entry, "entry")
    assert "\n" not in info.value.one_line()
