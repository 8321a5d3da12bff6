"""Streams as Avalanche scenarios, with the metadata the harness needs.

A benchmark builder returns a :class:`StreamSpec`-carrying Avalanche ``CLScenario``: its
``train_stream`` and ``test_stream`` hold one experience per domain/partition, and every
experience carries ``name``, ``domain_id`` and ``classes_in_this_experience``. The scenario
itself carries ``clbench`` (a :class:`StreamSpec`: number of classes, input shape, scenario
type, named orders, an optional balanced global test set). Avalanche code can consume these
scenarios as they are; the harness consumes any Avalanche scenario too (metadata it lacks is
derived).

Orders are applied here, once, before a run: a named order, an explicit list of experience
names, or a seeded permutation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from torch.utils.data import Dataset

from clbench.errors import UserError

SCENARIO_TYPES = ("domain-il", "class-il", "instance-il", "task-il")


@dataclass
class StreamSpec:
    """What a run needs to know about a stream beyond its datasets."""

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    scenario_type: str = "domain-il"
    named_orders: dict[str, list[str]] = field(default_factory=dict)
    global_test: Dataset | None = None  # balanced test set for imbalance metrics (G-mean, MAUC)
    class_names: list[str] | None = None


@dataclass
class Experience:
    """One experience as the runner and strategies see it (position = run order)."""

    position: int
    name: str
    domain_id: int
    classes: list[int]
    train: Dataset
    test: Dataset


def _wrap(dataset: Dataset):
    from avalanche.benchmarks.utils.classification_dataset import _make_taskaware_classification_dataset

    return _make_taskaware_classification_dataset(dataset, task_labels=0)


def build_scenario(spec: StreamSpec, train: Sequence[Dataset], test: Sequence[Dataset], names: Sequence[str],
                   domain_ids: Sequence[int] | None = None, classes: Sequence[Sequence[int]] | None = None):
    """An Avalanche ``CLScenario`` over (train[i], test[i]) with clbench metadata attached."""
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets

    from clbench.data import targets_of

    if not (len(train) == len(test) == len(names)):
        raise ValueError("train, test and names must have one entry per experience")
    if len(set(names)) != len(names):
        raise ValueError(f"experience names must be unique: {list(names)}")
    scenario = benchmark_from_datasets(train=[_wrap(d) for d in train], test=[_wrap(d) for d in test])
    domain_ids = list(domain_ids) if domain_ids is not None else list(range(len(names)))
    for i, name in enumerate(names):
        present = sorted(set(targets_of(train[i]).tolist())) if classes is None else sorted(classes[i])
        for exp in (scenario.train_stream[i], scenario.test_stream[i]):
            exp.name = name
            exp.domain_id = domain_ids[i]
            exp.classes_in_this_experience = present
    scenario.clbench = spec
    return scenario


def experience_names(scenario) -> list[str]:
    return [getattr(exp, "name", f"exp{i}") for i, exp in enumerate(scenario.train_stream)]


def resolve_order(scenario, order: Any, *, where: str = "order") -> list[int]:
    """Indices into the builder's experiences, in run order."""
    names = experience_names(scenario)
    spec: StreamSpec | None = getattr(scenario, "clbench", None)
    named = {"default": names, "reverse": names[::-1], **(spec.named_orders if spec else {})}
    if isinstance(order, str):
        if order not in named:
            raise UserError(f"unknown order '{order}'", where=where,
                            fix=f"valid named orders: {', '.join(sorted(named))}; or a list of names, "
                                "or {permutation: <seed>}")
        order = named[order]
    if isinstance(order, dict):
        rng = np.random.default_rng(order["permutation"])
        return [int(i) for i in rng.permutation(len(names))]
    unknown = [n for n in order if n not in names]
    if unknown:
        raise UserError(f"unknown experience(s) {', '.join(map(str, unknown))}", where=where,
                        fix=f"this stream's experiences are: {', '.join(names)}")
    if len(set(order)) != len(order):
        raise UserError("an experience appears more than once", where=where, fix="list each experience once")
    if len(order) != len(names):
        missing = [n for n in names if n not in order]
        raise UserError(f"order leaves out {', '.join(missing)}", where=where,
                        fix="list every experience of the stream exactly once")
    return [names.index(n) for n in order]


def ordered_experiences(scenario, order: Any, *, where: str = "order") -> list[Experience]:
    """The scenario's experiences in run order, as :class:`Experience` records."""
    from clbench.data import targets_of, unwrap

    indices = resolve_order(scenario, order, where=where)
    out = []
    for position, i in enumerate(indices):
        tr, te = scenario.train_stream[i], scenario.test_stream[i]
        train, test = unwrap(tr.dataset), unwrap(te.dataset)
        classes = getattr(tr, "classes_in_this_experience", None)
        if classes is None:
            classes = sorted(set(targets_of(train).tolist()))
        out.append(Experience(position=position, name=getattr(tr, "name", f"exp{i}"),
                              domain_id=getattr(tr, "domain_id", i), classes=list(classes),
                              train=train, test=test))
    return out


def spec_of(scenario) -> StreamSpec:
    """The scenario's :class:`StreamSpec`, derived for foreign Avalanche scenarios."""
    spec = getattr(scenario, "clbench", None)
    if spec is not None:
        return spec
    from clbench.data import unwrap

    classes: set[int] = set()
    for exp in scenario.train_stream:
        classes |= set(int(c) for c in exp.dataset.targets.uniques)
    x0 = unwrap(scenario.train_stream[0].dataset)[0][0]
    return StreamSpec(name=type(scenario).__name__, num_classes=max(classes) + 1, input_shape=tuple(x0.shape))
