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
    """What a run needs to know about a stream beyond its datasets.

    ``objective`` names the :mod:`clbench.objectives` component that learns and scores this
    stream (``classification``, ``causal_lm``, ...); a config's ``objective:`` section can
    override it. ``num_classes`` and ``input_shape`` are what a classification model is built
    from; streams of other kinds leave them ``None``.
    """

    name: str
    num_classes: int | None = None
    input_shape: tuple[int, ...] | None = None
    scenario_type: str = "domain-il"
    named_orders: dict[str, list[str]] = field(default_factory=dict)
    global_test: Dataset | None = None  # balanced test set for imbalance metrics (G-mean, MAUC)
    class_names: list[str] | None = None
    objective: str = "classification"
    #: Stream-specific arguments for the objective (e.g. TRACE's metric per task).
    objective_args: dict[str, Any] = field(default_factory=dict)
    #: Score every test column with G-mean and MAUC too (the thesis's imbalance metrics). Opt-in:
    #: MAUC keeps N x K probabilities per column until compute. The built-in image streams (the
    #: thesis's) opt in.
    imbalance_metrics: bool = False


@dataclass
class Experience:
    """One experience as the runner and strategies see it (position = run order)."""

    position: int
    name: str
    domain_id: int
    classes: list[int]
    train: Dataset
    test: Dataset


def _wrap(dataset: Dataset, targets: bool = True, task_label: int = 0):
    """Classification datasets get Avalanche's classification wrapper (it reads their labels;
    ``task_label`` is every sample's task label); datasets without labels (text records) get the
    generic one, which yields items unchanged."""
    if not targets:
        from avalanche.benchmarks.utils import AvalancheDataset

        return AvalancheDataset([dataset])
    from avalanche.benchmarks.utils.classification_dataset import _make_taskaware_classification_dataset

    return _make_taskaware_classification_dataset(dataset, task_labels=task_label)


def build_scenario(spec: StreamSpec, train: Sequence[Dataset], test: Sequence[Dataset], names: Sequence[str],
                   domain_ids: Sequence[int] | None = None, classes: Sequence[Sequence[int]] | None = None,
                   targets: bool = True, task_labels: Sequence[int] | None = None):
    """An Avalanche ``CLScenario`` over (train[i], test[i]) with clbench metadata attached.

    ``targets=False`` is for datasets without integer labels (e.g. ``{"prompt", "answer"}``
    records): they are wrapped as generic Avalanche datasets and, unless ``classes`` says
    otherwise, their experiences have ``classes_in_this_experience == []``. ``task_labels``
    (one per experience; default all 0) is what Avalanche code reads as each sample's task
    label, for a task-incremental stream.
    """
    from avalanche.benchmarks.scenarios.dataset_scenario import benchmark_from_datasets

    from clbench.data.datasets import targets_of

    if not (len(train) == len(test) == len(names)):
        raise ValueError("train, test and names must have one entry per experience")
    if len(set(names)) != len(names):
        raise ValueError(f"experience names must be unique: {list(names)}")
    tasks = list(task_labels) if task_labels is not None else [0] * len(names)
    if len(tasks) != len(names):
        raise ValueError("task_labels must have one entry per experience")
    scenario = benchmark_from_datasets(train=[_wrap(d, targets, t) for d, t in zip(train, tasks)],
                                       test=[_wrap(d, targets, t) for d, t in zip(test, tasks)])
    domain_ids = list(domain_ids) if domain_ids is not None else list(range(len(names)))
    if classes is None and not targets:
        classes = [[] for _ in names]
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
    from clbench.config.load import check_order

    check_order(order, where)  # the same checks as a config's and a suite's
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
    if len(order) != len(names):
        missing = [n for n in names if n not in order]
        raise UserError(f"order leaves out {', '.join(missing)}", where=where,
                        fix="list every experience of the stream exactly once")
    return [names.index(n) for n in order]


