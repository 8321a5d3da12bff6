"""Does a ranking survive a change of task order? Per-order scores, rank stability, a paired test.

For one score (``acc`` by default) and each benchmark table (:mod:`~clbench.leaderboard.table`):

* **per order**: each method's score under each task order, averaged over seeds;
* **across orders**: mean ± sample std of those per-order values, the worst order (lowest
  score; highest for lower-is-better scores such as forgetting, or any level of an R of errors:
  the direction comes from the entries, see :func:`~clbench.leaderboard.table.score_direction`),
  and the range (best − worst);
* **rank stability**: the methods are ranked within each order, and Kendall's tau-b
  (:func:`~clbench.leaderboard.page_stats.kendall_tau_b`) is computed between every pair of orders over the methods
  present in both, then averaged. 1 means every order ranks the methods identically, 0 means
  the rankings are unrelated. Joint training counts as a method like any other; a row its suite
  marks ``unranked`` (:mod:`clbench.leaderboard.suite`) is in no ranking, and in no default pair;
* **intervals and rank groups**, the same as the leaderboard's tables
  (:mod:`clbench.leaderboard.stats`): each method's mean over the task orders (the replication
  unit) with a 95% t interval cut at the score's bounds, its group letters, the test, α and
  critical difference, and every pair's difference, critical difference, paired-t and Holm
  p-values; :func:`comparison_markdown` writes them as Markdown tables to paste into a paper;
* **paired test** between two methods (``a`` and ``b``; by default the two best ranked by mean):
  runs are averaged within each order and paired on orders (on seeds where there is one
  order), and with at least :data:`MIN_PAIRS` pairs the paired t-test
  (``scipy.stats.ttest_rel``) and the Wilcoxon signed-rank test (``scipy.stats.wilcoxon``,
  exact for small n) are reported, both two-sided. With n pairs the Wilcoxon p-value cannot
  fall below 2 / 2**n (0.25 for n = 3), which the output states. Its **power**: the gap the
  table's test detects with 80% power for this pair, and how many orders would separate the
  observed gap (:class:`clbench.leaderboard.stats.PairNoise`).
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Any

from clbench.errors import UserError, did_you_mean
from clbench.leaderboard.notes import (design_text, groups_line, orders_legend, plan_text, power_text,
                                      scale_and_unit, spelled_orders)
from clbench.leaderboard.markdown import md_text
from clbench.leaderboard.pairs import MIN_PAIRS, find_row, paired_test, plan, score_value
from clbench.leaderboard.page_stats import competition_ranks, kendall_tau_b
from clbench.leaderboard.stats import ALPHA, replication_unit
from clbench.leaderboard.table import RANK_BY, BenchmarkTable, Row, arrow, build_tables, table_groups
from clbench.metrics.score_registry import TABLE_SCORES, shown
from clbench.leaderboard.schema import Entry

def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _per_order(row: Row, metric: str, orders: list[str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {o: [] for o in orders}
    for e in row.entries:
        v = score_value(e, metric)
        if v is not None:
            out[e.order_label].append(v)
    return {o: vs for o, vs in out.items() if vs}


def _ranks(values: dict[str, float], higher: bool) -> dict[str, int]:
    labels = list(values)
    return dict(zip(labels, competition_ranks([-values[k] if higher else values[k] for k in labels])))


def rank_stability(per_order: dict[str, dict[str, float]], orders: list[str]) -> dict[str, Any]:
    """Kendall's tau-b between the per-order rankings, for every pair of orders, and their mean."""
    pairs = []
    for o1, o2 in combinations(orders, 2):
        common = [label for label, vals in per_order.items() if o1 in vals and o2 in vals]
        if len(common) < 2:
            continue
        x = [per_order[label][o1] for label in common]
        y = [per_order[label][o2] for label in common]
        tau = kendall_tau_b(x, y)
        pairs.append({"orders": [o1, o2], "tau": None if math.isnan(tau) else float(tau), "n_strategies": len(common)})
    taus = [p["tau"] for p in pairs if p["tau"] is not None]
    out: dict[str, Any] = {"kendall_tau_mean": _mean(taus) if taus else None,
                           "kendall_tau_min": min(taus) if taus else None, "pairs": pairs}
    if not taus:
        out["note"] = ("needs at least 2 orders and 2 strategies with distinct scores" if not pairs
                       else "every order gives tied scores; tau is undefined")
    return out


