"""Which differences on a leaderboard are real: 95% intervals, rank groups and the critical difference.

**Intervals.** A score's mean over a row's runs (orders × seeds) carries a 95% interval from
Student's t with n − 1 degrees of freedom (``mean ± t_{0.975, n−1} · sd / √n``): with the 2 to 4
runs of these tables a normal interval would be far too narrow. A row of one run has no spread
to use, so its interval is the test set's alone, ``± 1.96 · se`` from the run's ``r_stderr``
(:mod:`clbench.metrics.stderr`), where the run recorded it; otherwise the mean stands alone.

**Rank groups.** Rows are compared on the ranked score (ACC) with Tukey's honestly significant
difference for a randomized complete block design: every method is run on the same blocks (one
block = one (order, seed) pair, the design's pairing), the block effect is removed by a two-way
additive model (method + block), and its residual mean square ``MSE`` (df = (k − 1)(n − 1)) is
the noise of a method's mean. Two methods differ when ``|Δ|`` exceeds the critical difference
``q_{α, k, df} · sqrt(MSE / n + (s_a² + s_b²) / 2)``, with q the studentized range (family-wise
α = 0.05 over all k(k − 1)/2 pairs, so no further correction) and ``s`` each method's test-set
standard error of ACC where the runs recorded it (0, and said so, where they did not). The
test set is shared by every method, so adding its noise as if independent is conservative.
Methods not significantly different share a letter (a compact letter display from the maximal
cliques of the "not different" graph: two methods share a letter exactly when their
difference is not significant), and the critical difference is the power of the design: a
gap below it cannot be told from noise. With one run per method there is no residual; the
groups then use the test-set errors alone (df = ∞), where known.

Why this design and not another: with n = 3 orders, Friedman's test with Nemenyi's post-hoc
(Demšar 2006) compares ranks within each block, whose critical difference for six methods is
4.4 of the 5 possible rank places: it can only separate the best from the worst. Pairwise
paired t-tests have 2 degrees of freedom each, and a Holm correction over 15 pairs leaves them
little more power. Pooling the residual over all methods gives (k − 1)(n − 1) = 10 degrees of
freedom for the same data, at the price of assuming the methods' residual spread is alike
(joint training's, nearly 0, lowers the pooled value). ``autorank`` refuses fewer than five
runs per method and picks its test from normality tests that mean nothing at n = 3;
``scikit-posthocs`` offers Tukey only for unpaired groups and the rank tests above, and both
pull pandas (and statsmodels, seaborn) in for what scipy's ``studentized_range`` and ``t`` and
a few lines of NumPy do here. ``docs/leaderboard.md`` shows the groups of the quickstart.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from itertools import combinations
from string import ascii_lowercase
from typing import Any

from clbench.metrics.score_registry import shown

ALPHA = 0.05
CONFIDENCE = 0.95
TEST = "Tukey HSD"
TEST_LONG = "Tukey's HSD (studentized range) on a method × run two-way model"
Z = 1.959963984540054  # the normal 97.5% quantile: one run's test-set interval


def t_half_width(values: list[float]) -> float | None:
    """Half-width of the 95% t interval of the mean of ``values`` (None for fewer than 2)."""
    from scipy.stats import t

    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return float(t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * sd / math.sqrt(n)


@functools.lru_cache(maxsize=256)
def _q_critical(k: int, df: float) -> float:
    from scipy.stats import studentized_range

    return float(studentized_range.ppf(1 - ALPHA, k, df))


def _q_pvalue(q: float, k: int, df: float) -> float:
    from scipy.stats import studentized_range

    return float(min(1.0, max(0.0, studentized_range.sf(q, k, df))))


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


@dataclass
class Groups:
    """Rank groups of one table's rows on ``score`` (see the module notes); ``method`` None: none formed (``note`` says why)."""

    score: str
    higher: bool
    method: str | None = None  # "blocks": runs and test sets; "test set": one run per method
    k: int = 0
    n: int = 0  # runs (blocks) per method
    df: float | None = None
    mse: float | None = None
    critical: tuple[float, float] | None = None  # smallest and largest pair's critical difference
    test_set_known: bool = False
    test_set_se: float | None = None  # a run's ACC, root mean square over the runs (None: unknown)
    letters: dict[str, str] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None

    @property
    def groups(self) -> list[list[str]]:
        """The labels of each letter, in letter order, best first within each."""
        marks = sorted({m for value in self.letters.values() for m in _marks(value)}, key=_mark_order)
        best = sorted(self.letters, key=lambda m: (-self.means[m] if self.higher else self.means[m], m))
        return [[label for label in best if mark in _marks(self.letters[label])] for mark in marks]

    def as_dict(self) -> dict[str, Any]:
        return {"score": self.score, "test": TEST_LONG if self.method else None, "alpha": ALPHA,
                "family": "all pairs" if self.method else None, "method": self.method, "methods": self.k,
                "runs_per_method": self.n, "df": None if self.df is None or math.isinf(self.df) else self.df,
                "residual_mean_square": self.mse, "critical_difference": None if self.critical is None else
                {"min": self.critical[0], "max": self.critical[1]}, "test_set_se": self.test_set_se,
                "test_set_included": self.test_set_known, "letters": self.letters, "groups": self.groups,
                "pairs": self.pairs, "note": self.note}


