"""Recompute an entry's scores from the matrices it stores, and refuse an entry whose scores differ.

``content_hash`` catches accidental damage, not an edit: whoever changes a score can recompute
the hash too. So every reader that shows scores (render, compare, and run's check of what is
done) recomputes them from what the entry measured, with the function the run scored itself
with (:func:`clbench.metrics.derive.derive_scores`), and refuses a mismatch:

* the CL scores (``acc``, ``bwt``, ``forgetting``, ... see :func:`clbench.metrics.cl_scores`)
  from ``r_matrix``, ``r_init`` and ``reference``, in the direction ``r_metric`` gives (no
  ``r_metric``: accuracy, higher is better). A single-stage run (joint: one row of R) has only
  ``acc``, the mean of that row; its stage-comparing scores are null;
* ``<metric>_final`` from the last row of ``matrices[<metric>]``;
* ``global_<metric>`` from the last value of ``global_test[<metric>]``;
* ``n_eff`` from the final stage of ``route_compositions``, and ``n_eff_null`` and ``n_eff_excess``
  where its layers record them;
* a declared routing metric's ``<metric>_final`` from the last value of ``routing_metrics[<metric>]``;
* ``scores_stderr`` (where the entry has it) from ``r_stderr`` (:mod:`clbench.metrics.stderr`).

A missing value (null) in a mean's row makes that mean null (see :mod:`clbench.metrics.derive`).

Every score key must be one of these, and each one these give must be there, so a score can be
neither added nor hidden. Values match to 1e-9 (relative), far below the 0.1 points a table
shows, so entries written by older code with another summation order still verify.
"""

from __future__ import annotations

import math
from typing import Any

from clbench.errors import UserError

REL_TOL = 1e-9
ABS_TOL = 1e-12
RERUN = "delete it and rerun 'clbench leaderboard run' to regenerate it"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _vector(value: Any, name: str, length: int | None, where: str) -> list[float]:
    """A list of numbers (null, the JSON form of NaN, allowed) of the given length."""
    if not isinstance(value, list) or not all(v is None or _number(v) for v in value):
        raise UserError(f"{name} is not a list of numbers", where=where, fix=RERUN)
    if length is not None and len(value) != length:
        raise UserError(f"{name} has {len(value)} values, expected {length}", where=where, fix=RERUN)
    return [math.nan if v is None else float(v) for v in value]


def r_direction(entry: dict, where: str) -> tuple[list[str] | None, bool]:
    """``(metric names of R's columns or None, higher_is_better)`` from the entry's ``r_metric``.

    An entry without ``r_metric`` (every entry written before the field existed) holds
    accuracies: higher is better.
    """
    spec = entry.get("r_metric")
    if spec is None:
        return None, True
    columns = len(entry["r_matrix"][0]) if isinstance(entry.get("r_matrix"), list) and entry["r_matrix"] \
        and isinstance(entry["r_matrix"][0], list) else None
    names = spec.get("names") if isinstance(spec, dict) else None
    higher = spec.get("higher_is_better") if isinstance(spec, dict) else None
    if not isinstance(higher, bool) or not isinstance(names, list) or not all(isinstance(n, str) for n in names) \
            or (columns is not None and len(names) != columns):
        raise UserError("malformed r_metric: expected {names: [one metric name per test column], "
                        "higher_is_better: true|false}", where=f"{where}: r_metric", fix=RERUN)
    return names, higher


def _r_matrix(entry: dict, where: str) -> list[list[float]]:
    rows = entry["r_matrix"]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise UserError("r_matrix is not a list of rows", where=where, fix=RERUN)
    width = len(rows[0])
    matrix = [_vector(r, "r_matrix", width, where) for r in rows]
    if width == 0 or (len(matrix) != width and len(matrix) != 1):
        raise UserError(f"r_matrix is {len(matrix)} x {width}: expected T x T, or one row for a single-stage run",
                        where=where, fix=RERUN)
    return matrix


