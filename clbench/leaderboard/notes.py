"""What a leaderboard says about its tables in words: each benchmark's one-line description,
the notes above and below a table, and the footnotes that explain a surprising column.

The terminal (:mod:`clbench.leaderboard.terminal`), ``README.md`` and the HTML pages
(:mod:`clbench.leaderboard.render`) say the same things, so each note is written once, here.
"""

from __future__ import annotations

import functools

from clbench.leaderboard.stats import ALPHA, MAX_UNITS, POWER, TEST_LONG, Groups, letter_marks, mark_order
from clbench.leaderboard.table import RANK_BY, BenchmarkTable, scoring
from clbench.metrics.score_registry import shown
from clbench.results.record import Status

INDEX = "index.html"  # the rendered page, which the notes point readers to


def bench_meta(table: BenchmarkTable) -> dict:
    entries = [e for row in table.rows for e in row.entries]
    ok = [e for e in entries if e["status"] == Status.OK]
    defaults = [e for e in ok if e["order_label"] == "default"]
    first = (defaults or ok or entries)[0]
    bench = first["benchmark"]
    seeds = sorted({e["seed"] for e in entries})
    models = sorted({row.model for row in table.rows})
    return {"scenario_type": bench.get("scenario_type"), "num_classes": bench.get("num_classes"),
            "experiences": list(first.get("experiences") or []), "orders": table.orders, "seeds": seeds,
            "models": models, "init_args": bench.get("init_args") or {}, "r_names": table.r_names,
            "r_higher": table.r_higher, "scorings": sorted({s for s in map(scoring, ok or entries) if s})}


SCORING_NOTES = {"trace": "TRACE's own evaluation scripts, comparable with papers",
                 "normalized": "lenient, not comparable with papers",
                 "mixed": "tasks scored both ways"}


def meta_line(meta: dict) -> str:
    parts = []
    if meta["scenario_type"]:
        parts.append(meta["scenario_type"])
    if meta["experiences"]:
        parts.append(f"{len(meta['experiences'])} experiences ({', '.join(meta['experiences'])})")
    if meta["num_classes"]:
        parts.append(f"{meta['num_classes']} classes")
    parts.append(f"orders: {', '.join(meta['orders'])}")
    parts.append(f"seeds: {', '.join(map(str, meta['seeds']))}")
    parts.append(f"model: {', '.join(meta['models'])}")
    if meta["r_names"] and meta["r_names"] != ["acc"]:
        parts.append(f"R: {', '.join(meta['r_names'])} ({'higher' if meta['r_higher'] else 'lower'} is better)")
    if meta["scorings"]:
        parts.append("scoring: " + ", ".join(f"{s} ({SCORING_NOTES.get(s, 'see docs/language-models.md')})"
                                             for s in meta["scorings"]))
    return " · ".join(parts)


def direction_note(table: BenchmarkTable) -> str | None:
    """What the scores of a lower-is-better R mean, and their unit where R is not a percentage
    (None for accuracy tables, whose notes are the page's)."""
    unit = None if table.percent else (
        f"R is not a percentage ({', '.join(dict.fromkeys(table.r_names))}): its scores are plain numbers in R's "
        "own unit, and so are the intervals and critical differences.")
    if table.r_higher:
        return unit
    return ("R holds errors (lower is better): ACC and AIA are mean final and incremental errors (↓); BWT < 0 "
            "still means forgetting and FWT > 0 helpful transfer (↑); Forgetting is the mean rise of each "
            "experience's error above its best (↓). Rows are ranked by lowest mean ACC; ↑/↓ mark each column's "
            "better direction." + (f" {unit}" if unit else ""))


NOTES = ("Scores are percentages: mean ± the half-width of its 95% interval over task orders, the replication "
         "unit (each order's seeds are averaged first; Student's t with orders − 1 degrees of freedom; a table of "
         "one order uses its seeds instead). An interval that a score's bounds cut (0 and 100; −100 and 100 for BWT, FWT "
         "and Forgetting) is written by its ends, [low, high]. A row of one unit shows its test set's 95% interval, "
         "marked ‡ (Wilson's for accuracy and exact match), where the runs recorded their test-set errors, else the "
         "value alone. Group: methods sharing a letter are not "
         "significantly different in ACC (the test, α and critical difference are named above each table). ACC is the final average accuracy over all experiences; AIA the "
         "average incremental accuracy; BWT < 0 means forgetting; FWT is forward transfer against the "
         "untrained model; Forgetting is the mean drop from each experience's best accuracy to its final one "
         "(lower is better). Rows are ranked by mean ACC. Joint training has a single stage, so its BWT, FWT and "
         "Forgetting are undefined (—). Wall s is a run's mean wall time on the machine that made the entries (the "
         "header names it), not on the machine reading them.")


