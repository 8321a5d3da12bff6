"""Which differences on a leaderboard are real: the replication unit, intervals, rank groups and power.

**The unit is the task order.** A claim of a CL leaderboard is meant to hold across task
orders, and runs of one order share its stream: the seeds of an order are not independent
replicates of the claim. So each method's runs are averaged within each order first, and every
interval, test and power figure below counts orders (n orders: n − 1 degrees of freedom). The
method × order interaction (a method that suits one order more than another) is then part of
each comparison's error, as it must be for a claim about orders. A table with a single task
order takes its seeds as the unit, and its claims hold for that order only; the header says so.
Averaging rather than a mixed model with seeds nested in orders: with 2 to 4 orders a mixed
model's variance components are barely estimable, and with equal seeds per order the test on
order means is the exact test of that model's method effect against method × order.

**Intervals.** A score's mean over the units carries a 95% Student t interval with n − 1
degrees of freedom, cut at the score's bounds (:attr:`Score.bounds
<clbench.metrics.score_registry.Score.bounds>`: a mean of R's cells is in [0, 100], a
difference of them in [−100, 100]). The true mean lies inside the bounds, so the cut removes
only impossible values and keeps the interval's coverage; a logit-scale interval would cover the
mean of logits rather than the mean and needs an arbitrary offset at 0 and 100, and a bootstrap
over 3 orders has 10 distinct resamples and covers far less than 95%. A row with a single unit
shows its test set's interval instead, ``± 1.96 se`` cut at the bounds, from the cells' errors.

**Test-set errors.** An R cell of accuracy or exact match is a proportion; its error enters as
the Wilson score error (:func:`clbench.metrics.stderr.wilson_stderr`), which is not 0 at 0/100
or 100/100. Text scores keep the standard error of a mean of per-sample scores.

**Rank groups.** Every pair of methods is compared by a paired t-test on its per-unit
differences, whose variance is the pair's own: no variance is pooled across methods. Where the
runs recorded test-set errors, their variance (``se_a² + se_b²``: the test set is shared across
units, so it does not shrink with n) is added, with Welch–Satterthwaite degrees of freedom.
Holm's step-down correction holds the family-wise error at α = 0.05 over all k(k − 1)/2 pairs,
and methods not significantly different share a letter (a compact letter display from the
maximal cliques of the "not different" graph). Why not Tukey's HSD on a pooled residual, as
before: it assumes every method's spread across orders is alike, and simulated leaderboards
with the spreads measured on Rotated Fashion-MNIST (0.6 to 4.8 points) make its family-wise
error 0.11 to 0.24 at 3 orders; a variance test cannot guard it, since at 3 orders a test of
the spreads almost never rejects (``tests/leaderboard/test_leaderboard_stats.py``). A
Games–Howell-style range test on the paired differences is liberal too (0.28 at 3 orders). The
paired tests are exact for any spread. Levene's test (on the residuals of the method + unit
model) is still reported beside each table as a description of the spreads. Games–Howell
would not pool either but ignores the pairing by order, which removes the large order effect of
class-IL streams. scipy gives the t and studentized-range distributions and Levene's test;
Holm's correction (which scipy lacks; statsmodels has it, for a dependency of its own) and the
letters are a few lines here.

**Critical difference and power.** A pair's critical difference is the gap its test separates
at Holm's strictest level α/m (m pairs): above it a pair is always separated, below it Holm
may still separate it. The smallest difference detected with 80% power at α/m is the gap the
paired test rejects with probability 0.80 under the noncentral t distribution
(:mod:`~clbench.leaderboard.power`; not the shortcut ``(t_{1−α/2m, df} + t_{0.80, df}) · se``,
which overstates the power at few orders), and for a pair that ties, the units needed to
separate its observed gap with 80% power are the fewest n whose detectable gap reaches it, with
the observed spread; where the test set's noise alone hides the gap, no number of orders will
(a larger test set would). ``docs/leaderboard.md`` shows the
groups of the Rotated Fashion-MNIST table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations
from string import ascii_lowercase
from typing import Any

from clbench.leaderboard.page_stats import levene_mean_centred
from clbench.metrics.stderr import Z
from clbench.leaderboard.power import PairNoise, t_quantile, t_sf

ALPHA = 0.05
CONFIDENCE = 0.95
TEST = "paired t, Holm"
TEST_LONG = "paired t-tests per pair on the per-unit means, Holm's correction"

Runs = dict[tuple, tuple[float, float | None]]  # (order, seed) -> (score value, its test-set SE or None)


def replication_unit(orders: set[str]) -> str:
    """``"order"`` where a table has 2 task orders or more, else ``"seed"`` (one order)."""
    return "order" if len(orders) >= 2 else "seed"


def unit_means(runs: Runs, unit: str) -> dict[Any, tuple[float, float | None]]:
    """unit -> (mean of its runs' values, the test-set SE of that mean or None). Seeds of one
    order share its test set, so the mean's SE is the mean of theirs (their errors taken as
    perfectly correlated: the conservative choice)."""
    by: dict[Any, list[tuple[float, float | None]]] = {}
    for (order, seed), value in runs.items():
        by.setdefault(order if unit == "order" else (order, seed), []).append(value)
    out = {}
    for key, values in by.items():
        ses = [se for _, se in values]
        known = all(_finite(se) for se in ses)
        out[key] = (sum(v for v, _ in values) / len(values), sum(ses) / len(ses) if known else None)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _clip(low: float, high: float, bounds: tuple[float, float] | None) -> tuple[float, float]:
    return (low, high) if bounds is None else (max(low, bounds[0]), min(high, bounds[1]))


@dataclass
class Interval:
    """A 95% interval of a mean over ``n`` units: ``half`` the unbounded half-width, ``low`` and
    ``high`` its ends cut at the score's bounds; ``test_set``: one unit, its test set's interval."""

    mean: float
    n: int
    sd: float | None
    half: float | None
    low: float | None
    high: float | None
    test_set: bool = False

    @property
    def cut(self) -> bool:
        """Whether a bound cut the interval (it is then written by its ends, not ± a half-width)."""
        return is_cut(self.mean, self.half, self.low, self.high)


def is_cut(mean: float, half: float | None, low: float | None, high: float | None) -> bool:
    """Whether the ends ``low``/``high`` are narrower than ``mean ± half``: a bound cut the interval."""
    return half is not None and (low > mean - half or high < mean + half)


def interval(values: list[float], se: float | None = None, bounds: tuple[float, float] | None = None) -> Interval:
    """The interval of the mean of ``values`` (one per unit; see the module notes); ``se`` is the
    test-set error of a single unit's value, used only where there is one unit."""
    n = len(values)
    mean = sum(values) / n
    if n >= 2:
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
        return Interval(mean, n, sd, half, *_clip(mean - half, mean + half, bounds))
    if _finite(se):
        half = Z * se
        return Interval(mean, 1, None, half, *_clip(mean - half, mean + half, bounds), test_set=True)
    return Interval(mean, 1, None, None, None, None)