def expected_scores(entry: dict, where: str) -> tuple[dict[str, float | None], frozenset[str]]:
    """The scores the entry's stored matrices give (:func:`clbench.metrics.derive.derive_scores`, as
    the run computed them), and which of them a single-stage run may omit."""
    from clbench.metrics.derive import derive_scores
    from clbench.metrics.scores import SCORE_KEYS
    from clbench.results.record import single_stage

    _, higher = r_direction(entry, where)
    r = _r_matrix(entry, where)
    t = len(r[0])
    r_init = _vector(entry["r_init"], "r_init", t, where)
    reference = entry.get("reference")
    if reference is not None:
        reference = _vector(reference, "reference", t, where)
    if "single_stage" in entry and not isinstance(entry["single_stage"], bool):
        raise UserError("single_stage is not true or false", where=f"{where}: single_stage", fix=RERUN)
    single = single_stage(entry)
    if len(r) != (1 if single else t):
        raise UserError(f"r_matrix has {len(r)} row(s) for {t} test experiences, but single_stage is "
                        f"{str(single).lower()}", where=where, fix=RERUN)
    matrices = entry.get("matrices") or {}
    if not isinstance(matrices, dict):
        raise UserError("matrices is not a mapping of metric name to matrix", where=where, fix=RERUN)
    for name, matrix in matrices.items():
        if not isinstance(matrix, list) or not matrix:
            raise UserError(f"matrices.{name} is not a matrix", where=where, fix=RERUN)
        _vector(matrix[-1], f"matrices.{name}", t, where)
    global_test = entry.get("global_test") or {}
    if not isinstance(global_test, dict):
        raise UserError("global_test is not a mapping of metric name to values", where=where, fix=RERUN)
    for name, values in global_test.items():
        if not _vector(values, f"global_test.{name}", None, where):
            raise UserError(f"global_test.{name} is empty", where=where, fix=RERUN)
    compositions = entry.get("route_compositions")
    if compositions:  # the final stage's route-wise N_eff, averaged over MoE layers
        final = compositions[-1] if isinstance(compositions, list) else None
        if not isinstance(final, dict) or not all(isinstance(v, dict) and _number(v.get("n_eff"))
                                                  for v in final.values()):
            raise UserError("route_compositions is not a list of {layer: {n_eff: ...}} per stage", where=where,
                            fix=RERUN)
    routing = entry.get("routing_metrics") or {}
    if not isinstance(routing, dict) or not all(isinstance(v, list) and v for v in routing.values()):
        raise UserError("routing_metrics is not a mapping of metric name to values per stage", where=where, fix=RERUN)
    for name, values in routing.items():
        _vector(values, f"routing_metrics.{name}", None, where)
    expected = derive_scores(r, r_init, reference, single_stage=single, higher_is_better=higher, matrices=matrices,
                             global_test=global_test, compositions=compositions or None, routing=routing)
    optional: frozenset[str] = frozenset()
    if single:  # one training stage: only the final mean is defined; older entries list fewer nulls
        expected = {**{key: None for key in SCORE_KEYS}, **expected}
        optional = frozenset(SCORE_KEYS) - {"acc"}
    return expected, optional


def _same(stored: Any, expected: float | None) -> bool:
    if expected is None:
        return stored is None
    return _number(stored) and math.isclose(float(stored), expected, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def _show(value: Any) -> str:
    return "null" if value is None else repr(value)


def check_scores(entry: dict, where: str) -> None:
    """Refuse (one line naming ``where`` and the score) an ``ok`` entry whose scores its matrices do not give."""
    scores = entry["scores"]
    if not isinstance(scores, dict):
        raise UserError("scores is not a mapping", where=where, fix=RERUN)
    expected, optional = expected_scores(entry, where)
    for key, value in scores.items():
        if key not in expected:
            raise UserError(f"score '{key}' cannot be recomputed from the entry's matrices", where=where, fix=RERUN)
        if not _same(value, expected[key]):
            raise UserError(f"score '{key}' is {_show(value)} but the entry's matrices give {_show(expected[key])}: "
                            "the scores were edited", where=where, fix=RERUN)
    missing = [key for key in expected if key not in scores and key not in optional]
    if missing:
        raise UserError(f"score(s) {', '.join(missing)} missing", where=where, fix=RERUN)
    if entry.get("scores_stderr") is not None:
        _check_stderr(entry, where)


def _check_stderr(entry: dict, where: str) -> None:
    """Refuse ``scores_stderr`` that the entry's ``r_stderr`` does not give (:mod:`clbench.metrics.stderr`)."""
    from clbench.metrics.stderr import entry_score_stderr

    stored = entry["scores_stderr"]
    if not isinstance(stored, dict):
        raise UserError("scores_stderr is not a mapping", where=where, fix=RERUN)
    rows = entry.get("r_stderr")
    if not isinstance(rows, list) or len(rows) != len(entry["r_matrix"]) or not all(
            isinstance(row, list) and len(row) == len(r) for row, r in zip(rows, entry["r_matrix"])):
        raise UserError("r_stderr is not a matrix of the shape of r_matrix", where=where, fix=RERUN)
    for row in rows:
        _vector(row, "r_stderr", None, where)
    expected = entry_score_stderr(entry)
    for key, value in stored.items():
        if key not in expected or not _same(value, expected[key]):
            raise UserError(f"scores_stderr '{key}' is {_show(value)} but the entry's r_stderr gives "
                            f"{_show(expected.get(key))}", where=where, fix=RERUN)
