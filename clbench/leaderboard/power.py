"""The noise of one paired comparison and its power: what a paired test over replication units
(task orders) can detect, how many units a gap needs, and the power a number of units reached.

:class:`PairNoise` holds the spread of the per-unit differences and the test sets' variance
(both methods'); its test is the paired t on Welch–Satterthwaite degrees of freedom, the test
sets' part having infinitely many. The power is the noncentral t's; the gap detected with 80%
power solves it (the shortcut ``(t_{1−α/2} + t_{0.80}) · se`` starts the search: it overstates
the power at few units). :mod:`~clbench.leaderboard.stats` uses it for every pair of a table's
rank groups, :mod:`~clbench.leaderboard.pairs` for ``compare``'s paired test and its plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

POWER = 0.80
MAX_UNITS = 10_000  # beyond this many units a gap is reported as "more than"
#: Degrees of freedom past which the t distributions are taken as the normal (their 99.75% points
#: differ by 0.03%, and scipy's noncentral t slows a thousandfold there).
NORMAL_DF = 10_000


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (the normal's for infinite ``df``), from scipy's special functions:
    ``scipy.stats.t.ppf`` costs a millisecond a call, which simulations and pages repeat."""
    from scipy.special import ndtri, stdtrit

    return float(ndtri(p) if math.isinf(df) else stdtrit(df, p))


def t_sf(x: float, df: float) -> float:
    """Student's t upper tail ``P(T > x)`` (the normal's for infinite ``df``)."""
    from scipy.special import ndtr, stdtr

    return float(ndtr(-x) if math.isinf(df) else stdtr(df, -x))


@dataclass(frozen=True)
class PairNoise:
    """What a pair's test knows of its noise: the per-unit differences' variance ``v_units`` over
    ``n`` units and the test sets' ``v_test`` (both methods'; 0 where unknown)."""

    v_units: float
    v_test: float
    n: int

    @classmethod
    def of(cls, diffs: list[float], v_test: float) -> PairNoise:
        """The noise of a pair from its per-unit differences and the test sets' variance."""
        n = len(diffs)
        mean = sum(diffs) / n
        return cls(sum((d - mean) ** 2 for d in diffs) / (n - 1) if n >= 2 else 0.0, v_test, n)

    def se(self, n: int | None = None) -> float:
        return math.sqrt(self.v_units / (n or self.n) + self.v_test)

    def df(self, n: int | None = None) -> float:
        """Welch–Satterthwaite: the units' part has n − 1 degrees of freedom, the test set's infinitely many."""
        n = n or self.n
        part = self.v_units / n
        return math.inf if part == 0 or n < 2 else (part + self.v_test) ** 2 / (part * part / (n - 1))

    def detectable(self, level: float, n: int | None = None) -> float:
        """The gap detected with :data:`POWER` at two-sided ``level``: the gap whose :meth:`power` is
        :data:`POWER`. The usual shortcut ``(t_{1−level/2} + t_{power}) · se`` is optimistic at few
        units (its gap has 75% power, not 80%, at 7 units and α = 0.05, and 67% at 4 units and
        α = 0.001, a Holm level), so it only starts the search; with the test sets' noise alone
        (past :data:`NORMAL_DF` degrees of freedom) it is exact but for the wrong side's negligible share."""
        from scipy.optimize import brentq

        df, se = self.df(n), self.se(n)
        shortcut = self._shortcut(level, n)
        if se == 0 or df > NORMAL_DF:
            return shortcut
        low, high = shortcut, shortcut
        while self.power(low, level, n) > POWER:
            low /= 2
        while self.power(high, level, n) < POWER:
            high *= 2
        return float(brentq(lambda gap: self.power(gap, level, n) - POWER, low, high, xtol=1e-9 * se))

    def _shortcut(self, level: float, n: int | None = None) -> float:
        df = self.df(n)
        return (t_quantile(1 - level / 2, df) + t_quantile(POWER, df)) * self.se(n)

    def power(self, gap: float, level: float, n: int | None = None) -> float:
        """The power to detect ``gap`` at two-sided ``level`` with ``n`` units: the chance that the
        paired t statistic, noncentral by ``gap / se`` on the Welch–Satterthwaite degrees of
        freedom, falls beyond the critical value on either side."""
        from scipy.special import nctdtr, ndtr

        df, se = self.df(n), self.se(n)
        if se == 0:
            return 1.0 if gap else level
        nc, crit = abs(gap) / se, t_quantile(1 - level / 2, df)
        if df > NORMAL_DF:
            return float(ndtr(nc - crit) + ndtr(-nc - crit))
        wrong_side = float(nctdtr(df, nc, -crit))  # far in the tail scipy's series gives nan: it is ~0 there
        return float(1 - nctdtr(df, nc, crit)) + (wrong_side if math.isfinite(wrong_side) else 0.0)

    def units_needed(self, gap: float, level: float) -> int | None:
        """The fewest units whose test separates ``gap`` with :data:`POWER`; None where no number
        does (the test set's noise alone hides it), ``MAX_UNITS + 1`` for more than :data:`MAX_UNITS`."""
        gap = abs(gap)
        if gap == 0 or (self.v_test > 0 and (t_quantile(1 - level / 2, math.inf) + t_quantile(POWER, math.inf))
                        * math.sqrt(self.v_test) >= gap):
            return None
        if self.detectable(level, MAX_UNITS) > gap:
            return MAX_UNITS + 1
        # the shortcut's gap falls with n and is optimistic: the smallest n where it reaches the gap
        # is a lower bound, from which the exact answer is a few steps up
        low, high = 2, MAX_UNITS
        while low < high:
            mid = (low + high) // 2
            low, high = (mid + 1, high) if self._shortcut(level, mid) > gap else (low, mid)
        while low < MAX_UNITS and self.detectable(level, low) > gap:
            low += 1
        return low
