"""Two methods of one table, paired by task order: the paired test, its power, and what more
orders would cost.

:func:`paired_test` pairs the runs of two rows by replication unit (orders, each the mean of its
seeds; or the seeds of a single order) and reports the paired t-test and the Wilcoxon
signed-rank test with the gap the table's test detects with 80% power
(:class:`clbench.leaderboard.stats.PairNoise`).

:func:`plan` answers the question a reviewer asks of a tie: how many orders would separate this
gap (the observed one, or one given, such as a paper's) with 80% power, at α = 0.05 for one
comparison planned in advance and at the table's Holm level, what they cost in machine time,
and the power the orders run reached for that gap. The cost of one more order is the mean, over
the orders run, of both methods' recorded wall time in that order (all its seeds), on the
machines that made the entries: CPU entries give the hours here, entries made on a GPU the
hours on one GPU. Where no entry was made on a GPU the plan says so rather than guess a
speed-up: a GPU's speed on these runs is measured by running the suite there.
"""

from __future__ import annotations

import math
from typing import Any

from clbench.errors import UserError, did_you_mean
from clbench.leaderboard.power import POWER, PairNoise
from clbench.leaderboard.stats import ALPHA, unit_means
from clbench.leaderboard.table import BenchmarkTable, Row
from clbench.metrics.stderr import entry_score_stderr
from clbench.leaderboard.schema import Entry

MIN_PAIRS = 3


def score_value(entry: Entry, metric: str) -> float | None:
    """An ok entry's finite score ``metric``, else None."""
    if not entry.ok:
        return None
    v = entry.scores.get(metric)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def paired_test(row_a: Row, row_b: Row, metric: str, higher: bool = True, *, unit: str = "order",
                pairs_in_table: int = 1) -> dict[str, Any]:
    """Paired t-test and Wilcoxon signed-rank test of ``a - b`` over the replication units
    (``unit``: orders, each the mean of its seeds; or the seeds of a single order), and the
    pair's power at the table's Holm level α/m (m = ``pairs_in_table``).

    ``a_better`` / ``b_better`` count the pairs where each is better in the score's direction.
    """
    from scipy.stats import ttest_rel, wilcoxon

    units, ua, ub = _paired_units(row_a, row_b, metric, unit)
    name = "orders" if unit == "order" else "seeds"
    out: dict[str, Any] = {"a": row_a.label, "b": row_b.label, "n_pairs": len(units), "unit": unit,
                           "pairs": [{unit: u if unit == "order" else u[1], "a": ua[u][0], "b": ub[u][0]}
                                     for u in units]}
    if len(units) < MIN_PAIRS:
        out["note"] = f"not enough paired {name}: {len(units)}, need {MIN_PAIRS} (add {name})"
        return out
    xa = [ua[u][0] for u in units]
    xb = [ub[u][0] for u in units]
    diffs = [p - q for p, q in zip(xa, xb)]
    sign = 1 if higher else -1
    out.update({"mean_difference": sum(diffs) / len(diffs), "a_better": sum(sign * d > 0 for d in diffs),
                "b_better": sum(sign * d < 0 for d in diffs), "ties": sum(d == 0 for d in diffs)})
    if max(diffs) == min(diffs):
        out["t_test"] = None
        out["note"] = "every pair differs by the same amount; the t statistic is undefined"
    else:
        t = ttest_rel(xa, xb)
        out["t_test"] = {"statistic": float(t.statistic), "p_value": float(t.pvalue)}
    if all(d == 0 for d in diffs):
        out["wilcoxon"] = None
    else:
        w = wilcoxon(xa, xb)
        out["wilcoxon"] = {"statistic": float(w.statistic), "p_value": float(w.pvalue),
                           "min_attainable_p": min(1.0, 2.0 / 2 ** len(units))}
    mean = out["mean_difference"]
    noise, test_set = _noise(units, ua, ub)
    level = ALPHA / max(pairs_in_table, 1)
    out["power"] = {"level": level, "power": POWER, "test_set_included": test_set,
                    "detectable": noise.detectable(level), "units_needed": noise.units_needed(mean, level)}
    return out


def _paired_units(row_a: Row, row_b: Row, metric: str, unit: str) -> tuple[list, dict, dict]:
    """The units both rows have, and each row's (mean score, its test-set error) per unit."""
    def by_unit(row: Row) -> dict[Any, tuple[float, float | None]]:
        runs = {(e.order_label, e.seed): (v, entry_score_stderr(e.document, wilson=True).get(metric))
                for e in row.entries if (v := score_value(e, metric)) is not None}
        return unit_means(runs, unit)

    ua, ub = by_unit(row_a), by_unit(row_b)
    return sorted(set(ua) & set(ub), key=repr), ua, ub