def _marks(value: str) -> list[str]:
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


def _mark_order(mark: str) -> int:
    return ascii_lowercase.index(mark) if len(mark) == 1 else int(mark[1:-1]) - 1


def rank_groups(runs: dict[str, dict[tuple, tuple[float, float | None]]], score: str, higher: bool) -> Groups:
    """Groups of methods from ``runs``: label -> {(order, seed): (score value, its test-set SE or None)}.

    Blocks are the (order, seed) pairs every method has; methods are ordered best first.
    """
    out = Groups(score=score, higher=higher)
    labels = [label for label, values in runs.items() if values]
    if len(labels) < 2:
        out.note = "needs at least 2 methods with runs"
        return out
    blocks = sorted(set.intersection(*(set(runs[label]) for label in labels)), key=repr)
    out.k = len(labels)
    out.n = len(blocks)
    if not blocks:
        out.note = "the methods share no (order, seed) run"
        return out
    values = {label: [runs[label][b][0] for b in blocks] for label in labels}
    errors = {label: [runs[label][b][1] for b in blocks] for label in labels}
    out.means = {label: sum(v) / len(v) for label, v in values.items()}
    labels.sort(key=lambda label: (-out.means[label] if higher else out.means[label], label))
    known = all(isinstance(se, (int, float)) and math.isfinite(se) for label in labels for se in errors[label])
    out.test_set_known = known
    s2 = {label: (sum(se * se for se in errors[label]) / len(blocks) if known else 0.0) for label in labels}
    if known:
        out.test_set_se = math.sqrt(sum(s2.values()) / len(s2))
    if len(blocks) >= 2:
        out.method, out.df = "blocks", float((out.k - 1) * (out.n - 1))
        grand = sum(out.means.values()) / out.k
        block_mean = [sum(values[label][b] for label in labels) / out.k for b in range(out.n)]
        residual = sum((values[label][b] - out.means[label] - block_mean[b] + grand) ** 2
                       for label in labels for b in range(out.n))
        out.mse = residual / out.df
        between = out.mse / out.n
    elif known:
        out.method, out.df, between = "test set", math.inf, 0.0
    else:
        out.note = ("one run per method and no test-set error recorded (r_stderr): nothing to tell noise from a "
                    "difference")
        return out
    q = _q_critical(out.k, out.df)
    different: set[frozenset[str]] = set()
    criticals = []
    for a, b in combinations(labels, 2):
        scale = math.sqrt(between + (s2[a] + s2[b]) / 2)
        diff = out.means[a] - out.means[b]
        critical = q * scale
        criticals.append(critical)
        if scale > 0:
            p = _q_pvalue(abs(diff) / scale, out.k, out.df)
            significant = abs(diff) > critical
        else:  # no noise at all: any difference is real, none is not
            p, significant = (0.0 if diff else 1.0), diff != 0
        if significant:
            different.add(frozenset((a, b)))
        out.pairs.append({"a": a, "b": b, "difference": diff, "critical_difference": critical, "p_value": p,
                          "significant": significant})
    out.critical = (min(criticals), max(criticals))
    out.letters = letters(labels, different)
    return out


def scale_and_unit(percent: bool):
    """How a score's values and differences are written (:func:`~clbench.metrics.score_registry.shown`)
    and their unit: ``" points"`` for a percentage, none for a score in a unit of its own (an error, N_eff)."""
    return functools.partial(shown, percent=percent), " points" if percent else ""


def critical_text(groups: Groups, scale=shown, unit: str = " points") -> str:
    """``6.3 points`` or ``6.3–6.8 points``."""
    low, high = groups.critical
    return f"{scale(low)}{unit}" if scale(low) == scale(high) else f"{scale(low)}–{scale(high)}{unit}"


