"""``clbench compare``: per-order scores, worst order, Kendall's tau across orders, paired tests."""

from __future__ import annotations

import math

import json
from itertools import combinations
from pathlib import Path

import pytest
from helpers import fake_entry, typed_entries
from scipy.stats import kendalltau, ttest_rel, wilcoxon

from clbench.cli.main import main
from clbench.config.load import order_label
from clbench.errors import UserError
from clbench.leaderboard import entries as E
from clbench.leaderboard.compare import MIN_PAIRS, compare
from clbench.leaderboard.suite import load_suite

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "leaderboard"
ORDERS = ["default", "reverse", {"permutation": 1}]


def brute_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-a from concordant and discordant pairs (no ties in these inputs)."""
    pairs = list(combinations(range(len(x)), 2))
    score = sum((x[i] - x[j]) * (y[i] - y[j]) > 0 for i, j in pairs) - sum(
        (x[i] - x[j]) * (y[i] - y[j]) < 0 for i, j in pairs)
    return score / len(pairs)


# acc[strategy][order index][seed]
ACC = {
    "naive": [[0.40, 0.42], [0.60, 0.58], [0.45, 0.47]],
    "replay": [[0.70, 0.72], [0.55, 0.57], [0.75, 0.71]],
    "ewc": [[0.50, 0.52], [0.65, 0.61], [0.50, 0.54]],
    "joint": [[0.90, 0.91], [0.89, 0.90], [0.92, 0.90]],
}


@pytest.fixture
def synthetic():
    entries = [fake_entry(s, order, seed, ACC[s][k][seed]) for s in ACC for k, order in enumerate(ORDERS)
               for seed in (0, 1)]
    assert all(e["scores"]["forgetting"] == pytest.approx(1 - e["scores"]["acc"]) for e in entries)
    return typed_entries(entries)


def test_per_order_worst_order_and_range(synthetic):
    report = compare(synthetic)
    (bench,) = report["benchmarks"]
    assert bench["orders"] == ["default", "reverse", "perm1"]
    rows = {s["label"]: s for s in bench["strategies"]}
    for name, per_order in ACC.items():
        means = {order_label(o): sum(v) / 2 for o, v in zip(ORDERS, per_order)}
        row = rows[name]
        assert row["per_order"] == pytest.approx(means)
        assert row["mean"] == pytest.approx(sum(means.values()) / 3)
        worst = min(means, key=means.get)
        assert row["worst_order"] == worst and row["worst"] == pytest.approx(means[worst])
        assert row["range"] == pytest.approx(max(means.values()) - min(means.values()))
        assert row["n_runs"] == 6
    assert [s["label"] for s in bench["strategies"]][0] == "joint"  # sorted by mean, best first


def test_lower_is_better_scores_flip_the_worst_order(synthetic):
    (bench,) = compare(synthetic, metric="forgetting")["benchmarks"]
    naive = next(s for s in bench["strategies"] if s["label"] == "naive")
    assert naive["worst_order"] == "default"  # lowest accuracy = most forgetting here
    assert bench["strategies"][0]["label"] == "joint"  # least forgetting ranks first


def test_kendall_tau_between_per_order_rankings(synthetic):
    (bench,) = compare(synthetic)["benchmarks"]
    names = list(ACC)
    per_order = {o: [sum(ACC[s][k]) / 2 for s in names] for k, o in enumerate(["default", "reverse", "perm1"])}
    expected = [brute_tau(per_order[a], per_order[b]) for a, b in combinations(per_order, 2)]
    rs = bench["rank_stability"]
    assert [p["orders"] for p in rs["pairs"]] == [["default", "reverse"], ["default", "perm1"], ["reverse", "perm1"]]
    assert [p["tau"] for p in rs["pairs"]] == pytest.approx(expected)
    assert rs["kendall_tau_mean"] == pytest.approx(sum(expected) / 3)
    assert rs["kendall_tau_min"] == pytest.approx(min(expected))
    ranks = {s["label"]: s["rank_by_order"] for s in bench["strategies"]}
    assert ranks["joint"] == {"default": 1, "reverse": 1, "perm1": 1}
    assert ranks["naive"]["default"] == 4 and ranks["naive"]["reverse"] == 3 and ranks["replay"]["reverse"] == 4


def test_paired_test_pairs_the_orders_each_the_mean_of_its_seeds(synthetic):
    (bench,) = compare(synthetic, a="replay", b="naive")["benchmarks"]
    pt = bench["paired_test"]
    a = [sum(ACC["replay"][k]) / 2 for k in range(3)]  # the order is the unit: its two seeds averaged
    b = [sum(ACC["naive"][k]) / 2 for k in range(3)]
    # pairs are listed sorted by order label: default, perm1, reverse
    by_unit = {p["order"]: (p["a"], p["b"]) for p in pt["pairs"]}
    assert pt["unit"] == "order" and pt["n_pairs"] == 3 >= MIN_PAIRS and len(by_unit) == 3
    assert by_unit["reverse"] == pytest.approx((a[1], b[1]))
    assert pt["mean_difference"] == pytest.approx(sum(x - y for x, y in zip(a, b)) / 3)
    assert pt["t_test"]["p_value"] == pytest.approx(ttest_rel(a, b).pvalue)
    assert pt["wilcoxon"]["p_value"] == pytest.approx(wilcoxon(a, b).pvalue)
    assert pt["a_better"] == sum(x > y for x, y in zip(a, b))
    power = pt["power"]  # at the table's Holm level over all its pairs
    assert power["level"] == pytest.approx(0.05 / (len(bench["strategies"]) * (len(bench["strategies"]) - 1) / 2))
    assert power["detectable"] > 0 and (power["units_needed"] is None or power["units_needed"] >= 2)


def test_default_paired_test_is_between_the_two_best(synthetic):
    (bench,) = compare(synthetic)["benchmarks"]
    assert (bench["paired_test"]["a"], bench["paired_test"]["b"]) == ("joint", "replay")


def test_too_few_pairs_says_so():
    runs = [("naive", "default", 0.4), ("naive", "reverse", 0.5), ("replay", "default", 0.6), ("replay", "reverse", 0.7)]
    few = typed_entries([fake_entry(s, o, 0, v) for s, o, v in runs])
    (bench,) = compare(few)["benchmarks"]
    assert bench["paired_test"]["n_pairs"] == 2 and "not enough paired orders" in bench["paired_test"]["note"]
    assert bench["rank_stability"]["kendall_tau_mean"] == pytest.approx(1.0)


def test_bad_requests_are_user_errors(synthetic):
    with pytest.raises(UserError, match="no score 'forgeting'.*did you mean 'forgetting'"):
        compare(synthetic, metric="forgeting")
    with pytest.raises(UserError, match="no benchmark 'cifar'"):
        compare(synthetic, benchmark="cifar")
    with pytest.raises(UserError, match="no strategy 'gem'"):
        compare(synthetic, a="gem", b="naive")
    with pytest.raises(UserError, match="give both --a and --b"):
        compare(synthetic, a="replay")


# -- the committed quickstart leaderboard -------------------------------------------------------
needs_committed = pytest.mark.skipif(not (COMMITTED / "entries").is_dir(),
                                     reason="no committed leaderboard/ (generate it with 'clbench leaderboard run')")


@needs_committed
def test_committed_leaderboard_is_the_quickstart_suite_and_shows_the_expected_effects():
    suite = load_suite(REPO / "configs" / "suites" / "quickstart.yaml")
    entries = E.load_entries(COMMITTED)  # every committed entry verifies
    assert sorted(e.config_hash for e in entries) == sorted(r.hash for r in suite.runs), \
        "leaderboard/ is stale: regenerate it with 'clbench leaderboard run'"
    assert all(e.status == "ok" for e in entries)

    def mean(strategy, score, bench="digits-domains"):
        values = [e.scores[score] for e in entries if e.strategy.name == strategy and e.benchmark.name == bench]
        return sum(values) / len(values)

    assert mean("naive", "bwt") < -0.1  # clear forgetting
    accs = {s: mean(s, "acc") for s in ("naive", "joint", "replay", "ewc", "lwf", "agem")}
    assert max(accs, key=accs.get) == "joint"
    assert accs["replay"] > accs["naive"]


@needs_committed
def test_compare_on_the_committed_leaderboard_matches_its_entries(tmp_path, capsys):
    out = tmp_path / "compare.json"
    assert main(["compare", str(COMMITTED), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert "Kendall's tau" in printed
    entries = E.load_entries(COMMITTED)
    assert {b["benchmark"] for b in report["benchmarks"]} == {"digits-domains", "digits-dirichlet"}
    for bench in report["benchmarks"]:
        mine = [e for e in entries if e.benchmark.name == bench["benchmark"]]
        assert bench["orders"] == ["default", "reverse", "perm1"]
        for s in bench["strategies"]:
            for order, value in s["per_order"].items():
                (entry,) = [e for e in mine if e.strategy.name == s["label"] and e.order_label == order]
                assert value == entry.scores["acc"]
                assert f"{100 * value:.1f}" in printed
        labels = [s["label"] for s in bench["strategies"]]
        vectors = {o: [next(s for s in bench["strategies"] if s["label"] == lab)["per_order"][o] for lab in labels]
                   for o in bench["orders"]}
        taus = [kendalltau(vectors[a], vectors[b]).statistic for a, b in combinations(bench["orders"], 2)]
        assert bench["rank_stability"]["kendall_tau_mean"] == pytest.approx(sum(taus) / len(taus))
        assert -1.0 <= bench["rank_stability"]["kendall_tau_mean"] <= 1.0


def test_cli_errors_are_one_line(tmp_path, capsys, synthetic):
    root = tmp_path / "lb"
    for entry in synthetic:
        E.write_entry(root, entry.document)
    assert main(["compare", str(root), "--metric", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--metric" in err
    assert main(["compare", str(root), "--benchmark", "digits-domains", "--a", "ewc", "--b", "naive"]) == 0
    assert "paired test ewc vs naive on 3 orders" in capsys.readouterr().out
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert main(["compare", str(root), "--a", "naive", "--b", "naive", "--json", str(tmp_path / "c.json")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "clbench: error: --b: --a and --b both name 'naive': a paired test compares two different strategies "
        "(give two different strategies, or leave --a/--b out for the two best)"]
    assert not (tmp_path / "c.json").exists() and {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


@pytest.mark.skipif(not (REPO / "leaderboards" / "trace-mini-moe" / "entries").is_dir(),
                    reason="no committed trace-mini-moe leaderboard")
def test_n_eff_is_compared_as_a_plain_number_without_a_direction(capsys):
    root = REPO / "leaderboards" / "trace-mini-moe"
    assert main(["compare", str(root), "--metric", "n_eff"]) == 0
    out = capsys.readouterr().out
    own_prompts = [e for e in E.load_entries(root) if "template" not in e.document["benchmark"]["init_args"]]
    values = [e.scores["n_eff"] for e in own_prompts if e.strategy.name == "mh_moe"]
    assert len(values) == 4
    assert f"{sum(values) / len(values):.2f}" in out and "(%)" not in out
    assert "no better direction" in out and "better in" not in out


# -- planning: the orders a gap needs, and their cost ------------------------------------------
PLAN_ORDERS = ["default", "reverse", {"permutation": 1}, {"permutation": 2}]
PLAN_ACC = {"replay": [0.80, 0.70, 0.75, 0.78], "naive": [0.70, 0.72, 0.66, 0.74]}


def _plan_entries(seconds: dict[str, float], gpu_orders: tuple[int, ...] = ()) -> list:
    entries = []
    for strategy, values in PLAN_ACC.items():
        for k, (order, acc) in enumerate(zip(PLAN_ORDERS, values)):
            entry = fake_entry(strategy, order, 0, acc)
            entry["compute"]["wall_seconds"] = seconds[strategy] / (10 if k in gpu_orders else 1)
            entry["env"].update({"cpu": {"model": "Test CPU", "isa": "AVX2"}, "torch_threads": 2})
            if k in gpu_orders:
                entry["env"].update({"cuda": "12.8", "device": "Test GPU"})
            entries.append(entry)
    return typed_entries(entries)


def test_a_plan_gives_the_orders_a_gap_needs_and_what_they_cost_where_the_entries_ran():
    """The orders are PairNoise's answer for the observed gap at α = 0.05 and at the table's Holm
    level; an order costs both methods' recorded wall time in it, averaged over the orders run;
    a larger planned gap needs fewer orders; a GPU's cost comes only from entries made on one."""
    from clbench.leaderboard.compare import comparison_markdown
    from clbench.leaderboard.notes import plan_text
    from clbench.leaderboard.power import POWER, PairNoise

    diffs = [a - b for a, b in zip(PLAN_ACC["replay"], PLAN_ACC["naive"])]
    noise = PairNoise.of(diffs, 0.0)
    cpu_only = compare(_plan_entries({"replay": 600.0, "naive": 1200.0}), a="replay", b="naive", planned=True)
    plan = cpu_only["benchmarks"][0]["plan"]
    needed = noise.units_needed(sum(diffs) / 4, 0.05)
    assert plan["orders_needed"]["planned"] == needed > 4 and plan["orders_run"] == 4
    assert plan["orders_needed"]["holm"] == noise.units_needed(sum(diffs) / 4, plan["levels"]["holm"]) >= needed
    assert plan["power_reached"]["holm"] <= plan["power_reached"]["planned"] < POWER  # 4 orders: short of the plan
    tasks = len(_plan_entries({"replay": 1.0, "naive": 1.0})[0].experiences)
    assert plan["orders_possible"] == math.factorial(tasks) < needed  # more orders than the stream has
    assert f"(more than the {math.factorial(tasks)} orders the stream's tasks have)" in plan_text(plan, str)
    pasted = comparison_markdown(cpu_only)  # the plan goes into the Markdown to paste too
    assert "Plan (replay vs naive, 80% power)" in pasted and "were run, which detect it with" in pasted
    cost = plan["cost_here"]
    assert cost["hours_per_order"] == pytest.approx(0.5) and cost["machines"] == ["Test CPU, 2 torch threads"]
    assert cost["hours"]["planned"] == pytest.approx(needed * 0.5)
    assert cost["more_hours"]["planned"] == pytest.approx((needed - 4) * 0.5)
    assert plan["cost_gpu"] is None
    wider = compare(_plan_entries({"replay": 600.0, "naive": 1200.0}), a="replay", b="naive", planned=True,
                    gap=20.0)["benchmarks"][0]["plan"]
    assert wider["gap"] == pytest.approx(0.20) and wider["orders_needed"]["planned"] < needed
    assert wider["power_reached"]["planned"] > plan["power_reached"]["planned"]
    mixed = compare(_plan_entries({"replay": 600.0, "naive": 1200.0}, gpu_orders=(2, 3)), a="replay", b="naive",
                    planned=True)["benchmarks"][0]["plan"]
    assert mixed["cost_gpu"]["hours_per_order"] == pytest.approx(0.05) and mixed["cost_gpu"]["machines"] == ["Test GPU"]
    assert mixed["cost_here"]["hours_per_order"] == pytest.approx(0.5)


def test_gap_without_plan_is_one_line(capsys):
    assert main(["compare", "leaderboard", "--gap", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "clbench: error: --gap: --gap is the difference a plan is made for (add --plan)"


def test_an_order_given_as_names_is_spelled_out_beside_its_hashed_label(tmp_path, capsys):
    listed = ["b", "a"]
    accs = {"replay": (0.8, 0.7), "naive": (0.6, 0.5)}
    entries = typed_entries([fake_entry(s, order, 0, acc) for s in accs
                             for order, acc in zip(("default", listed), accs[s])])
    label = order_label(listed)
    assert label.startswith("custom:")
    report = compare(entries)
    (bench,) = report["benchmarks"]
    assert bench["orders"] == ["default", label] and bench["spelled_orders"] == {label: listed}
    root = tmp_path / "lb"
    for entry in entries:
        E.write_entry(root, entry.document)
    assert main(["compare", str(root)]) == 0
    assert f"orders: {label} = b > a" in capsys.readouterr().out
    assert main(["compare", str(root), "--markdown", "-"]) == 0
    assert f"Orders: {label} = b > a." in capsys.readouterr().out