def _noise(units: list, ua: dict, ub: dict) -> tuple[PairNoise, bool]:
    """The pair's noise (spread of the per-unit differences, and the test sets' variance where
    every run recorded its error) and whether the test sets' part is included."""
    diffs = [ua[u][0] - ub[u][0] for u in units]
    ses = [ua[u][1] for u in units] + [ub[u][1] for u in units]
    included = all(se is not None for se in ses)
    v_test = sum(se * se for se in ses) / len(units) if included else 0.0
    return PairNoise.of(diffs, v_test), included


def find_row(table: BenchmarkTable, name: str, flag: str) -> Row:
    exact = [r for r in table.rows if r.label == name]
    if exact:
        return exact[0]
    by_strategy = [r for r in table.rows if r.strategy == name]
    if len(by_strategy) == 1:
        return by_strategy[0]
    choices = [r.label for r in table.rows]
    if len(by_strategy) > 1:
        raise UserError(f"'{name}' names {len(by_strategy)} rows in {table.label}", where=flag,
                        fix=f"give the full label, one of: {', '.join(choices)}")
    raise UserError(f"no strategy '{name}' in {table.label}", where=flag, fix=did_you_mean(name, choices))


def _machine(entry: Entry) -> tuple[str, bool]:
    """Where an entry ran, as the plan names it, and whether that was a GPU."""
    env = entry.env
    if env.cuda:
        return str(env.device or "a GPU"), True
    threads = env.torch_threads
    name = (env.cpu and env.cpu.model) or env.device or "a CPU"
    return (f"{name}, {threads} torch thread{'s' if threads != 1 else ''}" if threads else str(name)), False


def _order_cost(rows: list[Row], gpu: bool) -> tuple[float | None, list[str]]:
    """Mean over orders of both rows' summed wall seconds in that order (entries made on a GPU,
    or not), and the machines they ran on."""
    per_order: dict[str, float] = {}
    seen_orders: dict[str, set[int]] = {}
    machines: list[str] = []
    for index, row in enumerate(rows):
        for entry in row.ok:
            name, on_gpu = _machine(entry)
            seconds = entry.compute.wall_seconds
            if on_gpu != gpu or seconds is None:
                continue
            per_order[entry.order_label] = per_order.get(entry.order_label, 0.0) + float(seconds)
            seen_orders.setdefault(entry.order_label, set()).add(index)
            if name not in machines:
                machines.append(name)
    complete = [cost for order, cost in per_order.items() if seen_orders[order] == set(range(len(rows)))]
    return (sum(complete) / len(complete) if complete else None), machines


def plan(table: BenchmarkTable, metric: str, a: str, b: str, *, pairs_in_table: int = 1,
         gap: float | None = None) -> dict[str, Any]:
    """How many orders separate ``a`` from ``b`` on ``metric`` with 80% power, and their cost
    (see the module notes). ``gap``: the difference to plan for (default: the observed one)."""
    row_a, row_b = find_row(table, a, "--a"), find_row(table, b, "--b")
    units, ua, ub = _paired_units(row_a, row_b, metric, "order")
    tasks = {len(e.experiences) for e in row_a.ok + row_b.ok if getattr(e, "experiences", None)}
    out: dict[str, Any] = {"a": row_a.label, "b": row_b.label, "metric": metric, "unit": "order",
                           "orders_run": len(units),
                           # T tasks have T! orders: a plan past them cannot be met by orders alone
                           "orders_possible": math.factorial(tasks.pop()) if len(tasks) == 1 else None}
    if len(units) < 2:
        out["note"] = f"{len(units)} paired order(s): the spread across orders needs two at least"
        return out
    noise, _ = _noise(units, ua, ub)
    observed = sum(ua[u][0] - ub[u][0] for u in units) / len(units)
    planned = abs(observed) if gap is None else abs(gap)
    holm = ALPHA / max(pairs_in_table, 1)
    out.update({"gap": planned, "gap_observed": gap is None, "power": POWER,
                "sd_orders": math.sqrt(noise.v_units), "sd_test": math.sqrt(noise.v_test),
                "levels": {"planned": ALPHA, "holm": holm},
                "orders_needed": {"planned": noise.units_needed(planned, ALPHA),
                                  "holm": noise.units_needed(planned, holm)},
                "power_reached": {"planned": noise.power(planned, ALPHA), "holm": noise.power(planned, holm)}})
    for where, gpu in (("here", False), ("gpu", True)):
        seconds, machines = _order_cost([row_a, row_b], gpu)
        out[f"cost_{where}"] = None if seconds is None else {
            "hours_per_order": seconds / 3600, "machines": machines,
            "hours": {level: None if n is None else n * seconds / 3600
                      for level, n in out["orders_needed"].items()},
            "more_hours": {level: None if n is None else max(0, n - out["orders_run"]) * seconds / 3600
                           for level, n in out["orders_needed"].items()}}
    return out
