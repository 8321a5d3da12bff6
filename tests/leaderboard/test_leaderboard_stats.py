"""Which differences are real: the replication unit, intervals, rank groups and power on
constructed leaderboards whose effects are known (clbench.leaderboard.stats), in the tables,
the README and ``clbench compare``."""

from __future__ import annotations

import json
import math
from itertools import combinations

import numpy as np
import pytest
from scipy.stats import kendalltau, levene, rankdata, studentized_range, t

from clbench.cli.main import main
from clbench.leaderboard import entries as E
from clbench.leaderboard.compare import compare, comparison_markdown
from clbench.leaderboard.notes import groups_note
from clbench.leaderboard.page_stats import competition_ranks, kendall_tau_b, levene_mean_centred
from clbench.leaderboard.power import POWER, PairNoise
from clbench.leaderboard.stats import ALPHA, interval, letters, rank_groups
from clbench.leaderboard.cell_text import fmt
from clbench.leaderboard.table import build_tables
from clbench.metrics.stderr import entry_score_stderr, wilson_stderr
from helpers import fake_entry, typed_entries

ORDERS = ("default", "reverse", "perm1", "perm2")
SEEDS = (0, 1)
# A large order effect (an order that is hard for every method), a small method x order
# interaction and a smaller seed effect: intervals over orders are wide, yet pairing on the
# order tells the methods apart.
ORDER_EFFECT = {"default": 0.00, "reverse": -0.10, "perm1": 0.08, "perm2": -0.05}
INTERACTION = {"replay": [0.004, -0.003, 0.001, -0.002], "ewc": [-0.002, 0.003, -0.004, 0.001],
               "lwf": [0.003, -0.001, 0.002, -0.003], "naive": [-0.001, 0.002, 0.000, 0.003]}
SEED_EFFECT = {0: 0.001, 1: -0.001}
# replay is 25 points better (a known large effect); ewc, lwf and naive are the same method (a null effect)
TRUE_MEAN = {"replay": 0.75, "ewc": 0.50, "lwf": 0.50, "naive": 0.50}


def board(tmp_path, means=TRUE_MEAN, orders=ORDERS, seeds=SEEDS):
    for name, mean in means.items():
        for i, order in enumerate(orders):
            for seed in seeds:
                acc = mean + ORDER_EFFECT[order] + INTERACTION[name][i] + SEED_EFFECT[seed]
                E.write_entry(tmp_path, fake_entry(name, order, seed, acc))
    return tmp_path


def order_means(entries, name):
    """The method's mean over seeds in each order, in the order of :data:`ORDERS`."""
    by = {}
    for e in entries:
        if e.strategy.name == name:
            by.setdefault(e.order_label, []).append(e.scores["acc"])
    return [sum(by[o]) / len(by[o]) for o in ORDERS if o in by]


def test_the_order_is_the_unit_a_large_effect_is_its_own_group_and_a_null_effect_shares_one(tmp_path):
    entries = E.load_entries(board(tmp_path))
    (table,) = build_tables(entries)
    groups = table.groups
    assert groups.method == "paired" and groups.unit == "order" and groups.k == 4 and groups.n == 4
    assert groups.letters == {"replay": "a", "ewc": "b", "lwf": "b", "naive": "b"}
    assert [sorted(g) for g in groups.groups] == [["replay"], ["ewc", "lwf", "naive"]]
    for row in table.rows:  # each interval is t(0.975; 3) sd / sqrt(4) of the row's 4 order means, not of its 8 runs
        values = order_means(entries, row.label)
        mean = sum(values) / 4
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
        stat = row.stats["acc"]
        assert stat.n == 8 and stat.units == 4 and stat.mean == pytest.approx(mean)
        assert stat.half == pytest.approx(t.ppf(0.975, 3) * sd / 2)
        runs = [e.scores["acc"] for e in entries if e.strategy.name == row.label]
        run_sd = math.sqrt(sum((v - mean) ** 2 for v in runs) / 7)
        assert stat.half > 1.5 * t.ppf(0.975, 7) * run_sd / math.sqrt(8)  # control: seeds counted as units
    # the order effect makes every interval wider than the null group's spread: pairing is what separates them
    assert all(row.stats["acc"].half > 0.05 for row in table.rows)


