"""Weighted cross-entropy with a weight cap (the thesis's ``weighted_cross_entropy``, alpha=auto).

The weights are inverse class frequency over the classes present, ``N / (K n_c)``, capped; they
are recomputed from every experience's training labels and only the training loss uses them.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clbench.config.load import resolve_config
from clbench.errors import UserError
from clbench.objectives.classification import DEFAULT_CAP, Classification, inverse_frequency
from clbench.engine.runner import run
from clbench.data.streams import Experience, StreamSpec
from helpers import checked, tiny_config

WEIGHTED = {"class_path": "classification", "init_args": {"class_weights": {"alpha": "auto", "cap": 4}}}
DIRICHLET = {"class_path": "digits-dirichlet", "init_args": {"num_experiences": 3, "alpha": 0.3}}


def balanced_stream():
    """Two digits domains with exactly 60 training samples of every class (a test benchmark)."""
    from clbench.benchmarks.digits import load_digits_split
    from clbench.data.datasets import ArrayDataset
    from clbench.data.streams import build_scenario

    x_tr, y_tr, x_te, y_te = load_digits_split(0.25, 0)
    keep = torch.cat([torch.nonzero(y_tr == c).flatten()[:60] for c in range(10)])
    x, y = x_tr[keep], y_tr[keep]
    spec = StreamSpec(name="balanced", num_classes=10, input_shape=(1, 8, 8))
    train = [ArrayDataset(x, y), ArrayDataset(torch.rot90(x, 1, dims=(-2, -1)).contiguous(), y)]
    test = [ArrayDataset(x_te, y_te), ArrayDataset(torch.rot90(x_te, 1, dims=(-2, -1)).contiguous(), y_te)]
    return build_scenario(spec, train, test, names=["rot0", "rot90"])


def _run(**overrides) -> dict:
    return run(resolve_config(tiny_config(**overrides)), None)


def test_weights_on_a_hand_built_label_array_follow_the_formula():
    labels = torch.tensor([0] * 6 + [1] * 3 + [2] * 1 + [3] * 2)  # N=12, K=4 present of 5
    weights = inverse_frequency(labels, 5, cap=None)
    expected = [12 / (4 * 6), 12 / (4 * 3), 12 / (4 * 1), 12 / (4 * 2)]
    assert weights[:4].tolist() == pytest.approx(expected)
    assert weights[4] == pytest.approx(max(expected))  # absent, no cap: the largest present weight
    counts = torch.bincount(labels, minlength=5).float()
    assert float((counts * weights).sum()) == pytest.approx(len(labels))  # mean sample weight 1


def test_the_cap_bounds_every_weight_and_absent_classes_get_it():
    labels = torch.tensor([0] * 98 + [1] * 1 + [2] * 1)
    weights = inverse_frequency(labels, 4, cap=5.0)
    assert weights.tolist() == pytest.approx([100 / (3 * 98), 5.0, 5.0, 5.0])
    assert inverse_frequency(torch.tensor([0, 0, 1, 1]), 2).tolist() == [1.0, 1.0]


def _objective(class_weights, labels, num_classes=3) -> Classification:
    from clbench.data.datasets import ArrayDataset

    objective = Classification(class_weights=class_weights)
    data = ArrayDataset(torch.zeros(len(labels), 1), torch.tensor(labels))
    exp = Experience(0, "e", 0, sorted(set(labels)), data, data)
    objective.setup(StreamSpec(name="s", num_classes=num_classes, input_shape=(1,)), [exp])
    objective.begin_experience(exp)
    return objective


def test_the_loss_uses_the_weights_and_equals_plain_cross_entropy_when_balanced():
    logits, targets = torch.randn(8, 3), torch.tensor([0, 1, 2, 0, 1, 2, 0, 0])
    skewed = _objective({"alpha": "auto"}, [0, 0, 0, 0, 1, 1, 2, 2])
    assert torch.equal(skewed.weight, inverse_frequency(torch.tensor([0, 0, 0, 0, 1, 1, 2, 2]), 3))
    assert torch.allclose(skewed.loss(logits, targets), F.cross_entropy(logits, targets, weight=skewed.weight))
    assert not torch.allclose(skewed.loss(logits, targets), F.cross_entropy(logits, targets))
    balanced = _objective("auto", [0, 1, 2, 0, 1, 2])
    assert balanced.weight.tolist() == [1.0, 1.0, 1.0]
    assert torch.allclose(balanced.loss(logits, targets), F.cross_entropy(logits, targets), rtol=0, atol=1e-7)


def test_an_explicit_alpha_list_is_used_and_capped():
    objective = _objective({"alpha": [1, 2, 50], "cap": 10}, [0, 0, 1])
    assert objective.weight.tolist() == [1.0, 2.0, 10.0]
    assert objective.summary()["class_weights"]["per_experience"] == [[1.0, 2.0, 10.0]]


@pytest.mark.parametrize("class_weights, where, what", [
    ({"alpha": "auto", "cap": 0.5}, "class_weights.cap", "class_weights.cap must be >= 1, got 0.5"),
    ({"alpha": "inverse"}, "class_weights.alpha", "got str 'inverse'"),
    ({"alpha": [1.0, -1.0, 1.0]}, "class_weights.alpha[1]", "class_weights.alpha[1] must be > 0, got -1.0"),
    ({"alpha": "auto", "capp": 3}, "class_weights.capp", "unknown key 'capp'"),
    ({"cap": float("inf")}, "class_weights.cap", "must be a finite number"),
    ("sometimes", "class_weights", "got str 'sometimes'"),
])
def test_bad_settings_are_one_line_errors(class_weights, where, what):
    with pytest.raises(UserError) as err:
        checked(Classification, "objective.init_args", class_weights=class_weights)
    assert err.value.where == f"objective.init_args.{where}" and what in str(err.value)
    assert "\n" not in str(err.value)


def test_an_alpha_list_of_the_wrong_length_is_refused():
    with pytest.raises(UserError, match="3 classes"):
        _objective({"alpha": [1.0, 2.0]}, [0, 1, 2])


def test_a_weighted_run_differs_on_an_imbalanced_stream_and_records_its_weights():
    plain = _run(benchmark=DIRICHLET)
    weighted = _run(benchmark=DIRICHLET, objective=WEIGHTED)
    assert weighted["r_init"] == plain["r_init"]  # evaluation is not weighted
    assert weighted["r_matrix"] != plain["r_matrix"]
    record = weighted["objective"]["class_weights"]
    assert record["alpha"] == "auto" and record["cap"] == 4.0
    assert len(record["per_experience"]) == 3
    assert len({tuple(w) for w in record["per_experience"]}) == 3  # recomputed per experience
    assert max(max(w) for w in record["per_experience"]) == 4.0  # the cap binds on this stream
    assert "class_weights" not in plain["objective"]


def test_a_weighted_run_equals_the_plain_one_when_classes_are_equally_frequent():
    bench = {"class_path": f"{__file__}:balanced_stream"}
    plain = _run(benchmark=bench)
    weighted = _run(benchmark=bench, objective=WEIGHTED)
    assert weighted["objective"]["class_weights"]["per_experience"] == [[1.0] * 10] * 2
    for got, want in zip(weighted["r_matrix"], plain["r_matrix"]):
        assert got == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("strategy", [{"class_path": "replay", "init_args": {"mem_size": 50}},
                                      {"class_path": "ewc", "init_args": {"ewc_lambda": 10.0}}])
def test_weighting_works_with_other_strategies(strategy):
    plain = _run(benchmark=DIRICHLET, strategy=strategy)
    result = _run(benchmark=DIRICHLET, objective=WEIGHTED, strategy=strategy)
    assert len(result["r_matrix"]) == 3 and result["r_matrix"] != plain["r_matrix"]  # the weights act
    assert len(result["objective"]["class_weights"]["per_experience"]) == 3


def test_the_default_cap_is_documented_and_used():
    objective = _objective("auto", [0] * 200 + [1])
    assert objective.weight[1] == DEFAULT_CAP


@pytest.mark.parametrize("class_weights, field", [({"alpha": [1.0, 2.0]}, "alpha"), ({"cap": 0}, "cap")])
def test_errors_in_a_config_name_the_file(class_weights, field):
    cfg = resolve_config(tiny_config(objective={"class_path": "classification",
                                                "init_args": {"class_weights": class_weights}}), source="exp.yaml")
    with pytest.raises(UserError, match=rf"^exp\.yaml: objective\.init_args\.class_weights\.{field}:"):
        run(cfg, None, source="exp.yaml")
