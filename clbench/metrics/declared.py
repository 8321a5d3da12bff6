"""What an evaluation metric is (title, direction, unit), read from its class, and how plugins add metrics.

A test column's metrics are torchmetrics ``Metric`` objects, and the metric's class says what
it is: torchmetrics' ``higher_is_better`` gives its direction, and clbench's own classes add a
``title`` (``"G-mean"``) and ``percent`` (shown x 100, else as a plain number). Where a class
does not say (torchmetrics' stock classes have no title; some declare no direction), the one
place the metric is declared, :func:`declare`, says it. A metric whose direction neither its
class nor its declaration gives is refused there, never taken as higher-is-better: a
lower-is-better metric ranked the other way round would reverse a leaderboard without a word.

Plugins add metrics through :attr:`clbench.Objective.extra_metrics` and
:attr:`clbench.Strategy.extra_metrics`, tuples of :func:`declare`\\ d metrics (and of
:func:`declare_routing`\\ d ones, computed from each evaluation pass's routing records); the harness
(:func:`column_metrics`) computes them on every test column beside the objective's own
:meth:`~clbench.Objective.metrics`. Each becomes a matrix in ``result.json`` (``matrices``)
with its scores ``<name>_final`` and, on a stream-wide test set, ``global_<name>``
(:mod:`clbench.metrics.derive`). What every computed metric is goes into ``result.json`` under
``metrics`` (:func:`recorded`), and leaderboard tables, pages and comparisons read titles,
directions and units from there (:mod:`clbench.metrics.score_registry`), so they never import a
metric's class.

This module imports no torch; the classes it reads are the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from clbench.errors import UserError

if TYPE_CHECKING:
    from torchmetrics import Metric

FIX_DIRECTION = "set higher_is_better on the metric's class or pass declare(..., higher_is_better=True|False)"


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _direction(name: str, cls: type, given: bool | None) -> bool:
    """The metric's direction: ``given``, else its class's ``higher_is_better``; refused when neither says."""
    value = given if given is not None else getattr(cls, "higher_is_better", None)
    if not isinstance(value, bool):
        raise UserError(f"metric '{name}' ({class_path(cls)}) declares no direction (higher_is_better is "
                        f"{value!r}), so no table can rank it", fix=FIX_DIRECTION)
    return value


def _percent(cls: type, given: bool | None) -> bool:
    """Shown as a percentage: ``given``, else the class's ``percent``, else whether torchmetrics'
    plot bounds put it in [0, 1] (accuracy yes, an error no)."""
    if given is not None:
        return bool(given)
    if isinstance(getattr(cls, "percent", None), bool):
        return cls.percent
    return (getattr(cls, "plot_lower_bound", None), getattr(cls, "plot_upper_bound", None)) == (0.0, 1.0)


@dataclass(frozen=True)
class MetricSpec:
    """A declared evaluation metric: its name (a key of the column's metrics, so its scores are
    ``<name>_final`` and ``global_<name>``), its class, how to build it for a run, and what it is."""

    name: str
    metric_class: type
    make: Callable[[Any], "Metric"]  # make(objective) -> a fresh metric for one test column
    title: str
    higher_is_better: bool
    percent: bool

    def info(self) -> dict[str, Any]:
        """What ``result.json`` records of it under ``metrics``."""
        return {"title": self.title, "higher_is_better": self.higher_is_better, "percent": self.percent,
                "class": class_path(self.metric_class)}


def declare(name: str, metric_class: type, make: Callable[[Any], "Metric"] | None = None, *,
            title: str | None = None, higher_is_better: bool | None = None,
            percent: bool | None = None) -> MetricSpec:
    """Declare metric ``name`` computed by ``metric_class``.

    ``make(objective)`` builds one for a test column (default: ``metric_class()``); it is given
    the run's objective so that it can read e.g. ``objective.num_classes``. ``title``,
    ``higher_is_better`` and ``percent`` default to the class's attributes of those names
    (``title`` then to ``name``; ``percent`` to whether torchmetrics' plot bounds are [0, 1]).
    A direction that neither gives is refused here, with the fix.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise UserError(f"metric name {name!r} is not an identifier", fix="name it like 'mae' or 'top5_acc'")
    if not isinstance(metric_class, type):
        raise UserError(f"metric '{name}': {metric_class!r} is not a class",
                        fix="pass the torchmetrics Metric subclass, and make= to build it with arguments")
    return MetricSpec(name=name, metric_class=metric_class, make=make or (lambda objective: metric_class()),
                      title=title or getattr(metric_class, "title", None) or name,
                      higher_is_better=_direction(name, metric_class, higher_is_better),
                      percent=_percent(metric_class, percent))


def describe(name: str, metric: "Metric", spec: MetricSpec | None = None) -> dict[str, Any]:
    """What ``result.json`` records of computed metric ``name``: its declaration where it has
    one, else its class's attributes (a direction is required, see :func:`declare`)."""
    if spec is not None and isinstance(metric, spec.metric_class):
        return spec.info()
    return declare(name, type(metric)).info()


@dataclass(frozen=True)
class RoutingMetricSpec:
    """A declared routing metric: after every evaluation pass of a model with routing layers,
    ``compute(routing)`` turns the pass's records (a :class:`RoutingPass`) into one number (None:
    undefined). Its value per stage is ``result.json``'s ``routing_metrics[name]``, and its score
    ``<name>_final`` the final stage's value, ranked and shown as its declaration says."""

    name: str
    compute: Callable[["RoutingPass"], float | None]
    title: str
    higher_is_better: bool
    percent: bool

    def info(self) -> dict[str, Any]:
        """What ``result.json`` records of it under ``metrics``."""
        return {"title": self.title, "higher_is_better": self.higher_is_better, "percent": self.percent,
                "class": class_path(self.compute), "routing": True}


@dataclass(frozen=True)
class RoutingPass:
    """What one evaluation pass recorded of the routing, as a routing metric reads it.

    ``utilization``: per routing layer, :class:`clbench.metrics.ExpertUtilization`'s figures as
    lists (``utilization[d][e]``: the share of domain d's units routed to expert e, ``entropy``,
    ``load_imbalance``, ...); ``compositions``: per layer, the route-wise N_eff figures over the
    test units of the experiences before the current one (:mod:`clbench.metrics.compositions`;
    empty at the first stage); ``domains``: the domain id of each test column, in column order
    (None where a column's test set is shared)."""

    utilization: Mapping[str, Mapping[str, Any]]
    compositions: Mapping[str, Mapping[str, Any]]
    domains: tuple[int | None, ...]


def declare_routing(name: str, compute: Callable[[RoutingPass], float | None], *, title: str | None = None,
                    higher_is_better: bool, percent: bool = False) -> RoutingMetricSpec:
    """Declare routing metric ``name``, computed by ``compute(routing)`` after every evaluation
    pass (a :class:`RoutingPass`); its direction must be given (no class carries one)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise UserError(f"metric name {name!r} is not an identifier", fix="name it like 'top_share'")
    if not callable(compute):
        raise UserError(f"routing metric '{name}': {compute!r} is not callable",
                        fix="pass a function of the pass's routing records (clbench.metrics.RoutingPass)")
    if not isinstance(higher_is_better, bool):
        raise UserError(f"routing metric '{name}' declares no direction (higher_is_better is "
                        f"{higher_is_better!r}), so no table can rank it", fix="pass higher_is_better=True or False")
    return RoutingMetricSpec(name=name, compute=compute, title=title or name, higher_is_better=higher_is_better,
                             percent=bool(percent))


def _declared(objective: Any, strategy: Any) -> dict[str, MetricSpec | RoutingMetricSpec]:
    """Every metric ``objective`` and ``strategy`` declare, by name; one name declared twice is refused."""
    out: dict[str, MetricSpec | RoutingMetricSpec] = {}
    for owner in (objective, strategy):
        for spec in getattr(owner, "extra_metrics", ()) if owner is not None else ():
            if not isinstance(spec, (MetricSpec, RoutingMetricSpec)):
                raise UserError(f"{type(owner).__qualname__}.extra_metrics holds {spec!r}",
                                fix="declare each metric with clbench.metrics.declare(name, MetricClass, ...) "
                                    "or clbench.metrics.declare_routing(name, function, ...)")
            if spec.name in out:
                raise UserError(f"metric '{spec.name}' is declared twice ({type(owner).__qualname__} and another)",
                                fix="give one of them another name")
            out[spec.name] = spec
    return out


def contributed(objective: Any, strategy: Any = None) -> dict[str, MetricSpec]:
    """The metrics ``objective`` and ``strategy`` add to every test column, by name; one name
    declared twice is refused."""
    return {name: spec for name, spec in _declared(objective, strategy).items() if isinstance(spec, MetricSpec)}


def routing_contributed(objective: Any, strategy: Any = None) -> dict[str, RoutingMetricSpec]:
    """The routing metrics ``objective`` and ``strategy`` declare, by name (see :func:`declare_routing`)."""
    return {name: spec for name, spec in _declared(objective, strategy).items()
            if isinstance(spec, RoutingMetricSpec)}


def _check_primary_direction(objective: Any, own: Mapping[str, "Metric"]) -> None:
    """R's direction is the objective's ``higher_is_better`` (CL scores, tables and ranks follow
    it); its primary metric declares one too. Refuse a disagreement: it would rank every method
    backwards without any other sign."""
    if not own:
        return
    name, metric = next(iter(own.items()))
    higher = describe(name, metric, objective.metric_specs().get(name))["higher_is_better"]
    if higher != objective.higher_is_better:
        said = "higher" if objective.higher_is_better else "lower"
        raise UserError(f"objective {type(objective).__qualname__} says R is {said}-is-better, but its primary "
                        f"metric '{name}' ({class_path(type(metric))}) is {'higher' if higher else 'lower'}-is-better",
                        fix="make the objective's higher_is_better agree with its primary metric's direction")


def column_metrics(objective: Any, strategy: Any, column: Any) -> Mapping[str, "Metric"]:
    """One test column's metrics: the objective's own (:meth:`~clbench.Objective.metrics`, the
    primary first), then those the objective and the strategy add (:func:`contributed`).
    Without added metrics it is exactly the objective's."""
    own = objective.metrics(column)
    _check_primary_direction(objective, own)
    extra = contributed(objective, strategy)
    if not extra:
        return own
    out = dict(own.items())
    for name, spec in extra.items():
        if name in out:
            raise UserError(f"metric '{name}' added by extra_metrics is already one of the objective's "
                            f"({', '.join(out)})", fix="give the added metric another name")
        out[name] = spec.make(objective)
    return out


def recorded(columns: Iterable[Mapping[str, "Metric"]], specs: Mapping[str, MetricSpec]) -> dict[str, dict[str, Any]]:
    """``result.json``'s ``metrics``: :func:`describe` of every metric the ``columns`` computed,
    by name, in order of first appearance; ``specs`` are the run's declarations
    (:func:`contributed` and the objective's :meth:`~clbench.Objective.metric_specs`)."""
    out: dict[str, dict[str, Any]] = {}
    for column in columns:
        for name, metric in column.items():
            if name not in out:
                out[name] = describe(name, metric, specs.get(name))
    return out