def page_notes(tables: list[BenchmarkTable]) -> str:
    """:data:`NOTES`, saying where a table's R is not a percentage (its :func:`direction_note` gives the unit)."""
    if all(table.percent for table in tables):
        return NOTES
    return NOTES.replace("Scores are percentages:", "Scores are percentages, except in a table whose R is not one "
                         "(its note gives the unit):", 1)


def trace_note(table: BenchmarkTable) -> str | None:
    """What OP is, on a table whose ACC column is headed OP (see BenchmarkTable.op_title)."""
    title = table.op_title
    if title is None:
        return None
    how = ("as TRACE's own scripts score it" if title == "OP (TRACE)" else
           "scored leniently, so not comparable with papers")
    return (f"{title} is TRACE's overall performance: the final mean over tasks of each task's own metric "
            f"({', '.join(dict.fromkeys(table.r_names))}; {how}), in the place of ACC; AIA, BWT, FWT and "
            "Forgetting are computed from the same R.")


GMEAN_SCORES = ("gmean_final", "global_gmean")


def gmean_note(table: BenchmarkTable, page: bool = False) -> str | None:
    """Why a G-mean column reads 0 (one class never predicted is enough), or None where none does."""
    runs = [e for row in table.rows for e in row.ok if any(s in table.scores for s in GMEAN_SCORES)]
    zero = [e for e in runs if any(e["scores"].get(s) == 0 for s in GMEAN_SCORES)]
    if not zero:
        return None
    where = ("a strategy's page (click its name) shows the per-class recall after the last stage" if page else
             f"each strategy's page, linked from {INDEX}, shows the per-class recall after the last stage")
    return (f"G-mean is the geometric mean of per-class recalls, so it is 0 as soon as one class is never predicted "
            f"correctly (recall 0), as happens to the classes of earlier experiences once a model forgets them. "
            f"G-mean is 0 on some test set in {len(zero)} of {len(runs)} runs here; {where}.")


DIRTY_MARK = "†"


def dirty_note(table: BenchmarkTable) -> str | None:
    """The footnote of a table with rows made (in part) from uncommitted code, or None."""
    dirty = sum(len(row.dirty) for row in table.rows)
    if not dirty:
        return None
    total = sum(len(row.entries) for row in table.rows)
    return (f"{DIRTY_MARK} Made from uncommitted code ({dirty} of {total} runs, env.git_dirty): the code that made "
            "these numbers cannot be found again, so 'clbench leaderboard verify' cannot rerun them. Regenerate "
            "them from a clean tree.")


ROUTING_NOTE = ("N_eff (MoE methods): the route-wise effective composition number after the last stage, averaged "
                "over MoE layers: how many compositions (language models: task, position and token-frequency "
                "buckets; classifiers: test experience and class) share one route, weighted by the routes' share "
                "of the test units of the experiences before the last (the old tasks, as the MH-MoE paper measures "
                "it); 1 means every route carries one composition. A plain number, not a percentage.")


def routing_note(table: BenchmarkTable) -> str | None:
    return ROUTING_NOTE if "n_eff" in table.scores else None


RECALL_NOTE = ("Recall of each class (columns) on each test experience and on the stream-wide test set (rows) after "
               "the last stage; · marks a class with no test sample there. G-mean is the geometric mean of a row's "
               "recalls, so one class never predicted (recall 0, in red) makes it 0.")
RECALL_MISSING = ("These entries do not record per-class recall (recall_final, written by runs since it was added); "
                  "rerun them with --force to see which classes make G-mean 0.")


def _rank_title(table: BenchmarkTable) -> str:
    return table.title(RANK_BY).removesuffix(" ↓").removesuffix(" ↑")