def compare_table(table: BenchmarkTable, metric: str, a: str | None = None, b: str | None = None, *,
                  paired: bool = True, planned: bool = False, gap: float | None = None) -> dict[str, Any]:
    """The comparison of one table's methods on ``metric`` across orders; with ``paired``, also
    the paired test of ``a`` against ``b`` (by default the two best), which a page does not show;
    with ``planned``, the orders that pair needs for 80% power and their cost
    (:func:`clbench.leaderboard.pairs.plan`; ``gap`` as tables show it, points for a percentage;
    default the observed gap)."""
    higher = table.higher.get(metric, True)
    orders = table.orders
    strategies = []
    per_order_means: dict[str, dict[str, float]] = {}
    for row in table.rows:
        per_order = _per_order(row, metric, orders)
        if not per_order:
            continue
        means = {o: _mean(vs) for o, vs in per_order.items()}
        if row.unranked is None:  # a row the suite does not rank is in no ranking, per order either
            per_order_means[row.label] = means
        values = list(means.values())
        pick_worst = min if higher else max
        worst_order = pick_worst(means, key=means.get)
        best_order = (max if higher else min)(means, key=means.get)
        strategies.append({"label": row.label, "strategy": row.strategy, "model": row.model,
                           "per_order": means, "per_order_runs": {o: len(vs) for o, vs in per_order.items()},
                           "mean": _mean(values), "std": _std(values), "n_orders": len(values),
                           "n_runs": sum(len(vs) for vs in per_order.values()),
                           "worst_order": worst_order, "worst": means[worst_order],
                           "best_order": best_order, "best": means[best_order],
                           "range": max(values) - min(values), "unranked": row.unranked})
    groups = table.groups if metric == RANK_BY and table.groups is not None else table_groups(table.rows, higher, metric)
    by_label = {row.label: row for row in table.rows}
    for s in strategies:
        stat = by_label[s["label"]].stats.get(metric)
        half = None if stat is None else stat.half
        s["interval"] = None if stat is None else {
            "mean": stat.mean, "half_width": half, "low": stat.low, "high": stat.high, "cut": stat.cut,
            "runs": stat.n, "units": stat.units, "confidence": 1 - ALPHA,
            "kind": "test set" if stat.from_test_set else "t over units" if half is not None else None}
        s["group"] = groups.letters.get(s["label"])
    strategies.sort(key=lambda s: (-s["mean"] if higher else s["mean"], s["label"]))
    for order in orders:
        ranks = _ranks({lab: m[order] for lab, m in per_order_means.items() if order in m}, higher)
        for s in strategies:
            if s["label"] in ranks:
                s.setdefault("rank_by_order", {})[order] = ranks[s["label"]]
    meta = table.score(metric)  # title, unit and direction as the entries recorded them
    title = metric if meta.direction == "none" else table.title(metric).removesuffix(" ↓").removesuffix(" ↑")
    scale, unit = scale_and_unit(meta.percent)
    out: dict[str, Any] = {"benchmark": table.label, "higher_is_better": higher, "percent": meta.percent,
                           "directed": meta.direction != "none",
                           "orders": orders, "spelled_orders": spelled_orders(table),
                           "strategies": strategies, "rank_stability": rank_stability(per_order_means, orders),
                           "groups": {**groups.as_dict(), "design": design_text(groups, title, scale, unit),
                                      "text": groups_line(groups, scale)}}
    design = {"unit": replication_unit(set(orders)), "pairs_in_table": max(groups.m, 1)}
    if not paired:
        out["paired_test"] = None
    elif a or b:
        if not (a and b):
            raise UserError("give both --a and --b for a paired test", where="--a/--b",
                            fix="e.g. --a replay --b naive")
        out["paired_test"] = paired_test(find_row(table, a, "--a"), find_row(table, b, "--b"), metric, higher,
                                         **design)
    elif len(best := [s for s in strategies if s["unranked"] is None]) >= 2:
        rows = {r.label: r for r in table.rows}
        out["paired_test"] = paired_test(rows[best[0]["label"]], rows[best[1]["label"]], metric, higher, **design)
    else:
        out["paired_test"] = None
    pt = out["paired_test"]
    own_gap = None if gap is None else gap / 100 if meta.percent else gap
    out["plan"] = plan(table, metric, pt["a"], pt["b"], pairs_in_table=design["pairs_in_table"], gap=own_gap) \
        if planned and pt is not None else None
    return out


