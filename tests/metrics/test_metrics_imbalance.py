"""G-mean and MAUC against independent references (NumPy, scikit-learn, SciPy ranks)."""

from itertools import combinations

import numpy as np
import pytest
import torch
from scipy.stats import rankdata

from clbench.metrics import GeometricMean, MulticlassMAUC, make_eval_metrics
from clbench.metrics.functional import geometric_mean, multiclass_mauc, pairwise_auc


def roc_auc_score(*args, **kwargs):
    """scikit-learn's, imported when a test runs (not while the suite is collected)."""
    from sklearn.metrics import roc_auc_score as reference

    return reference(*args, **kwargs)


def _numpy_gmean(pred_labels, target, num_classes, absent="ignore"):
    recalls = []
    for c in range(num_classes):
        members = target == c
        if members.sum() == 0:
            if absent == "zero":
                recalls.append(0.0)
            continue
        recalls.append(np.mean(pred_labels[members] == c))
    return float(np.prod(recalls) ** (1.0 / len(recalls)))


def _hand_till(probs, target):
    """Hand & Till (2001) as printed: ranks within each class pair, S_i, then the mean."""
    classes = np.unique(target)
    pair_values = []
    for i, j in combinations(classes, 2):
        a = []
        for pos, neg in ((i, j), (j, i)):
            keep = (target == pos) | (target == neg)
            ranks = rankdata(probs[keep, pos])           # average ranks for ties
            n_pos, n_neg = np.sum(target == pos), np.sum(target == neg)
            s_pos = ranks[target[keep] == pos].sum()
            a.append((s_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
        pair_values.append(sum(a) / 2)
    return float(np.mean(pair_values))


def _random_problem(seed, n, k, ties=False, drop=()):
    rng = np.random.default_rng(seed)
    target = rng.integers(0, k, n)
    for c in drop:
        target[target == c] = (c + 1) % k
    logits = rng.normal(size=(n, k)) + 1.2 * np.eye(k)[target]
    probs = torch.tensor(logits).softmax(1).numpy()
    if ties:  # coarse probabilities, rows still summing to 1: many tied scores
        probs = np.stack([rng.multinomial(10, row) for row in probs]) / 10.0
    return logits, probs, target


# -- G-mean ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_gmean_matches_numpy_on_random_data(seed):
    logits, _, target = _random_problem(seed, 700, 6)
    expected = _numpy_gmean(logits.argmax(1), target, 6)
    got = geometric_mean(torch.tensor(logits), torch.tensor(target), 6)
    assert float(got) == pytest.approx(expected, abs=1e-12)


def test_gmean_batches_accumulate_to_the_whole():
    logits, _, target = _random_problem(7, 1000, 5)
    metric = GeometricMean(5)
    for start in range(0, 1000, 128):
        metric.update(torch.tensor(logits[start:start + 128]), torch.tensor(target[start:start + 128]))
    assert float(metric.compute()) == pytest.approx(_numpy_gmean(logits.argmax(1), target, 5), abs=1e-12)


def test_gmean_absent_classes_are_explicit():
    logits, _, target = _random_problem(3, 600, 6, drop=(2, 4))
    preds, tgt = torch.tensor(logits), torch.tensor(target)
    ignore = float(geometric_mean(preds, tgt, 6, absent="ignore"))
    assert ignore == pytest.approx(_numpy_gmean(logits.argmax(1), target, 6, "ignore"), abs=1e-12)
    assert 0 < ignore < 1
    assert float(geometric_mean(preds, tgt, 6, absent="zero")) == 0.0


def test_gmean_hand_worked_and_zero_recall():
    # class 0: 2/2 correct, class 1: 1/2, class 2: 1/4 -> (1 * 0.5 * 0.25) ** (1/3) = 0.5
    target = torch.tensor([0, 0, 1, 1, 2, 2, 2, 2])
    preds = torch.tensor([0, 0, 1, 0, 2, 1, 1, 0])
    assert float(geometric_mean(preds, target, 3)) == pytest.approx(0.5)
    metric = GeometricMean(3)
    metric.update(preds, target)
    assert metric.recalls().tolist() == [1.0, 0.5, 0.25]
    # one class never predicted correctly makes G = 0 (thesis Sec. 4.2.3)
    assert float(geometric_mean(torch.tensor([0, 0, 0]), torch.tensor([0, 1, 1]), 2)) == 0.0
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert np.isnan(float(GeometricMean(3).compute()))


def test_gmean_rejects_bad_input():
    with pytest.raises(ValueError, match="target values"):
        geometric_mean(torch.randn(4, 3), torch.tensor([0, 1, 2, 3]), 3)
    with pytest.raises(ValueError, match="shape"):
        geometric_mean(torch.randn(4, 2), torch.tensor([0, 1, 0, 1]), 3)


# -- MAUC --------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed,n,k,ties", [(0, 400, 3, False), (1, 2000, 10, False),
                                          (2, 1500, 8, True), (3, 300, 2, True),
                                          (4, 5000, 25, False)])
def test_mauc_equals_sklearn_ovo_macro(seed, n, k, ties):
    _, probs, target = _random_problem(seed, n, k, ties=ties)
    expected = roc_auc_score(target, probs, multi_class="ovo", average="macro") if k > 2 else \
        roc_auc_score(target, probs[:, 1])
    got = multiclass_mauc(torch.tensor(probs), torch.tensor(target), k, input="probs")
    assert float(got) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_mauc_equals_hand_till_rank_formula(seed):
    _, probs, target = _random_problem(seed, 600, 5, ties=seed == 0)
    got = multiclass_mauc(torch.tensor(probs), torch.tensor(target), 5, input="probs")
    assert float(got) == pytest.approx(_hand_till(probs, target), abs=1e-12)


