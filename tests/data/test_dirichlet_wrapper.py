"""The ``dirichlet`` benchmark: any classification stream re-cut into Dirichlet class-skewed experiences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, Subset

from clbench.benchmarks.dirichlet_stream import dirichlet
from clbench.benchmarks.images import ImageArray
from clbench.config.load import resolve_config
from clbench.data.datasets import ArrayDataset, targets_of
from clbench.errors import UserError
from dataset_layouts import write_core50, write_office_home
from clbench.engine.runner import run
from clbench.data.streams import ordered_experiences
from helpers import tiny_config

OBJECTS = [1, 2, 3, 6, 7, 11]


@pytest.fixture(scope="module")
def core50_root(tmp_path_factory) -> Path:
    return write_core50(tmp_path_factory.mktemp("core50"), objects=OBJECTS, frames=5, npz=True)


@pytest.fixture(scope="module")
def office_home_root(tmp_path_factory) -> Path:
    return write_office_home(tmp_path_factory.mktemp("oh"), classes=["Alarm_Clock", "Backpack", "Batteries", "TV"],
                             per_class=6)


def core50_source(root) -> dict:
    return {"class_path": "core50", "init_args": {"root": str(root), "objects": OBJECTS, "image_size": 8}}


def _keys(dataset) -> list:
    """Where every sample of a (pooled, subset) dataset comes from: (source dataset, row)."""
    if isinstance(dataset, Subset):
        inner = _keys(dataset.dataset)
        return [inner[i] for i in dataset.indices]
    if isinstance(dataset, ConcatDataset):
        return [key for part in dataset.datasets for key in _keys(part)]
    if isinstance(dataset, ImageArray):
        return [("npz", int(i)) for i in dataset.indices]
    if hasattr(dataset, "paths"):
        return [("file", str(p)) for p in dataset.paths]
    raise TypeError(type(dataset))


def _check_partition(scenario, source_scenario):
    exps = ordered_experiences(scenario, "default")
    source = ordered_experiences(source_scenario, "default")
    split = scenario.dirichlet
    # class proportions per experience are the split's
    labels = [targets_of(e.train).numpy() for e in exps]
    classes = np.unique(np.concatenate(labels))
    counts = np.array([[(y == c).sum() for c in classes] for y in labels])
    assert np.allclose(counts / counts.sum(axis=0), split.proportions)
    # the union of the experiences' training samples is the source's pool, each sample once
    pooled = np.sort(np.concatenate(split.train_indices))
    assert pooled.tolist() == list(range(sum(len(e.train) for e in source)))
    got = [k for e in exps for k in _keys(e.train)]
    want = [k for e in source for k in _keys(e.train)]
    assert len(got) == len(set(got)) and set(got) == set(want)
    # the global test set is balanced over the classes
    global_counts = np.bincount(targets_of(scenario.clbench.global_test).numpy())
    assert len(set(global_counts[global_counts > 0].tolist())) == 1
    assert (global_counts > 0).sum() == len(classes)
    return exps


def test_core50_is_recut_into_skewed_experiences_that_cover_its_pool(core50_root):
    scenario = dirichlet(core50_source(core50_root), alpha=0.3, num_experiences=4, min_size=10, seed=1)
    exps = _check_partition(scenario, scenario.source)
    spec = scenario.clbench
    assert spec.num_classes == len(OBJECTS) and spec.scenario_type == "instance-il"
    assert [e.name for e in exps] == ["part0", "part1", "part2", "part3"]
    assert min(len(e.train) for e in exps) >= 10
    assert len(scenario.dirichlet_domains) == 4 and len(set(sum(scenario.dirichlet_domains, []))) == 11
    x, y = exps[0].train[0]
    assert tuple(x.shape) == (3, 8, 8) and isinstance(y, int)


def test_office_home_is_recut_too(office_home_root):
    source = {"class_path": "office-home", "init_args": {"root": str(office_home_root), "image_size": 8,
                                                          "classes": ["Alarm_Clock", "Backpack", "Batteries", "TV"]}}
    scenario = dirichlet(source, alpha=0.5, num_experiences=3, seed=0)
    _check_partition(scenario, scenario.source)


def test_digits_domains_pool_keeps_each_domains_samples():
    source = {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]}}
    scenario = dirichlet(source, alpha=0.3, num_experiences=3, min_size=50)
    exps = ordered_experiences(scenario, "default")
    split = scenario.dirichlet
    pool = torch.cat([e.train.x for e in ordered_experiences(scenario.source, "default")])
    for exp, idx in zip(exps, split.train_indices):
        assert isinstance(exp.train, ArrayDataset)  # in-memory streams stay batched
        assert torch.equal(exp.train.x, pool[idx])
    assert sorted(np.concatenate(split.train_indices).tolist()) == list(range(len(pool)))
    assert sum(len(e.train) for e in exps) == len(pool)


def test_the_same_seed_gives_the_same_partition(core50_root):
    a = dirichlet(core50_source(core50_root), num_experiences=3, seed=3).dirichlet
    b = dirichlet(core50_source(core50_root), num_experiences=3, seed=3).dirichlet
    c = dirichlet(core50_source(core50_root), num_experiences=3, seed=4).dirichlet
    assert all(np.array_equal(x, y) for x, y in zip(a.train_indices, b.train_indices))
    assert not all(np.array_equal(x, y) for x, y in zip(a.train_indices, c.train_indices))


@pytest.mark.parametrize("source, where", [
    ("core50", "benchmark.init_args.source"),
    ({"class_path": "no-such-stream"}, "benchmark.init_args.source.class_path"),
    ({"class_path": "digits-domains", "init_args": {"domain": ["rot0"]}},
     "benchmark.init_args.source.init_args.domain"),
    ({"class_path": "digits-domains", "init_args": {"domains": ["rot7"]}},
     "benchmark.init_args.source.init_args.domains[0]"),
    ({"class_path": "digits-domains", "args": {}}, "benchmark.init_args.source.args"),
    ({"class_path": "dirichlet", "init_args": {}}, "benchmark.init_args.source.class_path"),
    ({"class_path": "trace-mini"}, "benchmark.init_args.source"),
])
def test_a_bad_source_is_a_one_line_error(source, where):
    from clbench.plugins.build import check_init_args

    with pytest.raises(UserError) as err:  # its form is checked from the signature, as a run does
        check_init_args(dirichlet, {"source": source}, "benchmark.init_args")
        dirichlet(source)
    message = str(err.value)
    assert message.startswith(where + ":") and "\n" not in message


def test_a_run_through_the_runner(tmp_path):
    bench = {"class_path": "dirichlet", "init_args": {
        "source": {"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]}},
        "alpha": 0.3, "num_experiences": 3, "min_size": 50}}
    result = run(resolve_config(tiny_config(benchmark=bench)), tmp_path / "out")
    assert result["experiences"] == ["part0", "part1", "part2"]
    assert len(result["r_matrix"]) == 3 and "global_test" in result
    assert result["benchmark"]["scenario_type"] == "instance-il"
    assert (tmp_path / "out" / "result.json").is_file()


def test_a_bad_source_in_a_config_names_the_file(tmp_path):
    bench = {"class_path": "dirichlet", "init_args": {"source": {"class_path": "digits-domainz"}}}
    with pytest.raises(UserError, match=r"^exp\.yaml: benchmark\.init_args\.source\.class_path"):
        run(resolve_config(tiny_config(benchmark=bench), source="exp.yaml"), None, source="exp.yaml")
