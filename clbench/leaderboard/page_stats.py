"""The few classical statistics a leaderboard page needs, computed from their definitions.

Competition ranks, Kendall's tau-b and Levene's test are scipy.stats functions, and each is tested
against scipy's; they are written out here because importing scipy.stats (about a second) would
be most of what a page's render costs beyond drawing. scipy.special, which they use for the F
distribution, imports in a fraction of that.
"""

from __future__ import annotations

import bisect
import math
from itertools import combinations


def competition_ranks(keys: list[float]) -> list[int]:
    """Competition ranks ("1224") of ``keys``, smallest first: one plus the number of keys
    strictly smaller (``scipy.stats.rankdata(keys, method="min")``)."""
    ordered = sorted(keys)
    return [1 + bisect.bisect_left(ordered, key) for key in keys]


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two rankings (``scipy.stats.kendalltau(x, y).statistic``): concordant
    minus discordant pairs over the geometric mean of the pairs untied in x and untied in y; NaN
    where every pair is tied in one of them. From the definition, over all n (n - 1) / 2 pairs
    (a table ranks a few dozen methods)."""
    n, concordant, discordant, tied_x, tied_y = len(x), 0, 0, 0, 0
    for (x1, y1), (x2, y2) in combinations(zip(x, y), 2):
        dx, dy = x1 - x2, y1 - y2
        tied_x += dx == 0
        tied_y += dy == 0
        if dx * dy > 0:
            concordant += 1
        elif dx * dy < 0:
            discordant += 1
    pairs = n * (n - 1) // 2
    untied = (pairs - tied_x) * (pairs - tied_y)
    return (concordant - discordant) / math.sqrt(untied) if untied > 0 else math.nan


def levene_mean_centred(groups: list[list[float]]) -> tuple[float, float]:
    """Levene's statistic W and its p-value, ``scipy.stats.levene(*groups, center="mean")``
    computed from its definition (a one-way ANOVA of the absolute deviations from each group's
    mean, W ~ F(k - 1, N - k)) with scipy.special's F distribution. NaN where W is undefined (no spread within groups)."""
    from scipy.special import fdtrc

    deviations = [[abs(v - sum(group) / len(group)) for v in group] for group in groups]
    k, total = len(groups), sum(len(group) for group in groups)
    means = [sum(d) / len(d) for d in deviations]
    grand = sum(sum(d) for d in deviations) / total
    between = sum(len(d) * (m - grand) ** 2 for d, m in zip(deviations, means))
    within = sum((v - m) ** 2 for d, m in zip(deviations, means) for v in d)
    if within == 0:
        return math.nan, math.nan
    statistic = (total - k) / (k - 1) * between / within
    return statistic, float(fdtrc(k - 1, total - k, statistic))
