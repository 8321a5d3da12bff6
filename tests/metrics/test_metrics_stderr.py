"""The noise of one score: each R cell's standard error from its test set, stored beside R and
propagated to ACC, AIA, BWT and FWT (clbench.metrics.stderr)."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest

from clbench.errors import UserError
from clbench.metrics.stderr import entry_score_stderr, sampling_error, score_stderr


def test_accuracy_cell_has_the_binomial_standard_error_and_its_sample_count():
    import torch
    from torchmetrics.classification import MulticlassAccuracy

    metric = MulticlassAccuracy(3, average="micro")
    target = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    preds = torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 0, 1, 2, 1, 2, 0, 1]), 3).float()  # 6 of 10 right
    metric.update(preds[:4], target[:4])
    metric.update(preds[4:], target[4:])
    se, n = sampling_error(metric)
    assert n == 10 and se == pytest.approx(math.sqrt(0.6 * 0.4 / 10))


def test_text_score_error_is_the_bootstrap_standard_error_of_its_mean():
    from clbench.metrics.text_scores import EditSimilarity

    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    preds = [" ".join(rng.choices(words, k=4)) for _ in range(60)]
    targets = [" ".join(rng.choices(words, k=4)) for _ in range(60)]
    metric = EditSimilarity()
    per_sample = np.array(metric.sample_scores(preds, targets))
    metric.update(preds[:25], targets[:25])
    metric.update(preds[25:], targets[25:])
    se, n = sampling_error(metric)
    assert n == 60
    assert se == pytest.approx(per_sample.std() / math.sqrt(60), rel=1e-6)  # the plug-in (ideal bootstrap) value
    boot = np.random.default_rng(0).choice(per_sample, size=(20000, 60)).mean(axis=1).std()
    assert se == pytest.approx(boot, rel=0.03)  # what a seeded bootstrap over the samples estimates


def test_a_metric_without_a_known_error_says_unknown():
    from clbench.metrics.regression import SquaredError

    assert sampling_error(SquaredError()) == (None, None)


def test_errors_propagate_to_the_linear_scores_with_independent_cells():
    r = [[0.5, 0.1, 0.1], [0.4, 0.6, 0.2], [0.3, 0.5, 0.7]]
    se = [[0.01, 0.02, 0.03], [0.04, 0.05, 0.06], [0.07, 0.08, 0.09]]
    init, init_se = [0.1, 0.1, 0.1], [0.011, 0.012, 0.013]
    out = score_stderr(r, se, init, init_se, single_stage=False)
    assert out["acc"] == pytest.approx(math.sqrt(0.07**2 + 0.08**2 + 0.09**2) / 3)
    assert out["bwt"] == pytest.approx(math.sqrt(0.07**2 + 0.01**2 + 0.08**2 + 0.05**2) / 2)
    assert out["fwt"] == pytest.approx(math.sqrt(0.02**2 + 0.012**2 + 0.06**2 + 0.013**2) / 2)
    aia = [(1 / 3) ** 2 * 0.01**2] + [(1 / 6) ** 2 * v**2 for v in (0.04, 0.05)] \
        + [(1 / 9) ** 2 * v**2 for v in (0.07, 0.08, 0.09)]
    assert out["aia"] == pytest.approx(math.sqrt(sum(aia)))
    assert score_stderr(r, se, init, init_se, single_stage=False, higher_is_better=False) == pytest.approx(out)
    joint = score_stderr([[0.5, 0.6]], [[0.03, 0.04]], [0.1, 0.1], None, single_stage=True)
    assert joint == {"acc": pytest.approx(0.025), "aia": None, "bwt": None, "fwt": None}
    unknown_cell = copy.deepcopy(se)
    unknown_cell[2][0] = None  # read by ACC and BWT, not by FWT
    partial = score_stderr(r, unknown_cell, init, init_se, single_stage=False)
    assert partial["acc"] is None and partial["bwt"] is None and partial["fwt"] == pytest.approx(out["fwt"])


def test_a_run_without_cell_errors_is_read_in_a_few_moves_not_one_per_cell(monkeypatch):
    """A regression benchmark records no cell error; a 100-task R must not be moved 10,100 times."""
    import clbench.metrics.derive as derive

    calls = []
    real = derive.derive_scores
    monkeypatch.setattr(derive, "derive_scores", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = random.Random(0)
    tasks = 30
    r = [[rng.random() for _ in range(tasks)] for _ in range(tasks)]
    none = [[None] * tasks for _ in range(tasks)]
    out = score_stderr(r, none, [0.1] * tasks, None, single_stage=False)
    assert out == {"acc": None, "aia": None, "bwt": None, "fwt": None}
    assert len(calls) < 10
    one_known = copy.deepcopy(none)
    one_known[0][0] = 0.02  # read by AIA, BWT and FWT, not by ACC: still unknown, each reads unknown cells
    calls.clear()
    assert score_stderr(r, one_known, [0.1] * tasks, None, single_stage=False) == out
    assert len(calls) < 10


def test_an_entry_written_before_errors_were_recorded_reads_as_unknown():
    old = {"r_matrix": [[0.5, 0.6], [0.4, 0.7]], "r_init": [0.1, 0.1], "scores": {}}
    assert entry_score_stderr(old) == {"acc": None, "aia": None, "bwt": None, "fwt": None}


@pytest.fixture(scope="module")
def run_result():
    from clbench.config.load import resolve_config
    from clbench.engine.runner import run
    from helpers import tiny_config

    return run(resolve_config(tiny_config()), None)


def test_a_run_stores_each_cells_binomial_error_beside_r(run_result):
    result = run_result
    assert result["schema"] == 2
    assert result["r_n"] == [450, 450, 450]  # the digits test sets' sizes
    assert "synthetic" not in result["benchmark"]  # collected data: the result says nothing more
    for row, errors in zip(result["r_matrix"] + [result["r_init"]], result["r_stderr"] + [result["r_init_stderr"]]):
        for p, se, n in zip(row, errors, result["r_n"]):
            assert se == pytest.approx(math.sqrt(p * (1 - p) / n))
    assert "primary_stderr" not in result["matrices"] and "primary_stderr_final" not in result["scores"]
    assert result["scores_stderr"]["acc"] == pytest.approx(math.sqrt(sum(v**2 for v in result["r_stderr"][-1])) / 3)


def test_an_entry_whose_score_errors_were_edited_is_refused(run_result):
    from clbench.leaderboard import entries as E

    entry = E.entry_from_result(run_result)
    assert E.verify_entry(entry, "entry") is entry
    edited = copy.deepcopy(entry)
    edited["scores_stderr"]["acc"] /= 2
    edited["content_hash"] = E.content_hash(edited)
    with pytest.raises(UserError, match="scores_stderr 'acc'"):
        E.verify_entry(edited, "entry")
