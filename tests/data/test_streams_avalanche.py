"""Scenarios built by Avalanche's own generators, read by the harness as Avalanche reads them:
the right samples per experience, and a scenario type derived from the scenario."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import yaml
from torch.utils.data import TensorDataset

from clbench.data.datasets import ArrayDataset, targets_of, unwrap
from clbench.errors import UserError
from clbench.data.streams import experience_names, ordered_experiences, spec_of
from helpers import run_cli


def labelled(n: int, num_classes: int = 6, shift: float = 0.0, seed: int = 0) -> TensorDataset:
    """``n`` samples cycling through the classes; each class is a separable blob."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % num_classes
    x = 3 * torch.eye(num_classes)[y] + 0.3 * torch.randn(n, num_classes, generator=g) + shift
    data = TensorDataset(x, y)
    data.targets = y.tolist()
    return data


def aval(dataset):
    from avalanche.benchmarks.utils import _make_taskaware_classification_dataset

    return _make_taskaware_classification_dataset(dataset)


def nc(**kwargs):
    from avalanche.benchmarks import nc_benchmark

    return nc_benchmark(labelled(600), labelled(120, seed=1), n_experiences=3, seed=0, **kwargs)


def labels(dataset) -> list[int]:
    return sorted(set(targets_of(dataset).tolist()))


def same_items(ours, theirs) -> bool:
    """The harness's dataset yields what Avalanche's does, sample for sample (x and y)."""
    return len(ours) == len(theirs) and all(
        torch.equal(ours[k][0], theirs[k][0]) and int(ours[k][1]) == int(theirs[k][1]) for k in range(len(ours)))


def test_nc_benchmark_gives_each_experience_its_own_classes():
    scenario = nc(task_labels=False)
    spec = spec_of(scenario)
    assert spec.scenario_type == "class-il" and spec.num_classes == 6 and spec.input_shape == (6,)
    exps = ordered_experiences(scenario, "default")
    seen: set[int] = set()
    for i, exp in enumerate(exps):
        assert (len(exp.train), len(exp.test)) == (200, 40)
        own = scenario.train_stream[i].classes_in_this_experience
        assert labels(exp.train) == labels(exp.test) == exp.classes == own
        assert not seen & set(exp.classes)
        seen |= set(exp.classes)
        assert same_items(exp.train, scenario.train_stream[i].dataset)
        assert same_items(exp.test, scenario.test_stream[i].dataset)
    assert seen == set(range(6))


def test_nc_benchmark_relabelled_classes_are_read_through_avalanche():
    scenario = nc(task_labels=False, class_ids_from_zero_from_first_exp=True)
    exps = ordered_experiences(scenario, "default")
    assert [labels(e.train) for e in exps] == [[0, 1], [2, 3], [4, 5]] == [e.classes for e in exps]
    assert all(same_items(e.train, s.dataset) for e, s in zip(exps, scenario.train_stream))


def test_nc_benchmark_with_class_ids_from_zero_in_each_experience_is_class_incremental():
    """Every experience's classes are renumbered 0, 1 (the labels look alike); the original
    classes differ, so the stream is class-incremental, not instance-incremental."""
    scenario = nc(task_labels=False, class_ids_from_zero_in_each_exp=True)
    spec = spec_of(scenario)
    assert spec.scenario_type == "class-il" and spec.num_classes == 2
    assert [e.classes for e in ordered_experiences(scenario, "default")] == [[0, 1]] * 3


def test_nc_benchmark_order_is_applied():
    scenario = nc(task_labels=False)
    names = experience_names(scenario)
    exps = ordered_experiences(scenario, [names[2], names[0], names[1]])
    expected = [scenario.train_stream[i].classes_in_this_experience for i in (2, 0, 1)]
    assert [e.classes for e in exps] == [labels(e.train) for e in exps] == expected
    assert [e.position for e in exps] == [0, 1, 2]


def test_ni_benchmark_is_instance_incremental_with_one_shared_test_set():
    from avalanche.benchmarks import ni_benchmark

    scenario = ni_benchmark(labelled(600), labelled(120, seed=1), n_experiences=3, seed=0)
    assert spec_of(scenario).scenario_type == "instance-il"
    exps = ordered_experiences(scenario, "default")
    assert [len(e.train) for e in exps] == [200, 200, 200]
    rows = [{tuple(e.train[k][0].tolist()) for k in range(len(e.train))} for e in exps]
    assert not rows[0] & rows[1] and not rows[1] & rows[2] and len(rows[0] | rows[1] | rows[2]) == 600
    # One test experience in Avalanche: the same dataset object for all, evaluated once.
    assert exps[0].test is exps[1].test is exps[2].test and len(exps[0].test) == 120


