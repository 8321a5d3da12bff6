"""The noise of one score: each R cell's standard error from its test set, and what it makes of ACC, AIA, BWT, FWT.

An R cell is a mean over the samples of one test set, so even a perfectly reproducible run
carries the sampling noise of that test set. :func:`sampling_error` reads it from the cell's
metric after an evaluation:

* accuracy (``MulticlassAccuracy``, micro): the binomial standard error ``sqrt(p (1 - p) / n)``;
* a text score (:class:`~clbench.metrics.text_scores.MeanTextScore`: exact match, ROUGE-L, SARI,
  edit similarity, ...): the standard error of a mean of per-sample scores,
  ``sqrt(mean((s - mean s)^2) / n)``, from the metric's running sum of squares. This is the exact
  value a bootstrap over the test samples estimates (the bootstrap standard error of a mean
  converges to it as resamples grow), so it is computed in closed form, with no resampling
  noise and no seed;
* any other metric (a regression error, G-mean, MAUC): None (unknown), never a guess.

:func:`score_stderr` propagates the cells' errors to the scores that are linear in R (ACC/OP,
AIA, BWT, FWT) assuming the cells are independent: ``se(score) = sqrt(sum_c w_c^2 se_c^2)``
with ``w_c`` the score's weight on cell c, read off the scoring function itself
(:func:`clbench.metrics.derive.derive_scores`) by moving one cell at a time, so the weights can
never disagree with the formulas. Cells of one row share a model and columns often share
classes, so the independence is an approximation; Forgetting (a max over stages) is not
propagated. Tests and intervals on a leaderboard replace a proportion's binomial error, which is
0 at 0/n and n/n, by Wilson's (:func:`wilson_stderr`, ``entry_score_stderr(wilson=True)``);
``scores_stderr`` records the binomial one. Only the torch import of :func:`sampling_error`
needs torch.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

# The scores that are linear in R and r_init, whose standard error is propagated.
LINEAR_SCORES = ("acc", "aia", "bwt", "fwt")


def sampling_error(metric: Any) -> tuple[float | None, int | None]:
    """``(standard error, number of test samples)`` of one evaluated metric; ``(None, None)``
    where the metric does not say (see the module notes)."""
    from torchmetrics.classification import MulticlassAccuracy

    from clbench.metrics.text_scores import SCALE, MeanTextScore

    if isinstance(metric, MulticlassAccuracy) and metric.average == "micro" \
            and getattr(metric, "multidim_average", "global") == "global":
        with metric.sync_context(should_unsync=True):
            correct, n = int(metric.tp.sum()), int((metric.tp + metric.fn).sum())
        if n == 0:
            return None, 0
        p = correct / n
        return math.sqrt(p * (1 - p) / n), n
    if isinstance(metric, MeanTextScore):
        with metric.sync_context(should_unsync=True):
            n, total, total_sq = int(metric.count), int(metric.total), int(metric.total_sq)
        if n == 0:
            return None, 0
        mean = total / SCALE / n
        variance = max(total_sq / SCALE / n - mean * mean, 0.0)
        return math.sqrt(variance / n), n
    return None, None


def _known(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def score_stderr(r: Sequence[Sequence[Any]], r_stderr: Sequence[Sequence[Any]] | None, r_init: Sequence[Any] | None,
                 r_init_stderr: Sequence[Any] | None, *, single_stage: bool,
                 higher_is_better: bool = True) -> dict[str, float | None]:
    """Standard error of each of :data:`LINEAR_SCORES` a run defines, from its cells' errors
    (independent cells); None where the score is undefined or a cell it reads has no error."""
    rows = [[math.nan if v is None else float(v) for v in row] for row in r]
    init = None if r_init is None else [math.nan if v is None else float(v) for v in r_init]
    weights = _weights_for(rows, init, single_stage, higher_is_better)
    keys = [k for k in LINEAR_SCORES if k in weights.base]
    out: dict[str, float | None] = {k: None for k in keys}
    defined = [k for k in keys if weights.base[k] is not None]
    if not defined:
        return out
    variance = dict.fromkeys(defined, 0.0)
    unknown: set[str] = set()

    def error(table: Sequence[Any] | None, k: int) -> Any:
        return table[k] if isinstance(table, (list, tuple)) and k < len(table) else None

    cells = [(i, j, error(error(r_stderr, i), j)) for i in range(len(rows)) for j in range(len(rows[i]))]
    cells += [(None, j, error(r_init_stderr, j)) for j in range(len(init or []))]
    known = [cell for cell in cells if _known(cell[2])]
    # A cell without an error only tells which scores become unknown, so those cells come after the
    # known ones and the loop stops once every score is unknown. They go outward from the first
    # cells of r_init and of the last row, which every linear score reads one of, so a run that
    # records no error (a regression metric) costs a few weights of a 100-task R instead of 10,100.
    def distance_from_the_corner(cell):
        i, j, _ = cell
        return j + (0 if i is None else len(rows) - i)

    without = sorted((cell for cell in cells if not _known(cell[2])), key=distance_from_the_corner)
    for i, j, se in known + without:
        if unknown.issuperset(defined):
            break
        on_cell = weights.on(i, j)
        for key in defined:
            weight = on_cell[key]
            if abs(weight) < 1e-12:
                continue  # the score does not read this cell
            if not (_known(se) and math.isfinite(weight)):
                unknown.add(key)
            else:
                variance[key] += weight * weight * float(se) ** 2
    for key in defined:
        out[key] = None if key in unknown else math.sqrt(variance[key])
    return out


class _LinearWeights:
    """Each linear score's weight on each cell of R and r_init, read off the scoring function
    (:func:`clbench.metrics.derive.derive_scores`) by moving one cell at a time by 1.

    A linear score's weights depend only on what it is computed from, not on the values: R's
    shape, which cells are missing (NaN), ``single_stage`` and the direction. So the moves start
    from zeros (the missing cells kept missing), are made once per such pattern and cell, when
    first asked for, and are shared by every run of that pattern: a leaderboard of one stream
    scores its R matrices' pattern once instead of once per cell and entry."""

    def __init__(self, missing_rows: tuple, missing_init: tuple | None, single_stage: bool, higher_is_better: bool):
        self._rows = [[math.nan if gap else 0.0 for gap in row] for row in missing_rows]
        self._init = None if missing_init is None else [math.nan if gap else 0.0 for gap in missing_init]
        self._single_stage, self._higher = single_stage, higher_is_better
        self.base = self._scores(self._rows, self._init)
        self._on: dict[tuple, dict[str, float]] = {}

    def _scores(self, rows, init) -> dict[str, float | None]:
        from clbench.metrics.derive import derive_scores

        return derive_scores(rows, init, single_stage=self._single_stage, higher_is_better=self._higher)

    def on(self, i: int | None, j: int) -> dict[str, float]:
        """The weights on cell ``(i, j)`` (``i`` None: r_init's cell j); NaN where moving the
        cell leaves a score undefined."""
        if (i, j) not in self._on:
            rows, init = [list(row) for row in self._rows], None if self._init is None else list(self._init)
            if i is None:
                init[j] += 1.0
            else:
                rows[i][j] += 1.0
            moved = self._scores(rows, init)
            self._on[i, j] = {key: math.nan if moved.get(key) is None or self.base[key] is None
                              else moved[key] - self.base[key] for key in LINEAR_SCORES if key in self.base}
        return self._on[i, j]


