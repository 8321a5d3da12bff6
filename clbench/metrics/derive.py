"""The scores a result stores, derived from the matrices it stores: one function for the run and re-scoring.

:func:`derive_scores` is what :func:`clbench.results.assemble.assemble` writes into ``result.json`` and
what :mod:`clbench.leaderboard.rescore` expects an entry to hold, so a score can be traced to
its formula in one hop and the two can never disagree:

* the CL scores of R (:func:`clbench.metrics.scores.cl_scores`) in R's direction; a
  single-stage run (joint training: one row of R) has only ``acc``, the mean of that row, and
  null for ``aia``, ``bwt``, ``fwt`` and ``forgetting``;
* ``<metric>_final``: the mean of the last row of each other metric's matrix;
* ``global_<metric>``: the last value of the balanced global test set's metric;
* ``n_eff``: the final stage's route-wise N_eff, averaged over MoE layers; ``n_eff_null`` and
  ``n_eff_excess`` the same of its shuffled-composition null and of the bias-corrected N_eff
  minus that null (:func:`clbench.metrics.compositions.controlled_compositions`), where the
  run recorded them (results written before the null was measured hold ``n_eff`` alone);
* ``<metric>_final`` of a routing metric a plugin declared
  (:func:`clbench.metrics.declared.declare_routing`): its value at the final stage.

A missing entry (null in the JSON, NaN while running: a metric undefined on that test set, or
a column that has no such metric) makes a mean over it undefined (null), as
:func:`~clbench.metrics.scores.cl_scores` does for every score that reads a NaN: ACC and every
``<metric>_final`` are means over *all* T test experiences, and a mean over the columns that
happen to be defined would put runs averaged over different experiences side by side in one
table column. So a final row ``[0.5, null]`` gives null, in the run and when re-scored.

Only NumPy is imported (through ``cl_scores``) besides the score registry, so leaderboard code can
re-score without torch.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from clbench.metrics.score_registry import N_EFF, ROUTING_SCORES

# Scores a single-stage run reports (null) besides ``acc``, as runs have always written them.
SINGLE_STAGE_NULLS = ("aia", "bwt", "fwt", "forgetting")
# N_eff's controls, each the final stage's mean over MoE layers (clbench.metrics.compositions): the
# routing scores the registry names besides N_eff itself.
CONTROLLED_N_EFF = tuple(key for key in ROUTING_SCORES if key != N_EFF.key)


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def mean_or_none(values: Sequence[Any]) -> float | None:
    """The plain mean of ``values`` (Python's summation, as runs have always stored it); None
    when there are none or any is missing (None/NaN) or the mean is not finite."""
    if not values:
        return None
    total = sum(_float(v) for v in values) / len(values)
    return total if math.isfinite(total) else None


def _finite(value: Any) -> float | None:
    value = _float(value)
    return value if math.isfinite(value) else None


def derive_scores(r: Sequence[Sequence[Any]], r_init: Sequence[Any] | None, reference: Sequence[Any] | None = None,
                  *, single_stage: bool, higher_is_better: bool = True,
                  matrices: Mapping[str, Sequence[Sequence[Any]]] | None = None,
                  global_test: Mapping[str, Sequence[Any]] | None = None,
                  compositions: Sequence[Mapping[str, Mapping[str, Any]]] | None = None,
                  routing: Mapping[str, Sequence[Any]] | None = None) -> dict[str, float | None]:
    """Every score of a run from what it measured (see the module notes); None where undefined.

    ``r``: the R matrix (T x T, or one row for a single-stage run); ``matrices``: the other
    metrics' matrices by name; ``global_test``: each global-test metric's value per stage;
    ``compositions``: per stage, ``{layer: {"n_eff": ...}}``; ``routing``: each declared routing
    metric's value per stage. Values may be None or NaN.
    """
    from clbench.metrics.scores import cl_scores

    if single_stage:
        scores: dict[str, float | None] = {"acc": mean_or_none(r[-1])}
        scores.update({key: None for key in SINGLE_STAGE_NULLS})
    else:
        rows = [[_float(v) for v in row] for row in r]
        init = None if r_init is None else [_float(v) for v in r_init]
        ref = None if reference is None else [_float(v) for v in reference]
        scores = cl_scores(rows, r_init=init, reference=ref, higher_is_better=higher_is_better)
    for name, matrix in (matrices or {}).items():
        scores[f"{name}_final"] = mean_or_none(matrix[-1])
    for name, values in (global_test or {}).items():
        scores[f"global_{name}"] = _finite(values[-1])
    if compositions:
        final = list(compositions[-1].values())
        scores[N_EFF.key] = mean_or_none([layer[N_EFF.key] for layer in final])
        if final and all(key in layer for layer in final for key in CONTROLLED_N_EFF):
            for key in CONTROLLED_N_EFF:
                scores[key] = mean_or_none([layer[key] for layer in final])
    for name, values in (routing or {}).items():
        scores[f"{name}_final"] = _finite(values[-1])
    return scores