def test_mauc_absent_classes_average_over_present_pairs():
    _, probs, target = _random_problem(5, 800, 6, drop=(1,))
    present = np.unique(target)
    expected = roc_auc_score(target, probs, multi_class="ovo", average="macro", labels=range(6))
    assert 1 not in present
    got = multiclass_mauc(torch.tensor(probs), torch.tensor(target), 6, input="probs")
    assert float(got) == pytest.approx(expected, abs=1e-6)
    assert np.isnan(float(multiclass_mauc(torch.tensor(probs[:5]), torch.zeros(5, dtype=torch.long),
                                          6, input="probs")))


def test_pairwise_auc_hand_worked():
    # class 0 scores p(0|x): class-0 points {0.9, 0.6}, class-1 points {0.6, 0.2}
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.6, 0.4], [0.2, 0.8]], dtype=torch.float64)
    target = torch.tensor([0, 0, 1, 1])
    auc = pairwise_auc(probs, target, 2)
    # A(0|1): pairs (0.9>0.6)=1, (0.9>0.2)=1, (0.6=0.6)=1/2, (0.6>0.2)=1 -> 3.5/4
    assert float(auc[0, 1]) == pytest.approx(3.5 / 4)
    # A(1|0) on p(1|x): class-1 {0.4, 0.8} vs class-0 {0.1, 0.4} -> 1/2 + 1 + 1 + 1 = 3.5/4
    assert float(auc[1, 0]) == pytest.approx(3.5 / 4)
    assert torch.isnan(auc.diagonal()).all()


def test_mauc_logits_are_softmaxed_not_ranked_raw():
    logits, _, target = _random_problem(11, 1500, 6)
    probs = torch.tensor(logits).softmax(1).numpy()
    from_logits = multiclass_mauc(torch.tensor(logits), torch.tensor(target), 6)
    expected = roc_auc_score(target, probs, multi_class="ovo", average="macro")
    assert float(from_logits) == pytest.approx(expected, abs=1e-6)
    raw_rank = _hand_till(logits, target)   # ranking raw logits is a different number
    assert abs(raw_rank - expected) > 1e-4


def test_mauc_metric_accumulates_batches_and_rejects_non_probabilities():
    logits, _, target = _random_problem(12, 1000, 7)
    metric = MulticlassMAUC(7)
    for start in range(0, 1000, 96):
        metric.update(torch.tensor(logits[start:start + 96]).float(),
                      torch.tensor(target[start:start + 96]))
    probs = torch.tensor(logits).float().softmax(1).double().numpy()
    expected = roc_auc_score(target, probs, multi_class="ovo", average="macro")
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="probabilities"):
        MulticlassMAUC(7, input="probs").update(torch.tensor(logits[:4]), torch.tensor(target[:4]))


def test_mauc_ties_in_some_columns_only():
    # ties only in columns 0 and 3, and one column where class-2 points tie only among themselves
    _, probs, target = _random_problem(15, 1200, 5)
    probs[:, 0] = np.round(probs[:, 0], 1)
    probs[:, 3] = np.round(probs[:, 3], 1)
    probs[target == 2, 2] = 0.5
    probs[(target != 2) & (probs[:, 2] == 0.5), 2] = 0.49
    got = multiclass_mauc(torch.tensor(probs), torch.tensor(target), 5, input="probs")
    assert float(got) == pytest.approx(_hand_till(probs, target), abs=1e-12)
    grad = torch.tensor(probs, requires_grad=True)       # metric values never need gradients
    assert float(multiclass_mauc(grad, torch.tensor(target), 5, input="probs")) == float(got)


@pytest.mark.parametrize("decimals", [2, 3, 5])
def test_mauc_float32_with_tie_groups_of_every_size(decimals):
    # float32 probabilities rounded to a grid: tie groups from pairs to thousands of points
    _, probs, target = _random_problem(16 + decimals, 6000, 12)
    probs32 = torch.tensor(np.round(probs, decimals), dtype=torch.float32)
    got = multiclass_mauc(probs32, torch.tensor(target), 12, input="probs")
    assert float(got) == pytest.approx(_hand_till(probs32.double().numpy(), target), abs=1e-12)


def test_mauc_blocks_over_columns(monkeypatch):
    import clbench.metrics.functional as functional

    _, probs, target = _random_problem(13, 900, 9, ties=True)
    whole = multiclass_mauc(torch.tensor(probs), torch.tensor(target), 9, input="probs")
    monkeypatch.setattr(functional, "_AUC_BLOCK_ELEMENTS", 2000)   # two columns per block
    blocked = multiclass_mauc(torch.tensor(probs), torch.tensor(target), 9, input="probs")
    assert float(blocked) == float(whole)


def test_make_eval_metrics_keys_and_values():
    logits, _, target = _random_problem(14, 500, 4)
    plain = make_eval_metrics(4)
    assert list(plain.keys()) == ["acc"]
    full = make_eval_metrics(4, imbalance=True)
    assert sorted(full.keys()) == ["acc", "gmean", "mauc"]
    full.update(torch.tensor(logits).float(), torch.tensor(target))
    out = full.compute()
    assert float(out["acc"]) == pytest.approx(np.mean(logits.argmax(1) == target), abs=1e-6)
    assert float(out["gmean"]) == pytest.approx(_numpy_gmean(logits.argmax(1), target, 4), abs=1e-9)
    probs = torch.tensor(logits).float().softmax(1).double().numpy()
    assert float(out["mauc"]) == pytest.approx(
        roc_auc_score(target, probs, multi_class="ovo", average="macro"), abs=1e-6)