_WEIGHTS: dict[tuple, _LinearWeights] = {}
_WEIGHTS_SIZE = 256


def _weights_for(rows: list[list[float]], init: list[float] | None, single_stage: bool,
                 higher_is_better: bool) -> _LinearWeights:
    pattern = (tuple(tuple(math.isnan(v) for v in row) for row in rows),
               None if init is None else tuple(math.isnan(v) for v in init), single_stage, higher_is_better)
    if pattern not in _WEIGHTS:
        if len(_WEIGHTS) >= _WEIGHTS_SIZE:
            _WEIGHTS.pop(next(iter(_WEIGHTS)))
        _WEIGHTS[pattern] = _LinearWeights(*pattern)
    return _WEIGHTS[pattern]


Z = 1.959963984540054  # the normal 97.5% quantile


def wilson_stderr(p: float, n: int) -> float:
    """The standard error that makes ``p ± 1.96 se`` as wide as the 95% Wilson score interval
    of a proportion ``p`` of ``n`` samples: ``sqrt(p (1 - p) / n + z² / 4n²) / (1 + z² / n)``.
    Unlike the binomial (Wald) error it is not 0 at 0/n and n/n (0/100: 0.94 points, an
    interval reaching 3.7%), so a score at a bound keeps its test set's noise in every test."""
    z2 = Z * Z
    return math.sqrt(max(p * (1 - p), 0.0) / n + z2 / (4 * n * n)) / (1 + z2 / n)