def test_each_pair_is_tested_on_its_own_differences_with_holm_over_all_pairs(tmp_path):
    (table,) = build_tables(E.load_entries(board(tmp_path)))
    pairs = {(p["a"], p["b"]): p for p in table.groups.pairs}
    entries = E.load_entries(tmp_path)
    raw = []
    for (a, b), pair in pairs.items():  # the paired t-test of the order means, no test-set error recorded
        diffs = [x - y for x, y in zip(order_means(entries, a), order_means(entries, b))]
        d = sum(diffs) / 4
        se = math.sqrt(sum((x - d) ** 2 for x in diffs) / 3 / 4)
        assert pair["se"] == pytest.approx(se) and pair["df"] == pytest.approx(3)
        assert pair["p_value"] == pytest.approx(2 * t.sf(abs(d) / se, 3))
        assert pair["critical_difference"] == pytest.approx(t.ppf(1 - ALPHA / 12, 3) * se)
        raw.append(pair["p_value"])
    ranked = sorted(raw)  # Holm: the i-th smallest p times (m - i), made monotone
    expected = np.maximum.accumulate([min(1, (6 - i) * p) for i, p in enumerate(ranked)])
    assert sorted(p["p_holm"] for p in pairs.values()) == pytest.approx(list(expected))


def test_a_single_order_takes_its_seeds_as_the_unit_and_says_the_claim_holds_for_that_order_only(tmp_path):
    for name, mean in TRUE_MEAN.items():
        for seed, noise in enumerate(INTERACTION[name]):
            E.write_entry(tmp_path, fake_entry(name, "default", seed, mean + noise))
    (table,) = build_tables(E.load_entries(tmp_path))
    assert table.groups.unit == "seed" and table.groups.n == 4
    assert all(row.stats["acc"].units == 4 for row in table.rows)
    assert "the seed is the unit, so a claim holds for this order only" in groups_note(table)


def test_a_bounded_score_keeps_its_interval_inside_its_range(tmp_path):
    for order, acc in zip(ORDERS[:3], (0.0, 0.0, 0.75)):  # mean 25, t interval ± 107.5: past 0 and 100
        E.write_entry(tmp_path, fake_entry("replay", order, 0, acc))
    (table,) = build_tables(E.load_entries(tmp_path))
    stat = table.rows[0].stats["acc"]
    assert stat.mean - stat.half < 0 and stat.mean + stat.half > 1  # control: the unbounded interval
    assert (stat.low, stat.high) == (0.0, 1.0) and stat.cut
    assert fmt(stat) == "25.0 [0.0, 100.0]"
    bwt = table.rows[0].stats["bwt"]  # BWT = acc - 1 here: in [-100, 100], cut at -100
    assert bwt.low == -1.0 and bwt.high == pytest.approx(bwt.mean + bwt.half)


def test_a_cell_at_zero_or_one_keeps_a_wilson_error_where_the_binomial_one_is_zero():
    entry = fake_entry("naive", "default", 0, 0.0)  # R = [[1, 0.5], [0, 0]]: cells at the bounds
    n = 100
    entry["r_stderr"] = [[math.sqrt(v * (1 - v) / n) for v in row] for row in entry["r_matrix"]]
    entry["r_init_stderr"] = [0.03, 0.03]  # 0.1 of 100 has binomial error 0.03: Wilson too
    entry["r_n"] = [n, n]
    recorded, tested = entry_score_stderr(entry), entry_score_stderr(entry, wilson=True)
    assert recorded["acc"] == 0.0  # the binomial error of 0/100: no noise at all
    assert tested["acc"] == pytest.approx(math.sqrt(2) * wilson_stderr(0.0, n) / 2) and tested["acc"] > 0.006
    assert wilson_stderr(0.0, 100) * 1.96 * 2 == pytest.approx(0.037, abs=5e-4)  # Wilson's 0/100 interval reaches 3.7%
    entry = fake_entry("naive", "default", 0, 0.3)  # a text score at 0.3 with error 0.01: not the binomial 0.046
    entry.update(r_stderr=[[0.0, 0.05], [0.01, 0.01]], r_init_stderr=[0.03, 0.03], r_n=[n, n])
    assert entry_score_stderr(entry, wilson=True)["acc"] == pytest.approx(math.sqrt(2) * 0.01 / 2)


