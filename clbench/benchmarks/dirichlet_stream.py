"""``dirichlet``: Dirichlet class imbalance over any labelled stream.

::

    benchmark:
      class_path: dirichlet
      init_args:
        source: {class_path: core50, init_args: {root: data/core50}}
        alpha: 0.3
        num_experiences: 5

The source stream is built through the registry, its experiences' training sets are pooled
(in the source's own order) and the pool is re-partitioned into ``num_experiences``
class-skewed experiences by :func:`clbench.benchmarks.dirichlet.dirichlet_split`, the algorithm
``digits-dirichlet`` and ``cifar10-dirichlet`` use. The source's test sets are pooled the same
way (a test set shared by several experiences, as in CORe50's NI protocol, counted once): each
experience's test split follows its training class mix, and a class-balanced subsample of the
pool is the global test set for G-mean and MAUC.

Choices: the experiences mix the source's domains, so the stream is ``instance-il`` and each
experience is its own domain id (the source's domain of a sample is kept in
``scenario.dirichlet_domains`` for analysis). ``balanced`` defaults to true, as in every
thesis configuration (App. B). Samples keep the source's transforms (training augmentation,
evaluation preprocessing).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from typing_extensions import NotRequired, TypedDict

from clbench.benchmarks.dirichlet import Alpha, MinSize, NumExperiences, dirichlet_split
from clbench.config.validation import ArgumentError, argument_path, mapping_argument


@mapping_argument
class Source(TypedDict):
    """The stream to re-partition, written as a config's ``benchmark``: ``{class_path: core50, init_args: {...}}``."""

    class_path: str
    init_args: NotRequired[dict[str, Any] | None]


def _source_scenario(source: Source):
    """Build the source benchmark; its own errors are re-addressed under ``source.init_args``."""
    from clbench import registry
    from clbench.config.init_args import check_init_args

    where = argument_path("benchmark", "source")
    name, args = source["class_path"], source.get("init_args") or {}
    if name == "dirichlet":
        raise ArgumentError("benchmark", "source.class_path", "the source is itself a Dirichlet stream",
                            fix="give the stream to re-partition, e.g. core50")
    target = registry.resolve("benchmarks", name, where=f"{where}.class_path")
    check_init_args(target, args, f"{where}.init_args")
    try:
        return target(**args)
    except ArgumentError as err:
        raise err.nested("source") from None


def _pool(datasets: list):
    """One dataset over ``datasets`` and each sample's position in the list."""
    from clbench.data.datasets import concat

    owner = np.concatenate([np.full(len(d), i) for i, d in enumerate(datasets)])
    return concat(datasets), owner


def dirichlet(source: Source, alpha: Alpha = 0.3, num_experiences: NumExperiences = 5, min_size: MinSize = 1,
              balanced: bool = True, seed: int = 0):
    """The ``source`` stream's training data re-cut into Dirichlet(``alpha``) class-skewed experiences."""
    from clbench.data.datasets import subset, targets_of
    from clbench.data.streams import StreamSpec, build_scenario, ordered_experiences, spec_of

    scenario = _source_scenario(source)
    spec = spec_of(scenario)
    if spec.objective != "classification" or not spec.num_classes:
        raise ArgumentError("benchmark", "source", f"source '{source['class_path']}' is not a classification stream",
                            fix="a Dirichlet split needs integer class labels")
    experiences = ordered_experiences(scenario, "default", where=argument_path("benchmark", "source"))
    train, train_domain = _pool([exp.train for exp in experiences])
    tests = list({id(exp.test): exp.test for exp in experiences}.values())
    test, _ = _pool(tests)
    y_train, y_test = targets_of(train).numpy(), targets_of(test).numpy()
    split = dirichlet_split(y_train, y_test, num_experiences=num_experiences, alpha=alpha, min_size=min_size,
                            balanced=balanced, seed=seed)
    names = [f"part{p}" for p in range(num_experiences)]
    out = StreamSpec(name=f"dirichlet-{spec.name}", num_classes=spec.num_classes, input_shape=spec.input_shape,
                     scenario_type="instance-il", global_test=subset(test, split.global_test_indices),
                     class_names=spec.class_names, objective=spec.objective, objective_args=dict(spec.objective_args),
                     imbalance_metrics=True)
    result = build_scenario(out, [subset(train, idx) for idx in split.train_indices],
                            [subset(test, idx) for idx in split.test_indices], names=names)
    result.dirichlet = split  # indices into the pooled training / test sets, class proportions
    result.dirichlet_domains = [[experiences[i].domain_id for i in train_domain[idx]] for idx in split.train_indices]
    result.source = scenario
    return result