def groups_note(table: BenchmarkTable) -> str | None:
    """Above a table: how its rank groups were formed (test, correction, α), and the smallest
    difference the design can detect (:mod:`clbench.leaderboard.stats`)."""
    if table.groups is None:
        return None
    return design_text(table.groups, _rank_title(table), *scale_and_unit(table.percent))


def groups_text(table: BenchmarkTable) -> str | None:
    """Below a table: the rank groups as text (a critical-difference diagram in words), best first,
    and the units each adjacent tie would need to be separated (its power statement)."""
    line = None if table.groups is None else groups_line(table.groups, scale_and_unit(table.percent)[0])
    if line is None:
        return None
    ties = ties_text(table.groups, *scale_and_unit(table.percent))
    return f"Rank groups on {_rank_title(table)}, best first: {line}." + (f" {ties}" if ties else "")


def constant_note(table: BenchmarkTable) -> str | None:
    """Why a column that a table's runs make constant by construction shows — (table.constant_scores)."""
    if "fwt" not in table.constant:
        return None
    return ("FWT is not shown (—): on this class-incremental stream every run scored exactly 0 on each "
            "experience before training it (a shared head does not predict classes it has not seen), so FWT "
            "would be −mean(r_init) for every method, a property of the untrained network, not a transfer.")


def readme_notes(table: BenchmarkTable) -> tuple[list[str], list[str]]:
    """The notes ``README.md`` writes above a table and below it (each present one)."""
    above = (direction_note(table), trace_note(table), routing_note(table), groups_note(table))
    below = (groups_text(table), dirty_note(table), gmean_note(table), constant_note(table))
    return [n for n in above if n], [n for n in below if n]


# -- the rank groups in words (clbench.leaderboard.stats computes them) ---------------------
def scale_and_unit(percent: bool):
    """How a score's values and differences are written (:func:`~clbench.metrics.score_registry.shown`)
    and their unit: ``" points"`` for a percentage, none for a score in a unit of its own (an error, N_eff)."""
    return functools.partial(shown, percent=percent), " points" if percent else ""


def span_text(span: tuple[float, float], scale=shown, unit: str = " points") -> str:
    """``6.3 points`` or ``6.3–6.8 points``."""
    low, high = span
    return f"{scale(low)}{unit}" if scale(low) == scale(high) else f"{scale(low)}–{scale(high)}{unit}"


def critical_text(groups: Groups, scale=shown, unit: str = " points") -> str:
    return span_text(groups.critical, scale, unit)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def needed_text(needed: int | None, unit: str) -> str:
    """How many units a tie needs: ``7 orders``, ``more than 10000 orders``, or why none will do."""
    if needed is None:
        return f"not by more {unit}s alone: the shared test set's noise hides the gap (a larger test set would help)"
    if needed > MAX_UNITS:
        return f"more than {MAX_UNITS} {unit}s"
    return _plural(needed, unit)


def spread_text(groups: Groups) -> str | None:
    """Levene's test, as a sentence (None where it could not be run)."""
    if not groups.spread:
        return None
    p = groups.spread["p_value"]
    verdict = "the methods' spreads across units differ" if p < ALPHA else "no evidence that the spreads differ"
    return f"Levene's test on the methods' residual spreads: p = {p:.2g} ({verdict}; the tests above pool none)"


def design_text(groups: Groups, title: str, scale=shown, unit: str = " points") -> str:
    """The header sentence of a table's groups: unit, test, correction, α, critical difference,
    power, the spreads' test and the test-set noise."""
    if groups.method is None:
        return f"Rank groups on {title}: none ({groups.note})."
    if groups.method == "paired":
        if groups.unit == "order":
            design = (f"{groups.k} methods × {_plural(groups.n, 'task order')}, seeds averaged within each order: "
                      f"the order is the unit, so a claim holds across orders")
        else:
            design = (f"{groups.k} methods × {_plural(groups.n, 'seed')} of a single task order: the seed is the "
                      "unit, so a claim holds for this order only")
    else:
        design = f"{groups.k} methods, one run each: test-set errors only"
    noise = (f"test-set noise included (a unit's {title} has a standard error of {scale(groups.test_set_se)}{unit}, "
             "Wilson's for proportions)" if groups.test_set_known else
             "test-set noise not included: these entries did not record r_stderr")
    parts = [f"Rank groups on {title}: {TEST_LONG}, α = {ALPHA} family-wise over all {groups.m} pairs ({design}); "
             "methods sharing a letter are not significantly different.",
             f"Critical difference (a gap always separated, at Holm's strictest level α/{groups.m}): "
             f"{critical_text(groups, scale, unit)}."]
    if groups.detectable:
        detectable = span_text(groups.detectable, scale, unit)
        parts.append(f"Smallest difference detected with {POWER:.0%} power: {detectable}.")
    spread = spread_text(groups)
    if spread:
        parts.append(spread + ".")
    parts.append(noise[0].upper() + noise[1:] + ".")
    return " ".join(parts)


