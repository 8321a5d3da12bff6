"""Every score's metadata in one place: key, title, direction, unit and where its formula is.

Tables, the leaderboard page, ``clbench compare``, the run's terminal report and TensorBoard
read titles, directions and units from here, never from lists of their own.

* CL scores (:data:`CL_SCORES`) are functions of R (:func:`clbench.metrics.scores.cl_scores`).
  Their direction is ``"level"`` for a mean of R (it follows R: mean accuracy up, mean error
  down), ``"higher"`` or ``"lower"`` for the rest, whichever way R points.
* Evaluation metrics (:data:`EVAL_METRICS`) are the torchmetrics classes a test column
  computes besides R; ``<metric>_final`` and ``global_<metric>`` take the metric's title and
  its class's ``higher_is_better`` (declared here with the class's import path, so leaderboard
  code stays torch-free; a test checks each against its class).
* ``n_eff`` is a diagnostic of routing: a plain number, not a percentage, with no better side.

Only the standard library is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class EvalMetric:
    """A per-test-column evaluation metric: its title and the torchmetrics class that computes it."""

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

# Table columns, in display order; a table shows those some entry of it has.
TABLE_SCORES = ("acc", "aia", "bwt", "fwt", "forgetting", "gmean_final", "mauc_final", "global_acc", "global_gmean",
                "global_mauc", "n_eff")
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


def score(key: str, r_names: list[str] | None = None) -> Score:
    """The metadata of score ``key``; ``r_names`` (R's metric per column) gives the direction of a
    ``<metric>_final`` whose metric is R's own and not a known evaluation metric (it follows R)."""
    if key in CL_SCORES:
        return CL_SCORES[key]
    if key == N_EFF.key:
        return N_EFF
    metric = _metric_of(key)
    if metric is None:
        return Score(key, key, "higher", "result.json")
    known = EVAL_METRICS.get(metric)
    title = known.title if known else metric
    if key.startswith("global_"):
        title = f"Global {title}"
    source = known.source if known else "clbench.metrics.derive:derive_scores"
    if known is not None:
        direction: Direction = "higher" if known.higher_is_better else "lower"
    else:
        direction = "level" if r_names and metric in r_names else "higher"
    return Score(key, title if known else key, direction, source)


def title(key: str) -> str:
    return score(key).title


def percent(key: str) -> bool:
    return score(key).percent


def higher_is_better(key: str, r_higher: bool = True, r_names: list[str] | None = None) -> bool:
    """Whether a larger value of ``key`` is better in a result whose R points ``r_higher`` and
    whose columns' metrics are ``r_names``."""
    return score(key, r_names).higher_is_better(r_higher)