def test_power_units_needed_separate_the_gap_with_80_percent_power_by_simulation():
    noise = PairNoise(v_units=0.03 ** 2, v_test=0.0, n=3)
    level = ALPHA / 15
    needed = noise.units_needed(0.05, level)
    assert noise.detectable(level, needed) <= 0.05 < noise.detectable(level, needed - 1)
    rng = np.random.default_rng(0)  # simulated paired differences: power at `needed` is about 80%, below it less
    for n, low, high in ((needed, 0.74, 0.92), (max(needed // 2, 2), 0.0, 0.6)):
        d = rng.normal(0.05, 0.03, (4000, n))
        stat = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
        power = float(np.mean(np.abs(stat) > t.ppf(1 - level / 2, n - 1)))
        assert low <= power <= high
        assert noise.power(0.05, level, n) == pytest.approx(power, abs=0.03)  # the power reached, as simulated
    for n in (2, 4, 7, 60):  # the detectable gap is the one with 80% power, not the shortcut's (75% at 7 units)
        assert noise.power(noise.detectable(level, n), level, n) == pytest.approx(POWER, abs=1e-6)
    assert noise.power(0.0, level, 7) == pytest.approx(level)  # no gap: the false positives' rate
    assert PairNoise(0.03 ** 2, 0.01 ** 2, 3).units_needed(0.03, level) is None  # the test set alone hides 3 points
    assert PairNoise(0.03 ** 2, 0.01 ** 2, 3).units_needed(0.2, level) < needed  # control: a large gap needs few


def _simulated(rng, k, n, spreads, order_sd=0.05):
    """k methods with equal means over n orders: a shared order effect and a method x order
    interaction whose spread differs by method (``spreads``)."""
    return rng.normal(0, order_sd, n)[None, :] + rng.normal(0, 1, (k, n)) * np.asarray(spreads)[:, None]


def _pooled_tukey_rejects(y, q: float) -> bool:
    """The procedure these tables used before: Tukey's HSD on the method + order residual
    (``q``: the studentized range's 95% quantile for the design)."""
    k, n = y.shape
    residual = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    df = (k - 1) * (n - 1)
    critical = q * math.sqrt((residual ** 2).sum() / df / n)
    means = y.mean(1)
    return any(abs(means[a] - means[b]) > critical for a, b in combinations(range(k), 2))


def test_groups_and_intervals_are_not_anti_conservative_under_interaction_and_unequal_spreads():
    """Type-I error over simulated leaderboards of 6 equal methods on 3 orders, one with 8x the
    spread of the others (Rotated Fashion-MNIST's residual SDs run 0.6 to 4.8 points)."""
    rng = np.random.default_rng(7)
    k, n, sims = 6, 3, 2000
    spreads = [0.006] * 5 + [0.048]
    false_groups = tukey = covered = 0
    q = studentized_range.ppf(1 - ALPHA, k, (k - 1) * (n - 1))
    for _ in range(sims):
        y = _simulated(rng, k, n, spreads)
        runs = {f"m{i}": {(f"o{u}", 0): (float(y[i, u]), None) for u in range(n)} for i in range(k)}
        groups = rank_groups(runs, "acc", True, describe=False)
        false_groups += any(pair["significant"] for pair in groups.pairs)
        tukey += _pooled_tukey_rejects(y, q)
        ci = interval([float(v) for v in y[5]])  # the noisy method's interval; its true mean over orders is 0
        covered += ci.low <= 0 <= ci.high
    mc = 2 * math.sqrt(ALPHA * (1 - ALPHA) / sims)
    assert false_groups / sims <= ALPHA + mc
    assert tukey / sims > ALPHA + 2 * mc  # control: the pooled procedure is anti-conservative here
    assert covered / sims >= 1 - ALPHA - mc


@pytest.mark.parametrize("groups, size", [(2, 3), (5, 5), (13, 5), (4, 12)])
def test_levene_from_its_definition_equals_scipys(groups, size):
    rng = np.random.default_rng(groups * size)
    values = [list(rng.normal(size=size) * rng.uniform(0.1, 3.0)) for _ in range(groups)]
    expected = levene(*values, center="mean")
    statistic, p_value = levene_mean_centred(values)
    assert statistic == pytest.approx(expected.statistic, rel=1e-12)
    assert p_value == pytest.approx(expected.pvalue, rel=1e-10)


@pytest.mark.parametrize("size", [2, 3, 5, 13])
def test_kendall_tau_b_and_competition_ranks_equal_scipys_with_and_without_ties(size):
    rng = np.random.default_rng(size)
    for levels in (3, 1000):  # many ties, almost none
        for _ in range(10):
            x, y = (list(rng.integers(0, levels, size).astype(float)) for _ in range(2))
            expected = kendalltau(x, y).statistic
            assert (math.isnan(expected) and math.isnan(kendall_tau_b(x, y))) or \
                kendall_tau_b(x, y) == pytest.approx(expected, abs=1e-12)
            assert competition_ranks(x) == [int(r) for r in rankdata(x, method="min")]


def test_levene_without_spread_within_groups_is_undefined_not_zero():
    assert all(math.isnan(v) for v in levene_mean_centred([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]))


def test_letters_share_a_letter_exactly_when_not_significantly_different():
    labels = ["a1", "a2", "a3", "a4"]
    # a1 differs from a3 and a4, a2 from a4: a1-a2, a2-a3, a3-a4 are the not-different pairs
    different = {frozenset(p) for p in (("a1", "a3"), ("a1", "a4"), ("a2", "a4"))}
    out = letters(labels, different)
    assert out == {"a1": "a", "a2": "ab", "a3": "bc", "a4": "c"}
    for x in labels:
        for y in labels:
            if x < y:
                assert bool(set(out[x]) & set(out[y])) == (frozenset((x, y)) not in different)


def with_stderr(entry: dict, se: float) -> dict:
    """``entry`` as a schema-2 run writes it: every R cell with test-set standard error ``se``."""
    entry["r_stderr"] = [[se] * len(row) for row in entry["r_matrix"]]
    entry["r_init_stderr"] = [se] * len(entry["r_init"])
    entry["r_n"] = [400] * len(entry["r_init"])
    entry["scores_stderr"] = entry_score_stderr(entry)
    entry["content_hash"] = E.content_hash(entry)
    return entry


def test_one_run_per_method_is_grouped_and_bounded_by_its_test_set_alone(tmp_path):
    for name, acc in (("replay", 0.80), ("ewc", 0.79), ("naive", 0.60)):
        E.write_entry(tmp_path, with_stderr(fake_entry(name, "default", 0, acc), 0.021))
    (table,) = build_tables(E.load_entries(tmp_path))
    se_acc = math.sqrt(2 * 0.021 ** 2) / 2  # ACC is the mean of R's last row of 2 cells
    for row in table.rows:
        assert row.stats["acc"].from_test_set and row.stats["acc"].half == pytest.approx(1.959964 * se_acc)
    assert table.groups.method == "test set" and table.groups.test_set_se == pytest.approx(se_acc)
    assert table.groups.letters == {"replay": "a", "ewc": "a", "naive": "b"}
    readme = build_readme(tmp_path)
    assert "80.0 ± 2.9‡" in readme and "Test-set noise included" in readme


def test_test_set_noise_widens_the_critical_difference_where_runs_recorded_it(tmp_path):
    entries = E.load_entries(board(tmp_path))
    without = build_tables(entries)[0].groups
    noisy = typed_entries([with_stderr(dict(e.document), 0.05) for e in entries])
    with_noise = build_tables(noisy)[0].groups
    assert with_noise.test_set_known and not without.test_set_known
    assert with_noise.critical[0] > without.critical[0]
    assert with_noise.letters == {"replay": "a", "ewc": "b", "lwf": "b", "naive": "b"}


def test_without_shared_runs_or_test_set_errors_no_groups_are_invented():
    runs = {"replay": {("default", 0): (0.8, None)}, "naive": {("reverse", 0): (0.5, None)}}
    assert rank_groups(runs, "acc", True).method is None
    runs = {"replay": {("default", 0): (0.8, None)}, "naive": {("default", 0): (0.5, None)}}
    groups = rank_groups(runs, "acc", True)
    assert groups.method is None and groups.letters == {} and "r_stderr" in groups.note


def build_readme(root) -> str:
    assert main(["leaderboard", "render", str(root)]) == 0
    return (root / "README.md").read_text()


def test_readme_and_compare_report_the_same_groups_intervals_and_power(tmp_path, capsys):
    root = board(tmp_path / "lb")
    readme = build_readme(root)
    assert "| Rank | Group | Strategy |" in readme
    assert "Holm's correction" in readme and "α = 0.05" in readme and "Critical difference" in readme
    assert "the order is the unit" in readme and "detected with 80% power" in readme
    assert "best first: a: replay" in readme and "Adjacent ties" in readme
    report = compare(E.load_entries(root))
    (bench,) = report["benchmarks"]
    assert bench["groups"]["letters"] == {"replay": "a", "ewc": "b", "lwf": "b", "naive": "b"}
    assert bench["groups"]["correction"] == "holm" and bench["groups"]["unit"] == "order"
    (table,) = build_tables(E.load_entries(root))
    for s in bench["strategies"]:
        stat = next(r for r in table.rows if r.label == s["label"]).stats["acc"]
        assert s["interval"]["half_width"] == stat.half and s["interval"]["units"] == 4
        assert s["group"] in readme.split(f"| {s['label']} |")[0].splitlines()[-1]  # the README row's Group cell
    pt = bench["paired_test"]
    assert pt["unit"] == "order" and pt["n_pairs"] == 4 and pt["power"]["level"] == pytest.approx(ALPHA / 6)
    markdown = comparison_markdown(report)
    assert "| Group | Strategy | Mean ± 95% CI |" in markdown and "| replay | naive |" in markdown
    assert "p (Holm)" in markdown and "Power: at the table's Holm level" in markdown
    out = tmp_path / "cmp.md"
    assert main(["compare", str(root), "--markdown", str(out), "--json", str(tmp_path / "cmp.json")]) == 0
    assert out.read_text() == markdown
    assert [sorted(g) for g in json.loads((tmp_path / "cmp.json").read_text())["benchmarks"][0]["groups"]["groups"]] \
        == [["replay"], ["ewc", "lwf", "naive"]]