def design_text(groups: Groups, title: str, scale=shown, unit: str = " points") -> str:
    """The header sentence of a table's groups: test, correction, α, design, critical difference, test-set noise."""
    if groups.method is None:
        return f"Rank groups on {title}: none ({groups.note})."
    if groups.method == "blocks":
        design = (f"{groups.k} methods × {groups.n} runs each, paired by (order, seed), residual df "
                  f"{groups.df:.0f}")
    else:
        design = f"{groups.k} methods, one run each: test-set errors only"
    noise = (f"test-set noise included (a run's {title} has a standard error of {scale(groups.test_set_se)}{unit}, "
             "from r_stderr)" if groups.test_set_known else
             "test-set noise not included: these entries did not record r_stderr")
    return (f"Rank groups on {title}: {TEST_LONG}, α = {ALPHA} family-wise over all {groups.k * (groups.k - 1) // 2} "
            f"pairs ({design}); methods sharing a letter are not significantly different. Critical difference "
            f"(the smallest gap this design can tell from noise): {critical_text(groups, scale, unit)}; {noise}.")


def groups_line(groups: Groups, scale=shown) -> str | None:
    """The groups as text, best first: ``a: joint 87.7 · b: replay 70.8 · c: lwf 40.8, naive 40.7``."""
    if groups.method is None:
        return None
    parts = [f"{mark}: " + ", ".join(f"{label} {scale(groups.means[label])}" for label in members)
             for mark, members in zip(sorted({m for v in groups.letters.values() for m in _marks(v)}, key=_mark_order),
                                      groups.groups)]
    return " · ".join(parts)


def groups_figure(groups: Groups, title: str, benchmark: str, percent: bool = True):
    """A critical-difference diagram (Demšar 2006's picture, on the score instead of mean ranks):
    each method hangs from its mean on the score axis (better to the right), a thick bar joins
    methods of one group, and the bar at the top is the critical difference. ``percent``: the
    score is a percentage (drawn x 100), else drawn in its own unit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = sorted(groups.means, key=lambda m: (-groups.means[m] if groups.higher else groups.means[m], m))
    factor = 100.0 if percent else 1.0
    x = {m: factor * groups.means[m] for m in order}
    k = len(order)
    members = [g for g in groups.groups if len(g) > 1]
    low, high = min(x.values()), max(x.values())
    cd = factor * groups.critical[1] if groups.critical else 0.0
    span = max(high - low, cd, 1.0 if percent else 0.01)
    left, right = low - 0.08 * span, high + 0.08 * span
    half = (k + 1) // 2
    bar_y = [-0.8 - 0.3 * i for i in range(len(members))]
    rows_top = (bar_y[-1] if bar_y else -0.2) - 0.45
    fig, ax = plt.subplots(figsize=(7.5, 1.3 + 0.32 * max(half, k - half) + 0.2 * len(members)), dpi=100)
    ax.axhline(0, color="black", lw=1)
    for i, m in enumerate(order):  # better half labelled on the better side
        row = i if i < half else k - 1 - i
        y = rows_top - 0.38 * row
        side = right if i < half else left
        if not groups.higher:
            side = left if i < half else right
        ax.plot([x[m], x[m], side], [0, y, y], color="0.35", lw=0.8)
        ax.plot([x[m]], [0], "o", color="black", ms=3)
        ax.text(side, y, f" {m} {shown(groups.means[m], percent)} ({groups.letters.get(m, '')}) ", va="center", fontsize=8,
                ha="left" if side == right else "right")
    for y, group in zip(bar_y, members):
        xs = [x[m] for m in group]
        ax.plot([min(xs) - 0.01 * span, max(xs) + 0.01 * span], [y, y], color="tab:red", lw=4,
                solid_capstyle="round")
    if groups.critical:
        start = low if groups.higher else high
        ax.plot([start, start + (cd if groups.higher else -cd)], [0.45, 0.45], color="black", lw=1.5)
        ax.text(start, 0.6, f"critical difference {cd:.{1 if percent else 2}f}", fontsize=8, va="bottom", ha="left")
    ax.set_xlim(left, right) if groups.higher else ax.set_xlim(right, left)
    ax.set_ylim(rows_top - 0.38 * max(half, k - half), 1.1)
    ax.set_yticks([])
    for spine in ("left", "right", "top"):
        ax.spines[spine].set_visible(False)
    ax.spines["bottom"].set_position(("data", 0))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(f"{benchmark}: rank groups on {title} ({TEST}, α = {ALPHA}; better →)", fontsize=9)
    fig.tight_layout()
    return fig