def compare(entries: list[Entry], *, metric: str = "acc", benchmark: str | None = None, a: str | None = None,
            b: str | None = None, sequence: list[str] | None = None, source: str | None = None,
            planned: bool = False, gap: float | None = None,
            unranked: dict[str, str] | None = None) -> dict[str, Any]:
    """The comparison across task orders, as a JSON-ready dict (see the module notes); with
    ``planned``, each paired test's plan (``gap`` as tables show it: 6.7 for 6.7 points).

    ``sequence`` (config hashes in suite order) only orders benchmarks and task orders;
    ``source`` (the leaderboard directory) only names it in errors; ``unranked`` as
    :func:`~clbench.leaderboard.table.build_tables` takes it (rows the suite does not rank).
    """
    tables = build_tables(entries, sequence, source=source, unranked=unranked)
    known = sorted({k for e in entries if e.ok for k, v in e.scores.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)})
    if metric not in known:
        raise UserError(f"no score '{metric}' in these entries", where="--metric",
                        fix=did_you_mean(metric, known or TABLE_SCORES))
    if benchmark is not None:
        chosen = [t for t in tables if benchmark in (t.label, t.name)]
        if not chosen:
            raise UserError(f"no benchmark '{benchmark}' in these entries", where="--benchmark",
                            fix=did_you_mean(benchmark, [t.label for t in tables]))
        tables = chosen
    benchmarks = [compare_table(t, metric, a, b, planned=planned, gap=gap) for t in tables
                  if any(score_value(e, metric) is not None for row in t.rows for e in row.entries)]
    directions = {bench["higher_is_better"] for bench in benchmarks}
    # one direction for all benchmarks, or None where they differ (each benchmark says its own)
    higher = directions.pop() if len(directions) == 1 else (None if directions else True)
    percent = all(bench["percent"] for bench in benchmarks)  # one unit: the metric's, as its entries recorded it
    directed = all(bench["directed"] for bench in benchmarks)  # False: a diagnostic such as N_eff
    return {"metric": metric, "higher_is_better": higher, "percent": percent, "directed": directed,
            "min_pairs": MIN_PAIRS,
            "benchmarks": benchmarks}


def print_comparison(report: dict[str, Any], console=None) -> None:
    """The comparison as rich tables, one per benchmark, with the tau and paired-test lines."""
    from rich.table import Table
    from rich.text import Text

    from clbench.leaderboard.terminal import console_for_tables

    console = console or console_for_tables()
    metric = report["metric"]
    plain = not report["directed"]  # a diagnostic such as N_eff: no better direction
    unit = " (%)" if report["percent"] else ""

    def fmt(value: float | None) -> str:
        return shown(value, report["percent"])

    for bench in report["benchmarks"]:
        orders = bench["orders"]
        higher = bench.get("higher_is_better", True)
        better = "higher" if higher else "lower"
        title = (f"{bench['benchmark']}: {metric} per task order (a plain number with no better direction; ranked "
                 "high to low)") if plain else \
            f"{bench['benchmark']}: {metric} {arrow(higher)}{unit} per task order ({better} is better)"
        table = Table(title=title, title_justify="left")
        table.add_column("group", justify="center")
        table.add_column("strategy", style="bold")
        for order in orders:
            table.add_column(order, justify="right")
        table.add_column("mean, 95% CI (units)", justify="right")
        table.add_column("mean ± std (orders)", justify="right")
        table.add_column("lowest order" if plain else "worst order", justify="right")
        table.add_column("range", justify="right")
        table.add_column("rank per order", justify="right")
        for s in bench["strategies"]:
            std = f" ± {fmt(s['std'])}" if s["std"] is not None else ""
            ranks = "/".join(str(s.get("rank_by_order", {}).get(o, "—")) for o in orders)
            table.add_row(s.get("group") or "—", Text(s["label"]), *[fmt(s["per_order"].get(o)) for o in orders],
                          _interval(s, fmt), f"{fmt(s['mean'])}{std}",
                          f"{fmt(s['worst'])} ({s['worst_order']})", fmt(s["range"]), ranks)
        console.print(table)
        groups = bench.get("groups") or {}
        legend = orders_legend(bench.get("spelled_orders") or {})
        for line in (legend and f"orders: {legend}", groups.get("design"),
                     groups.get("text") and f"groups, best first: {groups['text']}", unranked_line(bench)):
            if line:  # plain text (the unranked reason is the suite's words): no rich markup read in it
                console.print(line, highlight=False, markup=False)
        rs = bench["rank_stability"]
        if rs["kendall_tau_mean"] is not None:
            console.print(f"rank stability: Kendall's tau {rs['kendall_tau_mean']:.3f} (mean over "
                          f"{len(rs['pairs'])} order pairs, min {rs['kendall_tau_min']:.3f})", highlight=False)
        else:
            console.print(f"rank stability: {rs['note']}", highlight=False)
        pt = bench.get("paired_test")
        if pt:
            name = "orders" if pt.get("unit", "order") == "order" else "seeds"
            head = f"paired test {pt['a']} vs {pt['b']} on {pt['n_pairs']} {name}"
            if "mean_difference" not in pt:
                console.print(f"{head}: {pt['note']}", highlight=False)
            else:
                gap = (f"{100 * pt['mean_difference']:+.2f} points" if report["percent"] else
                       f"{pt['mean_difference']:+.2f}")
                difference = f"mean difference {gap} " + ("(no better direction); " if plain else
                                                              f"({better} is better); ")
                word = "higher" if plain else "better"
                parts = [difference +
                         f"{pt['a']} {word} in {pt['a_better']}, {pt['b']} in {pt['b_better']} of {pt['n_pairs']}"]
                if pt["t_test"]:
                    parts.append(f"paired t p={pt['t_test']['p_value']:.3g}")
                if pt["wilcoxon"]:
                    parts.append(f"Wilcoxon p={pt['wilcoxon']['p_value']:.3g} "
                                 f"(smallest possible {pt['wilcoxon']['min_attainable_p']:.3g})")
                if pt.get("note"):
                    parts.append(pt["note"])
                console.print(f"{head}: " + "; ".join(parts), highlight=False)
                if pt.get("power"):
                    console.print(power_text(pt, fmt), highlight=False)
            if bench.get("plan"):
                console.print(plan_text(bench["plan"], fmt), highlight=False)
        console.print()


