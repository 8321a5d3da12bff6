"""Every score's metadata: key, title, direction, unit and where its formula is.

Tables, the leaderboard page, ``clbench compare``, the run's terminal report and TensorBoard
read titles, directions and units through :func:`score`, never from lists of their own.

* CL scores (:data:`CL_SCORES`) are functions of R (:func:`clbench.metrics.scores.cl_scores`),
  declared here. Their direction is ``"level"`` for a mean of R (it follows R: mean accuracy up,
  mean error down), ``"higher"`` or ``"lower"`` for the rest, whichever way R points.
* ``<metric>_final`` and ``global_<metric>`` are scores of an evaluation metric, and the
  metric's class says what it is (:mod:`clbench.metrics.declared`): a run records each metric's
  title, direction and unit in ``result.json`` under ``metrics``, and :func:`score` reads them
  from there (``recorded``), so leaderboard code never imports a metric's class.
  :data:`EVAL_METRICS` is only for entries written before ``metrics`` was recorded: the
  built-in metrics they can hold (a test checks each against its class).
* ``n_eff`` and its controls (:data:`ROUTING_SCORES`) are diagnostics of routing: plain
  numbers, not percentages, with no better side.

A CL score is in R's unit: a percentage where R's metrics are (accuracy, exact match), a plain
number where a metric of R recorded that it is not one (the squared error of the MoE-theory
benchmark), so an error of 2.34 is never shown as "234 %".

A score whose direction none of these gives (a key of no CL score, a metric the entry did not
record, not a built-in, not R's own) is refused with :class:`~clbench.errors.UserError`, never
taken as higher-is-better: ranked the wrong way round it would reverse a table silently.

Only the standard library is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping

from clbench.errors import UserError

Direction = Literal["level", "higher", "lower", "none"]


@dataclass(frozen=True)
class Score:
    """One score of ``result.json``'s ``scores``."""

    key: str
    title: str
    direction: Direction
    formula: str  # where it is computed (its docstring has the formula and source)
    percent: bool = True  # shown as a percentage (x 100), else as a plain number

    def higher_is_better(self, r_higher: bool = True) -> bool:
        """Whether a larger value is better, for an R whose direction is ``r_higher`` (``"none"``: larger)."""
        return r_higher if self.direction == "level" else self.direction != "lower"

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The values a percentage score can take: a mean of R's cells (a ``"level"`` CL score) or
        of a metric's is in [0, 1]; any other CL score is a difference of cells, in [-1, 1]. None
        for a score in a unit of its own (an error, N_eff): intervals of it are not bounded."""
        if not self.percent or self.direction == "none":
            return None
        signed = self.key in CL_SCORES and self.direction != "level"
        return (-1.0, 1.0) if signed else (0.0, 1.0)


@dataclass(frozen=True)
class EvalMetric:
    """A built-in evaluation metric as entries from before ``metrics`` was recorded computed it:
    its title and the torchmetrics class that computes it."""

    name: str
    title: str
    source: str  # "module:Class" of the torchmetrics class
    higher_is_better: bool  # the class's own attribute (checked by the tests)


_CL = "clbench.metrics.scores:cl_scores"
CL_SCORES: dict[str, Score] = {s.key: s for s in (
    Score("acc", "ACC", "level", _CL), Score("aia", "AIA", "level", _CL), Score("bwt", "BWT", "higher", _CL),
    Score("fwt", "FWT", "higher", _CL), Score("forgetting", "Forgetting", "lower", _CL),
    Score("im", "IM", "lower", _CL), Score("fwt_ref", "FWT (ref)", "higher", _CL),
    Score("op", "OP", "level", _CL), Score("bwt_trace", "BWT (TRACE)", "higher", _CL),
    Score("a", "A", "level", _CL), Score("bwt_dr", "BWT (DR)", "higher", _CL), Score("rem", "REM", "higher", _CL),
    Score("bwt_plus", "BWT+", "higher", _CL), Score("fwt_dr", "FWT (DR)", "level", _CL),
    Score("cl_score", "CL_score", "higher", _CL),
)}

EVAL_METRICS: dict[str, EvalMetric] = {m.name: m for m in (
    EvalMetric("acc", "ACC", "torchmetrics.classification:MulticlassAccuracy", True),
    EvalMetric("gmean", "G-mean", "clbench.metrics.gmean:GeometricMean", True),
    EvalMetric("mauc", "MAUC", "clbench.metrics.mauc:MulticlassMAUC", True),
)}

N_EFF = Score("n_eff", "N_eff", "none", "clbench.metrics.compositions:effective_compositions", percent=False)
# N_eff's controls: the N_eff expected with no association between routes and compositions, and
# the bias-corrected N_eff minus it (negative: fewer compositions share a route than chance gives)
ROUTING_SCORES: dict[str, Score] = {s.key: s for s in (
    N_EFF,
    Score("n_eff_null", "N_eff null", "none", "clbench.metrics.compositions:controlled_compositions", percent=False),
    Score("n_eff_excess", "N_eff − null", "none", "clbench.metrics.compositions:controlled_compositions",
          percent=False),
)}

# Table columns, in display order; a table shows those some entry of it has.
TABLE_SCORES = ("acc", "aia", "bwt", "fwt", "forgetting", "gmean_final", "mauc_final", "global_acc", "global_gmean",
                "global_mauc", "n_eff", "n_eff_excess")
# The columns a narrow terminal keeps.
CORE_SCORES = ("acc", "aia", "bwt", "fwt", "forgetting")
# The scores a run's terminal report shows (the rest are in result.json).
REPORT_SCORES = ("acc", "aia", "bwt", "fwt", "forgetting", "im", "fwt_ref", "gmean_final", "mauc_final",
                 "global_gmean", "global_mauc")
RANK_BY = "acc"  # tables rank rows by it


def _metric_of(key: str) -> str | None:
    """``m`` of ``<m>_final`` or ``global_<m>``; None for any other key."""
    if key.endswith("_final"):
        return key[: -len("_final")]
    if key.startswith("global_"):
        return key[len("global_"):]
    return None


Recorded = Mapping[str, Mapping[str, Any]]  # result.json's "metrics": name -> title, higher_is_better, percent


def score(key: str, r_names: list[str] | None = None, recorded: Recorded | None = None) -> Score:
    """The metadata of score ``key``. ``recorded`` (an entry's ``metrics``) says what each of
    its evaluation metrics is; without it (entries from before it was recorded) a built-in
    metric is taken from :data:`EVAL_METRICS`. ``r_names`` (R's metric per column) gives the
    direction of a ``<metric>_final`` whose metric is R's own (it follows R). Any other key
    is refused: its direction is unknown."""
    if key in CL_SCORES:
        return CL_SCORES[key] if r_percent(r_names, recorded) else replace(CL_SCORES[key], percent=False)
    if key in ROUTING_SCORES:
        return ROUTING_SCORES[key]
    metric = _metric_of(key)
    info = (recorded or {}).get(metric) if metric is not None else None
    known = EVAL_METRICS.get(metric) if metric is not None else None
    if info is not None:
        title, higher, percent_ = info["title"], info["higher_is_better"], info.get("percent", True)
        source = info.get("class") or "clbench.metrics.derive:derive_scores"
    elif known is not None:
        title, higher, percent_, source = known.title, known.higher_is_better, True, known.source
    elif metric is not None and r_names and metric in r_names:
        return Score(key, key, "level", "clbench.metrics.derive:derive_scores")
    else:
        raise UserError(f"score '{key}' has no known direction: it is no CL score, and no metric of the entry "
                        "records one", where="result.json: scores",
                        fix="rerun it with this clbench, which records each metric's direction under 'metrics' "
                            "(see clbench.metrics.declared)")
    if key.startswith("global_"):
        title = f"Global {title}"
    return Score(key, title, "higher" if higher else "lower", source, percent=bool(percent_))


def r_percent(r_names: list[str] | None, recorded: Recorded | None) -> bool:
    """Whether R, and so every CL score, is a percentage: unless one of R's metrics (``r_names``)
    recorded in ``recorded`` that it is not (entries from before units were recorded: a percentage)."""
    return not any((recorded or {}).get(name, {}).get("percent", True) is False for name in r_names or ())


def result_percent(result: Mapping[str, Any]) -> bool:
    """:func:`r_percent` of a result or leaderboard entry (its ``r_metric`` names and ``metrics``)."""
    return r_percent((result.get("r_metric") or {}).get("names"), result.get("metrics"))


def shown(value: float | None, percent: bool = True, digits: int = 1) -> str:
    """One value of a score as tables, the page and ``clbench compare`` write it: a percentage
    x 100 to ``digits`` decimals (``85.1``), a plain number to two (``2.41``: an error, N_eff),
    no value as an em dash. Intervals, differences and critical differences use it too, so a
    value and its noise are always written alike."""
    if value is None:
        return "—"
    return f"{100 * value:.{digits}f}" if percent else f"{value:.2f}"


def title(key: str, recorded: Recorded | None = None) -> str:
    return score(key, recorded=recorded).title


def percent(key: str, recorded: Recorded | None = None) -> bool:
    return score(key, recorded=recorded).percent


def higher_is_better(key: str, r_higher: bool = True, r_names: list[str] | None = None,
                     recorded: Recorded | None = None) -> bool:
    """Whether a larger value of ``key`` is better in a result whose R points ``r_higher``,
    whose columns' metrics are ``r_names`` and whose evaluation metrics are ``recorded``."""
    return score(key, r_names, recorded).higher_is_better(r_higher)
