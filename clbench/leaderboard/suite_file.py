"""The suite file's fields and their rules, as pydantic models (:class:`SuiteFile`).

Checked by the mechanism that checks a run config (:func:`clbench.config.validation.check_fields`):
each mistake is one line naming the file and the field. What a field means, and how the grid
is expanded from them, is :mod:`clbench.leaderboard.suite`'s.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from clbench.config.load import order_label
from clbench.config.schema import Count, Named, NonNegative, Order, Section
from clbench.config.validation import refuse
from clbench.leaderboard.launch_settings import Launchers
from clbench.leaderboard.manifest import unranked_problem

# Run-config fields the grid sets; ``base`` may not set them too.
GRID_FIELDS = {"seed": "seeds", "benchmark": "benchmarks", "model": "models", "strategy": "strategies",
               "order": "orders"}


def _distinct_orders(orders: list) -> list:
    labels = [order_label(o) for o in orders]
    repeated = sorted({lab for lab in labels if labels.count(lab) > 1})
    if repeated:
        raise refuse(f"order {repeated[0]} is listed twice", "list each order once")
    return orders


def _distinct_seeds(seeds: list) -> list:
    if len(set(seeds)) != len(seeds):
        raise refuse("a seed is listed twice", "list each seed once")
    return seeds


def _suite_name(name: str) -> str:
    if not _NAME.match(name):
        raise refuse(f"invalid suite name {name!r}",
                     "use letters, digits, '-', '_' or '.', starting with a letter or digit")
    return name


def _grid_free(base: dict | None) -> dict | None:
    for key in base or {}:
        if key in GRID_FIELDS:
            raise refuse(f"'{key}' is set by the grid", f"list it under '{GRID_FIELDS[key]}' instead", at=key)
    return base


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
Orders = Annotated[list[Order], AfterValidator(_distinct_orders),
                   Field(min_length=1, description="a non-empty list of orders (named orders such as default, "
                                                   "lists of experience names, {permutation: <seed>})")]


def _one_line(reason: str) -> str:
    if problem := unranked_problem(reason):
        raise refuse(f"'unranked' {problem}", "say in one sentence why this strategy is shown but not ranked")
    return reason.strip()


class StrategyItem(Named):
    """A strategy of the grid; ``model_args`` laid over every model's ``init_args`` for it,
    ``train_args`` over ``base.train``; ``unranked``: why its rows are shown below the ranking
    instead of in it (a baseline that did not function on this stream), in one sentence that the
    tables print. It is no run config, so it changes no hash."""

    model_args: dict[str, Any] = None  # type: ignore[assignment]
    train_args: dict[str, Any] = None  # type: ignore[assignment]
    unranked: Annotated[str, AfterValidator(_one_line)] | None = None


Strategies = Annotated[list[str | StrategyItem], Field(min_length=1)]


class BenchmarkItem(Named):
    """A benchmark of the grid; ``orders`` of its own (experience names belong to one stream),
    ``strategies`` of its own, in the place of the suite's (a method that runs on one scenario
    type only, or hyper-parameters chosen for this stream), and ``train_args`` laid over
    ``base.train`` for its points (the epochs that give its experiences a protocol's iterations)."""

    orders: Orders = None  # type: ignore[assignment]
    strategies: Strategies = None  # type: ignore[assignment]
    train_args: dict[str, Any] = None  # type: ignore[assignment]


class SuiteFile(Section):
    """A suite file. ``base`` is a partial run config, checked by the run config's own models
    (:func:`clbench.config.load.resolve_config`), as is every cell of the grid."""

    name: Annotated[str, AfterValidator(_suite_name)]
    description: str | None = None
    base: Annotated[dict[str, Any] | None, AfterValidator(_grid_free)] = None
    benchmarks: Annotated[list[str | BenchmarkItem], Field(min_length=1)]
    models: Annotated[list[str | Named], Field(min_length=1)]
    strategies: Strategies = None  # type: ignore[assignment]  # every benchmark's, unless it lists its own
    orders: Orders
    seeds: Annotated[list[NonNegative], Field(min_length=1), AfterValidator(_distinct_seeds)]
    threads: Count | None = None
    cpu_kernels: Literal["native", "default", "avx2", "avx512"] | None = None  # None: portable_default()
    precision: Literal["32-true", "bf16-mixed"] = "32-true"
    launcher: Launchers | None = None

    @model_validator(mode="after")
    def _strategies_everywhere(self) -> SuiteFile:
        for i, bench in enumerate(self.benchmarks):
            if self.strategies is None and not (isinstance(bench, BenchmarkItem) and bench.strategies):
                name = bench if isinstance(bench, str) else bench.class_path
                raise refuse(f"missing: benchmarks[{i}] ({name}) lists no strategies of its own",
                             "list them here (for every benchmark) or under that benchmark's 'strategies'",
                             at="strategies")
        return self
