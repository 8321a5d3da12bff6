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
class-skewed experiences by :func:`benchmarks.dirichlet.dirichlet_split`, the algorithm
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

import numpy as np

from benchmarks.dirichlet import dirichlet_split
from clbench.errors import UserError

WHERE = "benchmark.init_args"


def _source_scenario(source):
    """Build the source benchmark; its own errors are re-addressed under ``source.init_args``."""
    from clbench import registry
    from clbench.build import check_init_args

    where = f"{WHERE}.source"
    if not isinstance(source, dict) or not isinstance(source.get("class_path"), str):
        raise UserError(f"source must be a benchmark such as {{class_path: core50, init_args: {{...}}}}, got "
                        f"{source!r}", where=where, fix="give source a class_path (see 'clbench list benchmarks')")
    unknown = sorted(set(source) - {"class_path", "init_args"})
    if unknown:
        raise UserError(f"unknown key '{unknown[0]}'", where=f"{where}.{unknown[0]}",
                        fix="a source has class_path and init_args")
    name, args = source["class_path"], source.get("init_args") or {}
    if name == "dirichlet":
        raise UserError("the source is itself a Dirichlet stream", where=f"{where}.class_path",
                        fix="give the stream to re-partition, e.g. core50")
    target = registry.resolve("benchmarks", name, where=f"{where}.class_path")
    check_init_args(target, args, f"{where}.init_args")
    try:
        return target(**args)
    except UserError as err:
        if err.where and err.where.startswith(WHERE):
            err.where = f"{where}.init_args" + err.where[len(WHERE):]
            err.args = (err.one_line(),)
        raise


def _pool(datasets: list):
    """One dataset over ``datasets`` and each sample's position in the list."""
    from clbench.data import concat

    owner = np.concatenate([np.full(len(d), i) for i, d in enumerate(datasets)])
    return concat(datasets), owner


def dirichlet(source: dict, alpha: float = 0.3, num_experiences: int = 5, min_size: int = 1, balanced: bool = True,
              seed: int = 0):
    """The ``source`` stream's training data re-cut into Dirichlet(``alpha``) class-skewed experiences."""
    from clbench.data import subset, targets_of
    from clbench.streams import StreamSpec, build_scenario, ordered_experiences, spec_of

    scenario = _source_scenario(source)
    spec = spec_of(scenario)
    if spec.objective != "classification" or not spec.num_classes:
        raise UserError(f"source '{source['class_path']}' is not a classification stream", where=f"{WHERE}.source",
                        fix="a Dirichlet split needs integer class labels")
    experiences = ordered_experiences(scenario, "default", where=f"{WHERE}.source")
    train, train_domain = _pool([exp.train for exp in experiences])
    tests = list({id(exp.test): exp.test for exp in experiences}.values())
    test, _ = _pool(tests)
    y_train, y_test = targets_of(train).numpy(), targets_of(test).numpy()
    split = dirichlet_split(y_train, y_test, num_experiences=num_experiences, alpha=alpha, min_size=min_size,
                            balanced=balanced, seed=seed, where=WHERE)
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