def ties_text(groups: Groups, scale=shown, unit: str = " points") -> str | None:
    """Each adjacent pair that ties, with the units its observed gap needs to be separated with 80% power."""
    if not groups.ties or groups.unit is None:
        return None
    unit_name = "order" if groups.unit == "order" else "seed"
    parts = [f"{tie['a']} vs {tie['b']} ({scale(abs(tie['difference']))}{unit}): "
             f"{needed_text(tie['units_needed'], unit_name)}" for tie in groups.ties]
    return (f"Adjacent ties, and the {unit_name}s that would separate the observed gap with {POWER:.0%} power: "
            + "; ".join(parts) + ".")


def groups_line(groups: Groups, scale=shown) -> str | None:
    """The groups as text, best first: ``a: joint 87.7 · b: replay 70.8 · c: lwf 40.8, naive 40.7``."""
    if groups.method is None:
        return None
    marks = sorted({m for v in groups.letters.values() for m in letter_marks(v)}, key=mark_order)
    parts = [f"{mark}: " + ", ".join(f"{label} {scale(groups.means[label])}" for label in members)
             for mark, members in zip(marks, groups.groups)]
    return " · ".join(parts)


def power_text(pt: dict, fmt) -> str:
    """The paired test's power: the gap it detects with 80% power, and the units the observed gap needs."""
    power, name = pt["power"], "order" if pt.get("unit", "order") == "order" else "seed"
    return (f"power: at the table's Holm level α/m = {power['level']:.2g}, this pair's test detects "
            f"{fmt(power['detectable'])} with {POWER:.0%} power on {pt['n_pairs']} {name}s; the observed gap "
            f"{fmt(abs(pt['mean_difference']))} needs {needed_text(power['units_needed'], name)}")


def _hours(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} h" if value >= 1 else f"{60 * value:.0f} min"


def plan_text(plan: dict, fmt) -> str:
    """:func:`clbench.leaderboard.pairs.plan` in one paragraph: the orders the gap needs for 80%
    power, planned and at the table's Holm level, and what they cost here and on one GPU."""
    if plan.get("note"):
        return f"plan: {plan['note']}"
    needed = plan["orders_needed"]
    gap = f"the observed gap {fmt(plan['gap'])}" if plan["gap_observed"] else f"a gap of {fmt(plan['gap'])}"
    text = (f"plan ({plan['a']} vs {plan['b']}, {plan['power']:.0%} power): {gap}, with a spread of "
            f"{fmt(plan['sd_orders'])} across orders, needs {needed_text(needed['planned'], 'order')} at "
            f"α = {plan['levels']['planned']:.2g} for one comparison planned in advance, "
            f"{needed_text(needed['holm'], 'order')} at the table's Holm level α/m = {plan['levels']['holm']:.2g}; "
            f"{plan['orders_run']} were run")
    for key, where in (("cost_here", "here"), ("cost_gpu", "on one GPU")):
        cost = plan.get(key)
        if cost is None:
            if key == "cost_gpu":
                text += "; no entry of these runs was made on a GPU, so its cost there is not measured"
            continue
        text += (f"; one more order costs {_hours(cost['hours_per_order'])} {where} "
                 f"({', '.join(cost['machines'])}), the planned orders {_hours(cost['hours']['planned'])} "
                 f"({_hours(cost['more_hours']['planned'])} more), at Holm's level {_hours(cost['hours']['holm'])}")
    return text + "."
