"""CL scores of the R matrix: hand-worked matrices for every score, and Avalanche as reference."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from clbench.errors import UserError
from clbench.metrics import SCORE_KEYS, cl_scores

# Row = after training experience i, column = test experience j.
R3 = [[0.8, 0.3, 0.2],
      [0.6, 0.9, 0.4],
      [0.7, 0.5, 0.7]]
INIT3 = [0.1, 0.2, 0.3]
REF3 = [0.85, 0.8, 0.9]


def test_every_score_on_a_hand_worked_3x3():
    s = cl_scores(R3, r_init=INIT3, reference=REF3)
    assert set(s) == set(SCORE_KEYS)
    expected = {
        "acc": (0.7 + 0.5 + 0.7) / 3,
        "op": (0.7 + 0.5 + 0.7) / 3,
        "aia": (0.8 + (0.6 + 0.9) / 2 + (0.7 + 0.5 + 0.7) / 3) / 3,
        "bwt": ((0.7 - 0.8) + (0.5 - 0.9)) / 2,
        "bwt_trace": ((0.7 - 0.8) + (0.5 - 0.9) + 0.0) / 3,
        "forgetting": ((0.8 - 0.7) + (0.9 - 0.5)) / 2,
        "fwt": ((0.3 - 0.2) + (0.4 - 0.3)) / 2,
        "fwt_ref": ((0.3 - 0.8) + (0.4 - 0.9)) / 2,
        "im": 0.9 - 0.7,
        "a": (0.8 + 0.6 + 0.9 + 0.7 + 0.5 + 0.7) / 6,
        "bwt_dr": ((0.6 - 0.8) + (0.7 - 0.8) + (0.5 - 0.9)) / 3,
        "rem": 1 - 0.7 / 3,
        "bwt_plus": 0.0,
        "fwt_dr": (0.3 + 0.2 + 0.4) / 3,
        "cl_score": ((4.2 / 6) + (1 - 0.7 / 3) + 0.0 + 0.3) / 4,
    }
    for key, value in expected.items():
        assert s[key] == pytest.approx(value, abs=1e-12), key
        assert isinstance(s[key], float)


def test_positive_backward_transfer_hand_worked():
    # learning experience 2 improved experience 1: forgetting is negative, BWT+ is positive
    s = cl_scores([[0.5, 0.1], [0.7, 0.6]])
    assert s["bwt"] == pytest.approx(0.2)
    assert s["bwt_trace"] == pytest.approx(0.1)
    assert s["forgetting"] == pytest.approx(-0.2)
    assert s["bwt_dr"] == pytest.approx(0.2)
    assert s["rem"] == pytest.approx(1.0)
    assert s["bwt_plus"] == pytest.approx(0.2)
    assert s["fwt_dr"] == pytest.approx(0.1)
    assert s["a"] == pytest.approx((0.5 + 0.7 + 0.6) / 3)
    assert s["cl_score"] == pytest.approx((0.6 + 1.0 + 0.2 + 0.1) / 4)


def test_forgetting_uses_the_best_stage_after_training_not_before():
    # column 1 peaks after stage 2 (0.9 > R[1,1] = 0.6): Chaudhry counts 0.9 - 0.5, Avalanche
    # (first minus last) counts 0.6 - 0.5. Column 2 was 0.95 before it was trained: that is
    # transfer, so the max starts at the stage that trained it (0.7), not at 0.95.
    r = [[0.6, 0.95, 0.1],
         [0.9, 0.7, 0.1],
         [0.5, 0.4, 0.8]]
    s = cl_scores(r)
    assert s["forgetting"] == pytest.approx(((0.9 - 0.5) + (0.7 - 0.4)) / 2)
    assert s["bwt"] == pytest.approx(((0.5 - 0.6) + (0.4 - 0.7)) / 2)


def test_single_experience_and_missing_inputs_give_none():
    s = cl_scores([[0.4]])
    assert s["acc"] == s["op"] == s["aia"] == s["a"] == pytest.approx(0.4)
    for key in ("bwt", "bwt_trace", "forgetting", "fwt", "fwt_ref", "im", "bwt_dr", "rem",
                "bwt_plus", "fwt_dr", "cl_score"):
        assert s[key] is None, key
    assert cl_scores([[0.4]], reference=[0.5])["im"] == pytest.approx(0.1)
    s = cl_scores(R3)
    assert s["fwt"] is s["fwt_ref"] is s["im"] is None
    assert s["bwt"] is not None


def test_nan_above_the_diagonal_leaves_backward_scores():
    r = np.array(R3)
    r[np.triu_indices(3, k=1)] = np.nan      # a protocol that evaluates seen experiences only
    s = cl_scores(r, r_init=INIT3, reference=REF3)
    full = cl_scores(R3, r_init=INIT3, reference=REF3)
    for key in ("acc", "aia", "bwt", "bwt_trace", "forgetting", "im", "a", "bwt_dr", "rem"):
        assert s[key] == pytest.approx(full[key]), key
    assert s["fwt"] is s["fwt_ref"] is s["fwt_dr"] is s["cl_score"] is None
    # without FWT in the weights, CL_score is defined again
    weights = {"a": 0.5, "rem": 0.25, "bwt_plus": 0.25}
    assert cl_scores(r, weights=weights)["cl_score"] == pytest.approx(
        0.5 * full["a"] + 0.25 * full["rem"] + 0.25 * full["bwt_plus"])


def test_inputs_as_tensor_numpy_and_lists_agree():
    as_list = cl_scores(R3, INIT3, REF3)
    assert cl_scores(np.array(R3), np.array(INIT3), np.array(REF3)) == as_list
    assert cl_scores(torch.tensor(R3, dtype=torch.float64), torch.tensor(INIT3, dtype=torch.float64),
                     torch.tensor(REF3, dtype=torch.float64)) == as_list


def test_bad_shapes_and_weights_are_rejected():
    with pytest.raises(ValueError, match="square"):
        cl_scores([[0.1, 0.2]])
    with pytest.raises(ValueError, match="length"):
        cl_scores(R3, r_init=[0.1, 0.2])
    with pytest.raises(UserError, match="sum to 1"):
        cl_scores(R3, weights={"a": 0.5, "rem": 0.6})
    with pytest.raises(UserError, match="unknown"):
        cl_scores(R3, weights={"ms": 1.0})


# -- Avalanche as the independent reference ------------------------------------------------------
# (imported in the tests: avalanche takes seconds to import, and collecting the suite need not)
def _random_r(seed, t):
    return np.random.default_rng(seed).uniform(0.05, 0.95, size=(t, t))


def avalanche_forgetting_matrix(r):
    from avalanche.evaluation.functional import forgetting

    return forgetting(r)


@pytest.mark.parametrize("seed", range(6))
def test_bwt_equals_minus_avalanche_forgetting(seed):
    r = _random_r(seed, 5)
    s = cl_scores(r)
    # functional: forgetting matrix, row = time; the stream value averages the trained ones
    final = avalanche_forgetting_matrix(r)[-1, :-1]
    assert s["bwt"] == pytest.approx(-final.mean(), abs=1e-12)
    # standalone metric objects: first value right after training, last value at the end
    from avalanche.evaluation.metrics.forgetting_bwt import BWT as AvalancheBWT
    from avalanche.evaluation.metrics.forgetting_bwt import Forgetting as AvalancheForgetting

    fgt, bwt = AvalancheForgetting(), AvalancheBWT()
    for j in range(4):
        for metric in (fgt, bwt):
            metric.update(j, r[j, j], initial=True)
            metric.update(j, r[-1, j])
    assert s["bwt"] == pytest.approx(-np.mean(list(fgt.result().values())), abs=1e-12)
    assert s["bwt"] == pytest.approx(np.mean(list(bwt.result().values())), abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_forgetting_coincides_with_avalanche_only_without_later_gains(seed):
    r = _random_r(seed, 5)
    avalanche_value = avalanche_forgetting_matrix(r)[-1, :-1].mean()
    # random matrices: scores rise after training somewhere, and the definitions differ
    assert cl_scores(r)["forgetting"] > avalanche_value + 1e-6
    # make every column non-increasing from its training stage on: the max is R[j, j], so
    # Chaudhry's forgetting and Avalanche's first-minus-last coincide
    for j in range(5):
        r[j:, j] = np.sort(r[j:, j])[::-1]
    assert cl_scores(r)["forgetting"] == pytest.approx(
        avalanche_forgetting_matrix(r)[-1, :-1].mean(), abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_fwt_equals_avalanche_forward_transfer(seed):
    r = _random_r(seed, 6)
    init = np.random.default_rng(100 + seed).uniform(0, 0.3, 6)
    from avalanche.evaluation.metrics.forward_transfer import ForwardTransfer as AvalancheFWT

    fwt = AvalancheFWT()
    for j in range(1, 6):
        fwt.update(j, init[j], initial=True)
        fwt.update(j, r[j - 1, j])
    assert cl_scores(r, r_init=init)["fwt"] == pytest.approx(
        np.mean(list(fwt.result().values())), abs=1e-12)


# -- lower-is-better R (errors) ------------------------------------------------------------------
E3 = [[0.2, 0.7, 0.8],       # 1 - R3: the same run scored as an error rate
      [0.4, 0.1, 0.6],
      [0.3, 0.5, 0.3]]
INIT_E3 = [0.9, 0.8, 0.7]
REF_E3 = [0.15, 0.2, 0.1]


def test_every_score_of_an_error_matrix_hand_worked():
    s = cl_scores(E3, r_init=INIT_E3, reference=REF_E3, higher_is_better=False)
    assert set(s) == set(SCORE_KEYS)
    expected = {
        "acc": (0.3 + 0.5 + 0.3) / 3,                      # mean final error: lower is better
        "op": (0.3 + 0.5 + 0.3) / 3,
        "aia": (0.2 + (0.4 + 0.1) / 2 + (0.3 + 0.5 + 0.3) / 3) / 3,
        "bwt": ((0.2 - 0.3) + (0.1 - 0.5)) / 2,            # errors rose: < 0 = forgetting
        "bwt_trace": ((0.2 - 0.3) + (0.1 - 0.5) + 0.0) / 3,
        "forgetting": ((0.3 - 0.2) + (0.5 - 0.1)) / 2,     # rise above the best (lowest) error
        "fwt": ((0.8 - 0.7) + (0.7 - 0.6)) / 2,            # lower error than untrained: > 0
        "fwt_ref": ((0.2 - 0.7) + (0.1 - 0.6)) / 2,
        "im": 0.3 - 0.1,                                   # final error above the reference's
        "a": (0.2 + 0.4 + 0.1 + 0.3 + 0.5 + 0.3) / 6,
        "bwt_dr": ((0.2 - 0.4) + (0.2 - 0.3) + (0.1 - 0.5)) / 3,
        "rem": 1 - 0.7 / 3,
        "bwt_plus": 0.0,
        "fwt_dr": (0.7 + 0.8 + 0.6) / 3,
    }
    for key, value in expected.items():
        assert s[key] == pytest.approx(value, abs=1e-12), key
    assert s["cl_score"] is None  # A and FWT_DR are errors: no sum with REM and BWT+


def test_error_matrix_of_one_minus_r_gives_the_same_transfer_scores():
    acc = cl_scores(R3, r_init=INIT3, reference=REF3)
    err = cl_scores(1 - np.array(R3), r_init=1 - np.array(INIT3), reference=1 - np.array(REF3),
                    higher_is_better=False)
    for key in ("bwt", "bwt_trace", "forgetting", "fwt", "fwt_ref", "im", "bwt_dr", "rem", "bwt_plus"):
        assert err[key] == pytest.approx(acc[key], abs=1e-12), key
    for key in ("acc", "op", "aia", "a", "fwt_dr"):
        assert err[key] == pytest.approx(1 - acc[key], abs=1e-12), key


def test_falling_error_is_positive_backward_transfer():
    s = cl_scores([[0.5, 0.9], [0.3, 0.4]], higher_is_better=False)
    assert s["bwt"] == pytest.approx(0.2) and s["bwt_plus"] == pytest.approx(0.2)
    assert s["forgetting"] == pytest.approx(-0.2)
    assert s["rem"] == pytest.approx(1.0)


def test_score_directions():
    from clbench.metrics.scores import score_higher_is_better

    for higher in (True, False):
        for key in ("bwt", "bwt_trace", "fwt", "fwt_ref", "bwt_dr", "rem", "bwt_plus", "cl_score"):
            assert score_higher_is_better(key, higher) is True, key
        for key in ("forgetting", "im"):
            assert score_higher_is_better(key, higher) is False, key
        for key in ("acc", "op", "aia", "a", "fwt_dr"):
            assert score_higher_is_better(key, higher) is higher, key
    with pytest.raises(ValueError, match="higher_is_better"):
        cl_scores(R3, higher_is_better="no")


@pytest.mark.parametrize("seed", range(3))
def test_accuracy_scores_are_bit_identical_with_the_default_direction(seed):
    r, init = _random_r(seed, 5), np.random.default_rng(seed).uniform(0, 0.3, 5)
    assert cl_scores(r, init, init + 0.5, higher_is_better=True) == cl_scores(r, init, init + 0.5)


COMMITTED = Path(__file__).resolve().parents[2] / "leaderboard" / "entries"


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed leaderboard/")
def test_committed_entries_are_rescored_bit_identically():
    checked = 0
    for path in sorted(COMMITTED.glob("*.json")):
        entry = json.loads(path.read_text())
        if len(entry["r_matrix"]) == 1:  # joint: one stage, only acc
            continue
        scores = cl_scores(entry["r_matrix"], entry["r_init"], entry.get("reference"))
        for key, value in scores.items():
            if key in entry["scores"]:
                assert entry["scores"][key] == value, (path.name, key)
                checked += 1
    assert checked > 100


def test_trace_op_and_bwt_per_task_on_a_hand_worked_r():
    """OP and BWT as the MH-MoE and MoSEs tables report them, per task and overall.

    R (rows: after training task 1, 2, 3; columns: tasks a, b, c):
        a    b    c
       .8   .1   .0
       .6   .9   .2
       .5   .7   .6
    Final scores (per-task columns): a .5, b .7, c .6; OP = 1.8 / 3 = .6.
    BWT terms R[T, i] - R[i, i]: a .5 - .8 = -.3, b .7 - .9 = -.2, c none (trained last);
    BWT = (-.3 - .2) / 2 = -.25; MH-MoE's printed 1/T: -.5 / 3.
    """
    from clbench.metrics.scores import trace_task_scores

    r = [[0.8, 0.1, 0.0], [0.6, 0.9, 0.2], [0.5, 0.7, 0.6]]
    out = trace_task_scores(r, ["a", "b", "c"])
    assert out["op"] == pytest.approx(0.6) and out["bwt"] == pytest.approx(-0.25)
    assert out["bwt_trace"] == pytest.approx(-0.5 / 3)
    assert {k: v["final"] for k, v in out["tasks"].items()} == pytest.approx({"a": 0.5, "b": 0.7, "c": 0.6})
    assert out["tasks"]["a"]["bwt"] == pytest.approx(-0.3) and out["tasks"]["b"]["bwt"] == pytest.approx(-0.2)
    assert out["tasks"]["c"]["bwt"] is None
    assert list(trace_task_scores(r)["tasks"]) == ["0", "1", "2"]
    with pytest.raises(ValueError, match="2 names for 3 tasks"):
        trace_task_scores(r, ["a", "b"])


def test_the_score_registry_takes_metric_directions_from_their_torchmetrics_classes():
    import importlib

    from clbench.metrics import make_eval_metrics
    from clbench.metrics.score_registry import EVAL_METRICS, higher_is_better, percent, title

    computed = make_eval_metrics(3, imbalance=True)
    for name, metric in EVAL_METRICS.items():
        module, cls = metric.source.split(":")
        assert getattr(importlib.import_module(module), cls).higher_is_better is metric.higher_is_better, name
        assert type(computed[name]).__name__ == cls  # the class the run computes the metric with
        for key in (f"{name}_final", f"global_{name}"):
            assert higher_is_better(key, r_higher=False) is metric.higher_is_better, key
    assert title("global_gmean") == "Global G-mean" and title("mauc_final") == "MAUC"
    assert not percent("n_eff") and percent("acc")
    # what an older entry (no recorded "metrics") says of the built-ins is what their classes say now
    from clbench.metrics.collection import CLASSIFICATION_METRICS

    for name, metric in EVAL_METRICS.items():
        assert CLASSIFICATION_METRICS[name].title == metric.title, name
        assert CLASSIFICATION_METRICS[name].higher_is_better is metric.higher_is_better, name
    # a metric the registry does not know follows R when it is R's own, takes the direction the
    # entry recorded, and is refused otherwise (never counted as higher-is-better)
    assert higher_is_better("mse_final", False, ["mse"]) is False
    recorded = {"mse": {"title": "MSE", "higher_is_better": False, "percent": False}}
    assert higher_is_better("mse_final", True, ["acc"], recorded) is False
    from clbench.errors import UserError

    with pytest.raises(UserError, match="score 'mse_final' has no known direction"):
        higher_is_better("mse_final", False, ["acc"])
    with pytest.raises(UserError, match="score 'ppl' has no known direction"):
        higher_is_better("ppl")
