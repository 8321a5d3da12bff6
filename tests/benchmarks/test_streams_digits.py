import numpy as np
import pytest
import torch

from clbench.benchmarks.digits import digits_dirichlet, digits_domains
from clbench.benchmarks.dirichlet import dirichlet_split
from clbench.data.datasets import targets_of
from clbench.errors import UserError
from clbench.data.streams import ordered_experiences, resolve_order


def test_domains_are_avalanche_scenarios_with_metadata():
    scenario = digits_domains()
    assert len(scenario.train_stream) == len(scenario.test_stream) == 5
    names = [exp.name for exp in scenario.train_stream]
    assert names == ["rot0", "rot90", "rot180", "rot270", "invert"]
    for i, exp in enumerate(scenario.train_stream):
        assert exp.domain_id == i
        assert exp.classes_in_this_experience == list(range(10))
        x, y, t = exp.dataset[0]  # Avalanche's (x, y, task label) protocol
        assert x.shape == (1, 8, 8) and t == 0
    assert scenario.clbench.num_classes == 10 and scenario.clbench.scenario_type == "domain-il"


def test_domains_are_the_transforms_of_one_split():
    exps = ordered_experiences(digits_domains(), "default")
    base, rot90, inv = exps[0].train, exps[1].train, exps[4].train
    assert torch.equal(rot90.x, torch.rot90(base.x, 1, dims=(-2, -1)))
    assert torch.allclose(inv.x, 1 - base.x)
    assert torch.equal(base.y, rot90.y)
    # stratified split: every class in train and test, in the same proportions (+-1 sample)
    tr, te = np.bincount(base.y.numpy()), np.bincount(exps[0].test.y.numpy())
    assert np.all(np.abs(tr / tr.sum() - te / te.sum()) < 0.01)


def test_split_seed_changes_the_split_and_is_reproducible():
    a = ordered_experiences(digits_domains(split_seed=0), "default")[0].train.x
    b = ordered_experiences(digits_domains(split_seed=0), "default")[0].train.x
    c = ordered_experiences(digits_domains(split_seed=1), "default")[0].train.x
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_orders_named_explicit_and_permutation():
    scenario = digits_domains()
    assert resolve_order(scenario, "default") == [0, 1, 2, 3, 4]
    assert resolve_order(scenario, "reverse") == [4, 3, 2, 1, 0]
    assert resolve_order(scenario, ["invert", "rot0", "rot90", "rot180", "rot270"]) == [4, 0, 1, 2, 3]
    p1 = resolve_order(scenario, {"permutation": 1})
    assert sorted(p1) == [0, 1, 2, 3, 4]
    assert p1 == resolve_order(scenario, {"permutation": 1})
    assert any(resolve_order(scenario, {"permutation": s}) != p1 for s in range(2, 6))
    exps = ordered_experiences(scenario, ["invert", "rot0", "rot90", "rot180", "rot270"])
    assert [e.position for e in exps] == [0, 1, 2, 3, 4] and exps[0].name == "invert"


@pytest.mark.parametrize("order, message", [
    (["rot0", "rot0", "rot90", "rot180", "rot270"], "more than once"),
    (["rot0", "rot45", "rot90", "rot180", "rot270"], "unknown experience"),
    (["rot0", "rot90"], "leaves out"),
    ("sideways", "unknown order"),
])
def test_bad_orders(order, message):
    with pytest.raises(UserError, match=message):
        resolve_order(digits_domains(), order)


def test_dirichlet_stream_partitions_every_sample_once():
    scenario = digits_dirichlet()
    exps = ordered_experiences(scenario, "default")
    assert len(exps) == 5
    train_total = sum(len(e.train) for e in exps)
    test_total = sum(len(e.test) for e in exps)
    assert train_total + test_total == 1797
    # the balanced global test set has the same count for every class
    counts = np.bincount(targets_of(scenario.clbench.global_test).numpy())
    assert len(set(counts.tolist())) == 1


def test_dirichlet_split_properties():
    rng = np.random.default_rng(0)
    train, test = rng.integers(0, 10, 5000), rng.integers(0, 10, 1000)
    a = dirichlet_split(train, test, num_experiences=5, alpha=0.3, min_size=50, seed=3)
    b = dirichlet_split(train, test, num_experiences=5, alpha=0.3, min_size=50, seed=3)
    c = dirichlet_split(train, test, num_experiences=5, alpha=0.3, min_size=50, seed=4)
    all_train = np.concatenate(a.train_indices)
    assert len(all_train) == len(set(all_train.tolist())) == 5000  # each sample exactly once
    all_test = np.concatenate(a.test_indices)
    assert len(all_test) == len(set(all_test.tolist())) == 1000
    assert min(len(i) for i in a.train_indices) >= 50
    assert np.array_equal(a.proportions, b.proportions)
    assert not np.array_equal(a.proportions, c.proportions)
    # small alpha: skewed class mixes (some class has > 60% of its samples in one experience)
    assert a.proportions.max(axis=0).mean() > 0.5
    # each experience's test classes follow its training classes
    for tr_idx, te_idx in zip(a.train_indices, a.test_indices):
        p_tr = np.bincount(train[tr_idx], minlength=10) / len(tr_idx)
        p_te = np.bincount(test[te_idx], minlength=10) / len(te_idx)
        assert np.abs(p_tr - p_te).max() < 0.1


def test_dirichlet_balanced_keeps_sizes_close():
    rng = np.random.default_rng(1)
    train, test = rng.integers(0, 10, 5000), rng.integers(0, 10, 1000)
    skewed = dirichlet_split(train, test, alpha=0.1, seed=0)
    balanced = dirichlet_split(train, test, alpha=0.1, balanced=True, seed=0)
    spread = lambda s: np.std([len(i) for i in s.train_indices])  # noqa: E731
    assert spread(balanced) < spread(skewed)


def test_dirichlet_infeasible_min_size():
    with pytest.raises(UserError, match="min_size"):
        dirichlet_split(np.zeros(100, int), np.zeros(10, int), num_experiences=5, min_size=30)