def test_datasets_per_domain_are_domain_incremental():
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets

    scenario = benchmark_from_datasets(train=[aval(labelled(60, 3)), aval(labelled(60, 3, shift=2.0, seed=2))],
                                       test=[aval(labelled(30, 3, seed=3)), aval(labelled(30, 3, shift=2.0, seed=4))])
    spec = spec_of(scenario)
    assert spec.scenario_type == "domain-il" and spec.num_classes == 3
    exps = ordered_experiences(scenario, "default")
    assert [(len(e.train), len(e.test), e.classes) for e in exps] == [(60, 30, [0, 1, 2])] * 2
    assert exps[1].train[0][0].mean() > exps[0].train[0][0].mean() + 1  # the shifted domain


def test_datasets_with_disjoint_classes_are_class_incremental():
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from torch.utils.data import Subset

    full, test = labelled(120, 4), labelled(40, 4, seed=1)
    halves = lambda d: [Subset(d, [k for k in range(len(d)) if d.targets[k] in c]) for c in ((0, 1), (2, 3))]
    scenario = benchmark_from_datasets(train=[aval(s) for s in halves(full)], test=[aval(s) for s in halves(test)])
    assert spec_of(scenario).scenario_type == "class-il"
    assert [e.classes for e in ordered_experiences(scenario, "default")] == [[0, 1], [2, 3]]


def test_task_labels_make_a_task_incremental_stream():
    scenario = nc(task_labels=True)
    assert spec_of(scenario).scenario_type == "task-il"
    exps = ordered_experiences(scenario, "reverse")
    assert [e.domain_id for e in exps] == [2, 1, 0]  # the task label is the domain for the metrics
    assert [len(e.train) for e in exps] == [200] * 3


def test_task_incremental_wrapper_is_task_incremental():
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets
    from avalanche.benchmarks.scenarios.task_aware import task_incremental_benchmark

    base = benchmark_from_datasets(train=[aval(labelled(60, 3)), aval(labelled(60, 3, seed=2))],
                                   test=[aval(labelled(30, 3, seed=3)), aval(labelled(30, 3, seed=4))])
    scenario = task_incremental_benchmark(base, reset_task_labels=True)
    assert spec_of(scenario).scenario_type == "task-il"
    assert [e.domain_id for e in ordered_experiences(scenario, "default")] == [0, 1]


def test_plain_subset_of_an_in_memory_split_stays_batched():
    data = ArrayDataset(torch.randn(50, 2), torch.arange(50) % 5)
    picked = aval(data).subset([3, 7, 11])
    plain = unwrap(picked)
    assert isinstance(plain, ArrayDataset) and torch.equal(plain.x, data.x[[3, 7, 11]])
    assert isinstance(unwrap(aval(data)), ArrayDataset) and len(unwrap(aval(data))) == 50


def test_mismatched_test_stream_is_refused():
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets

    scenario = benchmark_from_datasets(train=[aval(labelled(30, 3)) for _ in range(3)],
                                       test=[aval(labelled(30, 3)) for _ in range(2)])
    with pytest.raises(UserError, match="3 training experiences but 2 test experiences"):
        ordered_experiences(scenario, "default")


BUILDER = '''
import torch
from torch.utils.data import TensorDataset
from avalanche.benchmarks import nc_benchmark


def blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 6
    x = 3 * torch.eye(6)[y] + 0.3 * torch.randn(n, 6, generator=g)
    data = TensorDataset(x, y)
    data.targets = y.tolist()
    return data


def split_blobs(seed: int = 0):
    return nc_benchmark(blobs(600, 0), blobs(120, 1), n_experiences=3, task_labels=False, seed=seed)
'''


@pytest.mark.slow
def test_run_on_an_avalanche_benchmark_from_a_plugin_file(tmp_path):
    (tmp_path / "my_bench.py").write_text(textwrap.dedent(BUILDER))
    cfg = {"seed": 0, "benchmark": {"class_path": f"{tmp_path / 'my_bench.py'}:split_blobs"},
           "model": {"class_path": "mlp", "init_args": {"hidden": 16, "depth": 1}},
           "strategy": {"class_path": "naive"},
           "train": {"epochs": 2, "batch_size": 32, "optimizer": {"class_path": "adam", "init_args": {"lr": 0.05}}},
           "logging": {"progress": False, "tensorboard": False}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_cli("run", "--config", str(tmp_path / "config.yaml"), "--output", str(tmp_path / "out"),
                   env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["benchmark"]["scenario_type"] == "class-il" and result["benchmark"]["num_classes"] == 6
    r = result["r_matrix"]
    assert len(r) == 3 and all(len(row) == 3 for row in r)
    # Class-incremental: an experience's classes are learned when it is trained, and score ~0
    # before (whole-dataset experiences, as read before, would give equal columns).
    assert r[0][0] > 0.9 and r[1][1] > 0.9
    assert max(r[0][1], r[0][2], r[1][2]) < 0.1