def _interval(s: dict[str, Any], fmt) -> str:
    """``70.8 ± 11.8 (n=3)``: a strategy's mean over its units and its 95% interval (``[low, high]``
    where a bound of the score cut it; ‡: one unit's test set)."""
    iv = s.get("interval")
    if not iv:
        return "—"
    mark = "‡" if iv["kind"] == "test set" else ""
    ci = "" if iv["half_width"] is None else (f" [{fmt(iv['low'])}, {fmt(iv['high'])}]{mark}" if iv.get("cut") else
                                              f" ± {fmt(iv['half_width'])}{mark}")
    return f"{fmt(iv['mean'])}{ci} (n={iv.get('units', iv['runs'])})"


def comparison_markdown(report: dict[str, Any]) -> str:
    """The comparison as Markdown to paste: per benchmark, the design sentence, one row per
    strategy (group, mean ± 95% interval, runs, per-order values, worst order) and every pair
    (difference, critical difference, paired-t and Holm p-values, the gap detected with 80% power)."""
    metric = report["metric"]

    def fmt(value: float | None) -> str:
        return shown(value, report["percent"])

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    lines = []
    for bench in report["benchmarks"]:
        orders, groups = bench["orders"], bench.get("groups") or {}
        lines += [f"### {cell(bench['benchmark'])}: {metric} ({'higher' if bench['higher_is_better'] else 'lower'} "
                  "is better)", ""]
        if groups.get("design"):
            lines += [groups["design"], ""]
        lines.append("| Group | Strategy | Mean ± 95% CI | 95% CI | Runs | " + " | ".join(map(cell, orders))
                     + " | Worst order |")
        lines.append("|:---:|:---|---:|:---:|---:|" + "---:|" * len(orders) + ":---|")
        for s in bench["strategies"]:
            iv = s.get("interval") or {}
            ends = "—" if iv.get("low") is None else f"[{fmt(iv['low'])}, {fmt(iv['high'])}]"
            lines.append(f"| {s.get('group') or '—'} | {cell(s['label'])} | {_interval(s, fmt).rsplit(' (n=', 1)[0]} | "
                         f"{ends} | {iv.get('runs', '—')} | "
                         + " | ".join(fmt(s["per_order"].get(o)) for o in orders)
                         + f" | {fmt(s['worst'])} ({cell(s['worst_order'])}) |")
        lines.append("")
        if legend := orders_legend(bench.get("spelled_orders") or {}):
            lines += [md_text(f"Orders: {legend}."), ""]
        if groups.get("pairs"):
            lines += ["| A | B | A − B | Critical difference | Detectable (80% power) | p (paired t) | p (Holm) "
                      "| Significant |", "|:---|:---|---:|---:|---:|---:|---:|:---:|"]
            for pair in groups["pairs"]:
                lines.append(f"| {cell(pair['a'])} | {cell(pair['b'])} | {fmt(pair['difference'])} | "
                             f"{fmt(pair['critical_difference'])} | {fmt(pair.get('detectable_at_80_power'))} | "
                             f"{pair['p_value']:.3g} | {pair['p_holm']:.3g} | "
                             f"{'yes' if pair['significant'] else 'no'} |")
            lines.append("")
        pt = bench.get("paired_test")
        if pt and pt.get("power"):
            text = power_text(pt, fmt)
            lines += [text[0].upper() + text[1:] + ".", ""]
        if bench.get("plan"):  # it names the pair's labels, which a received folder chose
            text = plan_text(bench["plan"], fmt)
            lines += [md_text(text[0].upper() + text[1:]), ""]
        if groups.get("text"):
            lines += [f"Groups, best first: {groups['text']}.", ""]
        if line := unranked_line(bench):
            lines += [md_text(line), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def unranked_line(bench: dict) -> str | None:
    """The rows of a compared table that its suite does not rank, and why (None without any)."""
    rows = [s for s in bench["strategies"] if s.get("unranked")]
    return ("Not ranked (in no group, no rank per order, no default pair): "
            + "; ".join(f"{s['label']}: {s['unranked'].rstrip('.')}" for s in rows) + ".") if rows else None