def letters(labels: list[str], different: set[frozenset[str]]) -> dict[str, str]:
    """Compact letter display: ``labels`` best first; two share a letter iff their pair is not in ``different``."""
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(labels)
    graph.add_edges_from((a, b) for a, b in combinations(labels, 2) if frozenset((a, b)) not in different)
    position = {label: i for i, label in enumerate(labels)}
    cliques = sorted((sorted(c, key=position.get) for c in nx.find_cliques(graph)),
                     key=lambda c: (position[c[0]], -len(c), [position[x] for x in c]))
    out = dict.fromkeys(labels, "")
    for i, clique in enumerate(cliques):
        mark = ascii_lowercase[i] if i < 26 else f"({i + 1})"
        for label in clique:
            out[label] += mark
    return out


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the input's order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for step, i in enumerate(order):
        running = max(running, min(1.0, (m - step) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass
class Groups:
    """Rank groups of one table's rows on ``score`` (see the module notes); ``method`` None: none
    formed (``note`` says why)."""

    score: str
    higher: bool
    method: str | None = None  # "paired": over units; "test set": one unit per method, test-set errors only
    unit: str | None = None  # "order" or "seed"
    k: int = 0
    n: int = 0  # units shared by every method
    critical: tuple[float, float] | None = None  # smallest and largest pair's critical difference (level α/m)
    detectable: tuple[float, float] | None = None  # smallest and largest gap detected with 80% power
    test_set_known: bool = False
    test_set_se: float | None = None  # a unit's score, root mean square over methods and units (None: unknown)
    spread: dict[str, Any] | None = None  # Levene's test of the methods' spreads across units
    letters: dict[str, str] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    ties: list[dict[str, Any]] = field(default_factory=list)  # adjacent pairs that tie: units to separate them
    note: str | None = None

    @property
    def m(self) -> int:
        return self.k * (self.k - 1) // 2

    @property
    def groups(self) -> list[list[str]]:
        """The labels of each letter, in letter order, best first within each."""
        marks = sorted({m for value in self.letters.values() for m in letter_marks(value)}, key=mark_order)
        best = sorted(self.letters, key=lambda m: (-self.means[m] if self.higher else self.means[m], m))
        return [[label for label in best if mark in letter_marks(self.letters[label])] for mark in marks]

    def as_dict(self) -> dict[str, Any]:
        def span(pair):
            return None if pair is None else {"min": pair[0], "max": pair[1]}

        return {"score": self.score, "test": TEST_LONG if self.method else None, "alpha": ALPHA,
                "family": "all pairs" if self.method else None, "correction": "holm" if self.method else None,
                "method": self.method, "unit": self.unit, "methods": self.k, "units_per_method": self.n,
                "critical_difference": span(self.critical), "detectable_at_80_power": span(self.detectable),
                "test_set_se": self.test_set_se, "test_set_included": self.test_set_known, "spread": self.spread,
                "letters": self.letters, "groups": self.groups, "pairs": self.pairs, "ties": self.ties,
                "note": self.note}


def letter_marks(value: str) -> list[str]:
    out, i = [], 0
    while i < len(value):
        if value[i] == "(":
            j = value.index(")", i)
            out.append(value[i:j + 1])
            i = j + 1
        else:
            out.append(value[i])
            i += 1
    return out


def mark_order(mark: str) -> int:
    return ascii_lowercase.index(mark) if len(mark) == 1 else int(mark[1:-1]) - 1


def _levene(values: dict[str, list[float]]) -> dict[str, Any] | None:
    """Levene's test (mean-centred) on each method's residuals of the additive method + unit model."""
    labels = list(values)
    n = len(values[labels[0]])
    if n < 3 or len(labels) < 2:
        return None
    grand = sum(sum(v) for v in values.values()) / (n * len(labels))
    unit_mean = [sum(values[label][u] for label in labels) / len(labels) for u in range(n)]
    residuals = [[values[label][u] - sum(values[label]) / n - unit_mean[u] + grand for u in range(n)]
                 for label in labels]
    statistic, p_value = levene_mean_centred(residuals)
    if not math.isfinite(p_value):
        return None
    sds = {label: math.sqrt(sum(r * r for r in res) / (n - 1)) for label, res in zip(labels, residuals)}
    return {"test": "Levene (mean-centred) on the method + unit residuals", "statistic": statistic,
            "p_value": p_value, "residual_sd": sds}


def rank_groups(runs: dict[str, Runs], score: str, higher: bool, *, describe: bool = True) -> Groups:
    """Groups of methods from ``runs``: label -> {(order, seed): (score value, its test-set SE or None)}.

    Units (:func:`replication_unit`) are the orders, or the (order, seed) runs of a single order;
    only units every method has are compared. Methods are ordered best first. ``describe``: also
    the detectable differences, the units each tying adjacent pair needs and Levene's test
    (what a reader is told; simulations of the groups skip them).
    """
    out = Groups(score=score, higher=higher)
    labels = [label for label, values in runs.items() if values]
    if len(labels) < 2:
        out.note = "needs at least 2 methods with runs"
        return out
    out.unit = replication_unit({order for label in labels for order, _ in runs[label]})
    means = {label: unit_means(runs[label], out.unit) for label in labels}
    units = sorted(set.intersection(*(set(means[label]) for label in labels)), key=repr)
    out.k, out.n = len(labels), len(units)
    if not units:
        out.note = f"the methods share no {out.unit}"
        return out
    values = {label: [means[label][u][0] for u in units] for label in labels}
    errors = {label: [means[label][u][1] for u in units] for label in labels}
    out.means = {label: sum(v) / len(v) for label, v in values.items()}
    labels.sort(key=lambda label: (-out.means[label] if higher else out.means[label], label))
    known = all(_finite(se) for label in labels for se in errors[label])
    out.test_set_known = known
    s2 = {label: (sum(se * se for se in errors[label]) / out.n if known else 0.0) for label in labels}
    if known:
        out.test_set_se = math.sqrt(sum(s2.values()) / len(s2))
    if out.n >= 2:
        out.method = "paired"
        out.spread = _levene(values) if describe else None
    elif known:
        out.method = "test set"
    else:
        out.note = ("one run per method and no test-set error recorded (r_stderr): nothing to tell noise from a "
                    "difference")
        return out
    level = ALPHA / out.m
    noises, p_values = {}, []
    for a, b in combinations(labels, 2):
        diffs = [x - y for x, y in zip(values[a], values[b])]
        d = sum(diffs) / out.n
        noise = noises[a, b] = PairNoise.of(diffs, s2[a] + s2[b])
        se, df = noise.se(), noise.df()
        if se > 0:
            stat = abs(d) / se
            p_values.append(2 * t_sf(stat, df))
        else:  # no noise at all: any difference is real, none is not
            p_values.append(0.0 if d else 1.0)
        out.pairs.append({"a": a, "b": b, "difference": out.means[a] - out.means[b], "se": se,
                          "df": None if math.isinf(df) else df, "critical_difference": t_quantile(1 - level / 2, df) * se})
    different: set[frozenset[str]] = set()
    for pair, p, adjusted in zip(out.pairs, p_values, holm(p_values)):
        pair.update(p_value=p, p_holm=adjusted, significant=adjusted <= ALPHA)
        if pair["significant"]:
            different.add(frozenset((pair["a"], pair["b"])))
    criticals = [pair["critical_difference"] for pair in out.pairs]
    out.critical = (min(criticals), max(criticals))
    out.letters = letters(labels, different)
    if describe:
        detectable = [noises[pair["a"], pair["b"]].detectable(level) for pair in out.pairs]
        for pair, gap in zip(out.pairs, detectable):
            pair["detectable_at_80_power"] = gap
        out.detectable = (min(detectable), max(detectable))
        for a, b in zip(labels, labels[1:]):
            if frozenset((a, b)) not in different:
                gap = out.means[a] - out.means[b]
                out.ties.append({"a": a, "b": b, "difference": gap,
                                 "units_needed": noises[a, b].units_needed(gap, level)})
    return out
