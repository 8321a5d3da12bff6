"""Continual-learning scores as pure functions of the R matrix.

Convention (as everywhere in clbench): ``R[i, j]`` is the score on test experience j after
training experience i, both in run order, as fractions in [0, 1]; the matrix is the full T x T
one (future experiences included). In the formulas below indices are 1-based like the sources
(``R[T, j]`` is the last row); ``b_j`` = ``r_init[j]`` is the untrained model's score and
``a*_j`` = ``reference[j]`` the score of a reference model trained only on experience j.
``docs/metrics.md`` has each formula with its source and the places where libraries disagree.

Only NumPy is imported, so result and leaderboard code can score runs without torch.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from clbench.errors import UserError

# Díaz-Rodríguez et al. (2018) criteria that R alone determines. MS, SSS and CE need model and
# memory sizes and operation counts, which the R matrix does not carry.
CL_SCORE_CRITERIA = ("a", "rem", "bwt_plus", "fwt_dr")
DEFAULT_CL_SCORE_WEIGHTS: Mapping[str, float] = {name: 0.25 for name in CL_SCORE_CRITERIA}

SCORE_KEYS = ("acc", "aia", "bwt", "fwt", "forgetting", "im", "fwt_ref", "op", "bwt_trace",
              "a", "bwt_dr", "rem", "bwt_plus", "fwt_dr", "cl_score")


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
              weights: Mapping[str, float] | None = None) -> dict[str, float | None]:
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

    last, diag = r[-1], np.diagonal(r)
    lower_incl = np.tril_indices(t)
    lower = np.tril_indices(t, k=-1)
    upper = np.triu_indices(t, k=1)
    nan = float("nan")
    s: dict[str, float] = {}
    s["acc"] = s["op"] = last.mean()
    s["aia"] = np.mean([r[i, : i + 1].mean() for i in range(t)])
    if t >= 2:
        s["bwt"] = (last[:-1] - diag[:-1]).mean()
        s["bwt_trace"] = (last - diag).sum() / t
        best = [r[j:-1, j].max() for j in range(t - 1)]
        s["forgetting"] = (np.asarray(best) - last[:-1]).mean()
        before = r[np.arange(t - 1), np.arange(1, t)]          # R[j-1, j], j = 2..T
        s["fwt"] = (before - init[1:]).mean() if init is not None else nan
        s["fwt_ref"] = (before - ref[1:]).mean() if ref is not None else nan
        s["bwt_dr"] = (r[lower] - diag[lower[1]]).mean()
        s["fwt_dr"] = r[upper].mean()
    else:
        for key in ("bwt", "bwt_trace", "forgetting", "fwt", "fwt_ref", "bwt_dr", "fwt_dr"):
            s[key] = nan
    s["im"] = ref[-1] - r[-1, -1] if ref is not None else nan
    s["a"] = r[lower_incl].mean()
    s["rem"] = 1.0 - abs(min(s["bwt_dr"], 0.0)) if np.isfinite(s["bwt_dr"]) else nan
    s["bwt_plus"] = max(s["bwt_dr"], 0.0) if np.isfinite(s["bwt_dr"]) else nan
    s["cl_score"] = sum(weight * s[name] for name, weight in w.items() if weight != 0)
    return {key: _value(s[key]) for key in SCORE_KEYS}


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