def _proportion_stderr(value: Any, se: Any, n: Any) -> Any:
    """A cell's error as tests use it: :func:`wilson_stderr` where the recorded one is the
    binomial error of the cell (its samples scored 0 or 1: accuracy, exact match; a mean of
    scores in [0, 1] reaches the binomial variance only then), else the recorded one (a text
    score keeps the standard error of a mean of per-sample scores)."""
    if not (_known(value) and _known(se) and isinstance(n, int) and n > 0 and 0.0 <= value <= 1.0):
        return se
    binomial = math.sqrt(value * (1 - value) / n)
    return wilson_stderr(float(value), n) if abs(se - binomial) <= 1e-9 + 1e-6 * binomial else se


def proportion_stderrs(entry: dict) -> tuple[list, list]:
    """``(r_stderr, r_init_stderr)`` of an entry with each proportion's cell error replaced by
    its Wilson one (:func:`_proportion_stderr`); column j's test set has ``r_n[j]`` samples."""
    sizes = entry.get("r_n") or []

    def size(j: int) -> Any:
        return sizes[j] if j < len(sizes) else None

    rows = [[_proportion_stderr(v, se, size(j)) for j, (v, se) in enumerate(zip(r, e))]
            for r, e in zip(entry["r_matrix"], entry["r_stderr"])]
    init = [_proportion_stderr(v, se, size(j))
            for j, (v, se) in enumerate(zip(entry.get("r_init") or [], entry.get("r_init_stderr") or []))]
    return rows, init


_ENTRY_KEYS = ("r_matrix", "r_stderr", "r_init", "r_init_stderr", "r_n", "r_metric", "single_stage", "scores")
_CACHED: dict[str, dict] = {}  # what entry_score_stderr read -> its answer (a render asks up to 3 times an entry)
_CACHE_SIZE = 4096


def entry_score_stderr(entry: dict, *, wilson: bool = False) -> dict[str, float | None]:
    """:func:`score_stderr` of a result or leaderboard entry; every score None (unknown) for one
    written before ``r_stderr`` was recorded (result schema 1). ``wilson``: from the cells' Wilson
    errors (:func:`proportion_stderrs`), as intervals and tests use them; without it, from the
    recorded errors, as ``scores_stderr`` records them.

    Remembered by everything it reads of the entry (not by its hash, which a tampered entry may
    forge), so the rescore check, the tables and the groups of one render compute it once."""
    import json

    key = json.dumps([wilson, *(entry.get(k) for k in _ENTRY_KEYS)], sort_keys=True, default=str)
    if key not in _CACHED:
        if len(_CACHED) >= _CACHE_SIZE:
            _CACHED.pop(next(iter(_CACHED)))
        _CACHED[key] = _entry_score_stderr(entry, wilson)
    return dict(_CACHED[key])


def _entry_score_stderr(entry: dict, wilson: bool) -> dict[str, float | None]:
    from clbench.results.record import single_stage

    higher = bool((entry.get("r_metric") or {}).get("higher_is_better", True))
    if not entry.get("r_stderr"):
        return dict.fromkeys(LINEAR_SCORES)
    r_stderr, r_init_stderr = proportion_stderrs(entry) if wilson else (entry["r_stderr"], entry.get("r_init_stderr"))
    return score_stderr(entry["r_matrix"], r_stderr, entry.get("r_init"), r_init_stderr,
                        single_stage=single_stage(entry), higher_is_better=higher)
