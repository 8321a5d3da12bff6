"""Continual-learning scores as pure functions of the R matrix.

Convention (as everywhere in clbench): ``R[i, j]`` is the score on test experience j after
training experience i, both in run order, as fractions in [0, 1]; the matrix is the full T x T
one (future experiences included). In the formulas below indices are 1-based like the sources
(``R[T, j]`` is the last row); ``b_j`` = ``r_init[j]`` is the untrained model's score and
``a*_j`` = ``reference[j]`` the score of a reference model trained only on experience j.
``docs/metrics.md`` has each formula with its source and the places where libraries disagree.

R may also hold errors, where lower is better (``higher_is_better=False``). The scores then keep
the classical reading of their sign: every *transfer* score (BWT, FWT, IM, ...) is turned so
that its usual "good" side stays good (BWT < 0 still means forgetting), while the *levels*
(ACC, AIA, A, FWT_DR) stay plain means of R, so for errors they are mean errors, lower better.
:func:`score_higher_is_better` says which way each score points.

Only NumPy is imported, so result and leaderboard code can score runs without torch.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from clbench.errors import UserError
from clbench.metrics.score_registry import CL_SCORES, score

# Díaz-Rodríguez et al. (2018) criteria that R alone determines. MS, SSS and CE need model and
# memory sizes and operation counts, which the R matrix does not carry.
CL_SCORE_CRITERIA = ("a", "rem", "bwt_plus", "fwt_dr")
DEFAULT_CL_SCORE_WEIGHTS: Mapping[str, float] = {name: 0.25 for name in CL_SCORE_CRITERIA}

SCORE_KEYS = tuple(CL_SCORES)  # in cl_scores' order; titles and directions: clbench.metrics.score_registry


def score_higher_is_better(key: str, higher_is_better: bool = True) -> bool:
    """Whether a larger value of CL score ``key`` is better, for an R whose direction is given.

    Levels (``acc``, ``op``, ``aia``, ``a``, ``fwt_dr``) follow R; ``forgetting`` and ``im`` are
    always lower-is-better; every other score (BWT, FWT, REM, BWT+, CL_score) is
    higher-is-better for both directions of R (:data:`clbench.metrics.score_registry.CL_SCORES`).
    """
    return score(key).higher_is_better(higher_is_better)


def _as_array(values: Any, name: str, ndim: int) -> np.ndarray:
    if hasattr(values, "detach"):  # torch tensor, on any device
        values = values.detach().cpu().numpy()
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be numeric: {err}") from None
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {array.shape}")
    return array


def _value(x: float) -> float | None:
    """A python float, or None where an input entry was missing (NaN)."""
    return None if x is None or not np.isfinite(x) else float(x)


def cl_scores(r_matrix: Any, r_init: Any = None, reference: Any = None, *,
              weights: Mapping[str, float] | None = None,
              higher_is_better: bool = True) -> dict[str, float | None]:
    """All CL scores of one run; None where a score is undefined.

    A score is None when T is too small (everything that compares stages needs T >= 2), when
    its extra input is missing (``fwt`` needs ``r_init``; ``im`` and ``fwt_ref`` need
    ``reference``), or when an entry it reads is NaN (so a protocol that evaluates only seen
    experiences, NaN above the diagonal, still gets every backward-looking score).

    Keys (1-based, T = number of experiences):

    - ``acc``: final average accuracy, (1/T) sum_j R[T, j] (GEM's ACC).
    - ``op``: TRACE's overall performance OP_T = (1/T) sum_j R[T, j]; equal to ``acc`` by
      definition, kept under TRACE's name.
    - ``aia``: average incremental accuracy, (1/T) sum_t (1/t) sum_{j<=t} R[t, j] (Rebuffi et
      al.'s iCaRL curve average). The thesis (A.2) writes only (1/D) sum_d a_d, which can also
      be read as the final average accuracy; that reading is ``acc``.
    - ``bwt``: GEM backward transfer, (1/(T-1)) sum_{j<T} (R[T, j] - R[j, j]); < 0 = forgetting.
      Avalanche's stream BWT is the same number (minus its first-minus-last forgetting).
    - ``bwt_trace``: TRACE/MH-MoE BWT_T = (1/T) sum_{j<=T} (R[T, j] - R[j, j]). Sign as in their
      tables (< 0 = forgetting; the printed Eq. 21 has it reversed), denominator T as printed
      (the j = T term is 0), so it equals bwt * (T-1)/T.
    - ``forgetting``: Chaudhry et al. (2018) at the final stage, (1/(T-1)) sum_{j<T}
      (max_{j<=l<T} R[l, j] - R[T, j]); > 0 = forgetting, can be negative. The max runs over
      the stages from the one that trained j to the one before last: scores on j before it was
      trained are transfer, not knowledge that can be forgotten. The thesis's FM takes the max
      up to l = T (never negative, although its results report negative forgetting); Avalanche
      uses R[j, j] - R[T, j] (= -bwt), which differs whenever an old score rose after training.
    - ``fwt``: GEM forward transfer, (1/(T-1)) sum_{j>=2} (R[j-1, j] - b_j), b = ``r_init``.
    - ``fwt_ref``: the thesis's FWT, (1/(T-1)) sum_{j>=2} (R[j-1, j] - a*_j); the reference
      model was trained on j, so this is usually negative.
    - ``im``: the thesis's intransigence IM = a*_T - R[T, T] (Chaudhry et al.'s I_k at k = T);
      lower is better.
    - ``a``: Díaz-Rodríguez et al. accuracy over time, mean of R[i, j] over i >= j.
    - ``bwt_dr``: their averaged BWT, mean of (R[i, j] - R[j, j]) over i > j.
    - ``rem``: remembering, 1 - |min(bwt_dr, 0)|.  ``bwt_plus``: max(bwt_dr, 0).
    - ``fwt_dr``: their FWT, mean of R[i, j] over i < j (scores on not-yet-trained experiences).
    - ``cl_score``: sum_k w_k c_k over the criteria in ``CL_SCORE_CRITERIA`` (A, REM, BWT+,
      FWT); equal weights 1/4 by default (``weights`` overrides; they must sum to 1). Their
      paper's MS, SSS and CE need sizes and op counts that R does not carry, so they are left
      out rather than guessed. The criteria lie in [0, 1] when R does.

    With ``higher_is_better=False`` R holds errors (lower is better) and, with s = -1, every
    difference above is multiplied by s, so each score keeps the meaning of its sign:

    - ``acc``, ``op``, ``aia``, ``a``, ``fwt_dr``: unchanged formulas, so mean (final,
      incremental, over time, on unseen experiences) *errors*: lower is better.
    - ``bwt`` = (1/(T-1)) sum_{j<T} (R[j, j] - R[T, j]); ``bwt_trace`` and ``bwt_dr`` likewise:
      < 0 = the error on old experiences grew (forgetting), higher is better.
    - ``forgetting`` = (1/(T-1)) sum_{j<T} (R[T, j] - min_{j<=l<T} R[l, j]): the increase of
      error over each experience's best, > 0 = forgetting, lower is better.
    - ``fwt`` = (1/(T-1)) sum_{j>=2} (b_j - R[j-1, j]) and ``fwt_ref`` with a*_j: > 0 = a lower
      error than the untrained (reference) model before training j, higher is better.
    - ``im`` = R[T, T] - a*_T: how much higher the final error on the last experience is than
      the reference model's, lower is better.
    - ``rem`` = 1 - |min(bwt_dr, 0)| and ``bwt_plus`` = max(bwt_dr, 0) from that ``bwt_dr``.
    - ``cl_score``: None. Its criteria add accuracies in [0, 1] to REM and BWT+; an error
      (possibly unbounded, e.g. a mean squared error) gives no such sum.

    With ``higher_is_better=True`` (the default) nothing is negated, so classification scores
    are bit-identical to the formulas above. :func:`score_higher_is_better` gives each score's
    direction.
    """
    r = _as_array(r_matrix, "r_matrix", 2)
    if r.shape[0] != r.shape[1] or r.shape[0] == 0:
        raise ValueError(f"r_matrix must be square T x T with T >= 1, got shape {r.shape}")
    t = r.shape[0]
    init = None if r_init is None else _as_array(r_init, "r_init", 1)
    ref = None if reference is None else _as_array(reference, "reference", 1)
    for name, vec in (("r_init", init), ("reference", ref)):
        if vec is not None and vec.shape[0] != t:
            raise ValueError(f"{name} must have length T={t}, got {vec.shape[0]}")
    w = _check_weights(weights)
    if not isinstance(higher_is_better, (bool, np.bool_)):
        raise ValueError(f"higher_is_better must be a bool, got {higher_is_better!r}")

    def signed(x):  # a difference turned so that > 0 keeps its classical meaning
        return x if higher_is_better else -x

    last, diag = r[-1], np.diagonal(r)
    lower_incl = np.tril_indices(t)
    lower = np.tril_indices(t, k=-1)
    upper = np.triu_indices(t, k=1)
    nan = float("nan")
    s: dict[str, float] = {}
    s["acc"] = s["op"] = last.mean()
    s["aia"] = np.mean([r[i, : i + 1].mean() for i in range(t)])
    if t >= 2:
        s["bwt"] = signed((last[:-1] - diag[:-1]).mean())
        s["bwt_trace"] = signed((last - diag).sum() / t)
        best = [r[j:-1, j].max() if higher_is_better else r[j:-1, j].min() for j in range(t - 1)]
        s["forgetting"] = signed((np.asarray(best) - last[:-1]).mean())
        before = r[np.arange(t - 1), np.arange(1, t)]          # R[j-1, j], j = 2..T
        s["fwt"] = signed((before - init[1:]).mean()) if init is not None else nan
        s["fwt_ref"] = signed((before - ref[1:]).mean()) if ref is not None else nan
        s["bwt_dr"] = signed((r[lower] - diag[lower[1]]).mean())
        s["fwt_dr"] = r[upper].mean()
    else:
        for key in ("bwt", "bwt_trace", "forgetting", "fwt", "fwt_ref", "bwt_dr", "fwt_dr"):
            s[key] = nan
    s["im"] = signed(ref[-1] - r[-1, -1]) if ref is not None else nan
    s["a"] = r[lower_incl].mean()
    s["rem"] = 1.0 - abs(min(s["bwt_dr"], 0.0)) if np.isfinite(s["bwt_dr"]) else nan
    s["bwt_plus"] = max(s["bwt_dr"], 0.0) if np.isfinite(s["bwt_dr"]) else nan
    s["cl_score"] = sum(weight * s[name] for name, weight in w.items() if weight != 0) if higher_is_better \
        else nan
    return {key: _value(s[key]) for key in SCORE_KEYS}


def trace_task_scores(r_matrix: Any, names: list[str] | None = None) -> dict[str, Any]:
    """OP and BWT as the MH-MoE and MoSEs papers report them on TRACE, overall and per task.

    - ``op`` = (1/T) sum_i R[T, i] (TRACE's OP_T; MH-MoE Eq. 20); per task its term, the final
      score R[T, i] (the papers' per-task columns).
    - ``bwt`` = (1/(T-1)) sum_{i<T} (R[T, i] - R[i, i]), < 0 = forgetting (the sign of their
      tables); per task its term R[T, i] - R[i, i], None for the last task (nothing trained
      after it). ``bwt_trace`` divides the same sum by T, as MH-MoE's Eq. 21 is printed.

    The overall values are those of :func:`cl_scores` (``op``, ``bwt``, ``bwt_trace``); this
    adds the per-task terms, keyed by ``names`` (default "0", "1", ...) in R's column order.
    """
    r = _as_array(r_matrix, "r_matrix", 2)
    if r.shape[0] != r.shape[1] or r.shape[0] == 0:
        raise ValueError(f"r_matrix must be square T x T with T >= 1, got shape {r.shape}")
    t = r.shape[0]
    names = [str(i) for i in range(t)] if names is None else list(names)
    if len(names) != t:
        raise ValueError(f"{len(names)} names for {t} tasks")
    overall = cl_scores(r)
    tasks = {name: {"final": _value(r[-1, i]), "bwt": _value(r[-1, i] - r[i, i]) if i < t - 1 else None}
             for i, name in enumerate(names)}
    return {"op": overall["op"], "bwt": overall["bwt"], "bwt_trace": overall["bwt_trace"], "tasks": tasks}


def _check_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    if weights is None:
        return dict(DEFAULT_CL_SCORE_WEIGHTS)
    unknown = sorted(set(weights) - set(CL_SCORE_CRITERIA))
    if unknown:
        raise UserError(f"unknown CL_score criteria {unknown}", where="cl_score weights",
                        fix=f"use a subset of {', '.join(CL_SCORE_CRITERIA)}")
    values = {name: float(weights[name]) for name in weights}
    if any(not np.isfinite(v) or v < 0 for v in values.values()) or \
            abs(sum(values.values()) - 1.0) > 1e-9:
        raise UserError(f"weights {values} must be non-negative and sum to 1",
                        where="cl_score weights", fix="rescale them so that they sum to 1")
    return values