def ordered_experiences(scenario, order: Any, *, where: str = "order") -> list[Experience]:
    """The scenario's experiences in run order, as :class:`Experience` records.

    A test stream of one experience (Avalanche's ``ni_benchmark``) is every experience's test
    set: the records share that one dataset object, so the runner evaluates it once.
    """
    from clbench.data.datasets import targets_of, unwrap

    indices = resolve_order(scenario, order, where=where)
    n_train, n_test = len(scenario.train_stream), len(scenario.test_stream)
    if n_test not in (n_train, 1):
        raise UserError(f"the stream has {n_train} training experiences but {n_test} test experiences",
                        where=f"benchmark {type(scenario).__name__}",
                        fix="give the test stream one experience per training experience, or one shared by all")
    foreign = getattr(scenario, "clbench", None) is None
    task_il = foreign and _scenario_type(scenario) == "task-il"
    tests: dict[int, Dataset] = {}
    out = []
    for position, i in enumerate(indices):
        tr = scenario.train_stream[i]
        j = i if n_test == n_train else 0
        if j not in tests:
            tests[j] = unwrap(scenario.test_stream[j].dataset)
        train = unwrap(tr.dataset)
        classes = getattr(tr, "classes_in_this_experience", None)
        if classes is None:
            classes = _classes(tr) if foreign else sorted(set(targets_of(train).tolist()))
        # A foreign task-aware stream's task label is its experiences' domain for the metrics.
        domain = min(_task_labels(tr)) if task_il else i
        out.append(Experience(position=position, name=getattr(tr, "name", f"exp{i}"),
                              domain_id=getattr(tr, "domain_id", domain), classes=[int(c) for c in classes],
                              train=train, test=tests[j]))
    return out


def spec_of(scenario) -> StreamSpec:
    """The scenario's :class:`StreamSpec`, derived for foreign Avalanche scenarios.

    A scenario built elsewhere can carry its own (``scenario.clbench = StreamSpec(...)``) where
    the derived one is wrong: see :func:`_scenario_type` for how the type is read.
    """
    spec = getattr(scenario, "clbench", None)
    if spec is not None:
        return spec
    from clbench.data.datasets import unwrap

    classes: set[int] = set()
    for exp in scenario.train_stream:
        classes |= set(_classes(exp))
    x0 = unwrap(scenario.train_stream[0].dataset)[0][0]
    shape = getattr(x0, "shape", None)
    return StreamSpec(name=type(scenario).__name__, num_classes=max(classes) + 1 if classes else None,
                      input_shape=tuple(shape) if shape is not None else None,
                      scenario_type=_scenario_type(scenario))


def _task_labels(exp) -> set[int]:
    labels = getattr(exp.dataset, "targets_task_labels", None)
    return {int(t) for t in labels.uniques} if labels is not None else {0}


def _classes(exp) -> list[int]:
    """The classes of a foreign experience: Avalanche's own record, else its dataset's labels."""
    from clbench.data.datasets import targets_of, unwrap

    classes = getattr(exp, "classes_in_this_experience", None)
    if classes is None:
        targets = getattr(exp.dataset, "targets", None)
        classes = targets.uniques if hasattr(targets, "uniques") else targets_of(unwrap(exp.dataset)).tolist()
    return sorted({int(c) for c in classes})


def _sources(dataset) -> frozenset[int]:
    """Identities of the plain datasets an Avalanche dataset draws its samples from."""
    from avalanche.benchmarks.utils.flat_data import FlatData
    from torch.utils.data import ConcatDataset, Subset

    found, stack = set(), [dataset]
    while stack:
        node = stack.pop()
        if hasattr(node, "_flat_data"):
            stack.append(node._flat_data)
        elif isinstance(node, FlatData):
            stack.extend(node._datasets)
        elif isinstance(node, ConcatDataset):
            stack.extend(node.datasets)
        elif isinstance(node, Subset):
            stack.append(node.dataset)
        else:
            found.add(id(node))
    return frozenset(found)


def _scenario_type(scenario) -> str:
    """What a foreign scenario asks of a learner, read from its training experiences.

    More than one task label: task-il. Otherwise, class sets that differ between experiences
    (``nc_benchmark``; disjoint or not): class-il. Otherwise the experiences hold the same
    classes: instance-il when they are all drawn from one pool of samples (``ni_benchmark``),
    domain-il when they come from different datasets (``benchmark_from_datasets`` over one
    dataset per domain). The classes compared are the original ones where the scenario relabels
    them (``nc_benchmark(class_ids_from_zero_in_each_exp=True)`` numbers every experience's
    classes from 0, so their labels alone look alike: its ``original_classes_in_exp`` tells).
    """
    exps = list(scenario.train_stream)
    if len(set().union(*(_task_labels(e) for e in exps))) > 1:
        return "task-il"
    original = getattr(scenario, "original_classes_in_exp", None)
    if original is not None and len(original) == len(exps):
        class_sets = {frozenset(int(c) for c in classes) for classes in original}
    else:
        class_sets = {frozenset(_classes(e)) for e in exps}
    if len(class_sets) > 1:
        return "class-il"
    if len(exps) > 1 and len({_sources(e.dataset) for e in exps}) == 1:
        return "instance-il"
    return "domain-il"
