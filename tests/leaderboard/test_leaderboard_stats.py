"""Which differences are real: intervals, rank groups and the critical difference on constructed
leaderboards whose effects are known (clbench.leaderboard.stats), in the tables, the README and
``clbench compare``."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import t

from clbench.cli.main import main
from clbench.leaderboard import entries as E
from clbench.leaderboard.compare import compare, comparison_markdown
from clbench.leaderboard.stats import letters, rank_groups
from clbench.leaderboard.table import build_tables
from clbench.metrics.stderr import entry_score_stderr
from helpers import fake_entry

BLOCKS = [(order, seed) for order in ("default", "reverse") for seed in (0, 1, 2)]
# A large block effect (an order or seed that is hard for every method) and a small residual:
# intervals over runs are wide, yet the pairing tells the methods apart.
BLOCK_EFFECT = [0.00, -0.10, 0.08, -0.05, 0.12, -0.04]
RESIDUAL = {"replay": [0.004, -0.003, 0.001, -0.002, 0.000, 0.001],
            "ewc": [-0.002, 0.003, -0.004, 0.001, 0.002, -0.001],
            "lwf": [0.003, -0.001, 0.002, -0.003, -0.002, 0.000],
            "naive": [-0.001, 0.002, 0.000, 0.003, -0.001, -0.002]}
# replay is 25 points better (a known large effect); ewc, lwf and naive are the same method (a null effect)
TRUE_MEAN = {"replay": 0.75, "ewc": 0.50, "lwf": 0.50, "naive": 0.50}


def board(tmp_path, means=TRUE_MEAN, residual=RESIDUAL):
    for name, mean in means.items():
        for (order, seed), block, noise in zip(BLOCKS, BLOCK_EFFECT, residual[name]):
            E.write_entry(tmp_path, fake_entry(name, order, seed, mean + block + noise))
    return tmp_path


def accs(entries, name):
    return [e["scores"]["acc"] for e in entries if e["strategy"]["name"] == name]


def test_a_large_effect_is_its_own_group_and_a_null_effect_shares_one(tmp_path):
    entries = E.load_entries(board(tmp_path))
    (table,) = build_tables(entries)
    groups = table.groups
    assert groups.method == "blocks" and groups.k == 4 and groups.n == 6 and groups.df == 15
    assert groups.letters == {"replay": "a", "ewc": "b", "lwf": "b", "naive": "b"}
    assert [sorted(g) for g in groups.groups] == [["replay"], ["ewc", "lwf", "naive"]]
    # the critical difference is Tukey's: q(0.95; 4, 15) * sqrt(MSE / 6), MSE from the residuals
    assert 0.002 < groups.critical[0] == groups.critical[1] < 0.02
    for row in table.rows:  # each interval is mean ± t(0.975; 5) sd / sqrt(6) of the row's own runs
        values = accs(entries, row.label)
        mean = sum(values) / 6
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 5)
        stat = row.stats["acc"]
        assert stat.n == 6 and stat.mean == pytest.approx(mean)
        assert stat.half == pytest.approx(t.ppf(0.975, 5) * sd / math.sqrt(6))
        assert stat.mean - stat.half < TRUE_MEAN[row.label] + sum(BLOCK_EFFECT) / 6 < stat.mean + stat.half
    # the block effect makes every interval wider than the null group's spread: pairing is what separates them
    assert all(row.stats["acc"].half > 0.05 for row in table.rows)


def test_groups_pool_the_residual_so_a_small_real_effect_is_found_and_a_smaller_one_is_not(tmp_path):
    means = {"replay": 0.75, "ewc": 0.52, "lwf": 0.50, "naive": 0.50}  # ewc now 2 points above the null pair
    (table,) = build_tables(E.load_entries(board(tmp_path, means)))
    assert table.groups.letters == {"replay": "a", "ewc": "b", "lwf": "c", "naive": "c"}


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
        E.write_entry(tmp_path, with_stderr(fake_entry(name, "default", 0, acc), 0.02))
    (table,) = build_tables(E.load_entries(tmp_path))
    se_acc = math.sqrt(2 * 0.02**2) / 2  # ACC is the mean of R's last row of 2 cells
    for row in table.rows:
        assert row.stats["acc"].from_test_set and row.stats["acc"].half == pytest.approx(1.959964 * se_acc)
    assert table.groups.method == "test set" and table.groups.test_set_se == pytest.approx(se_acc)
    assert table.groups.letters == {"replay": "a", "ewc": "a", "naive": "b"}
    README = build_readme(tmp_path)
    assert "80.0 ± 2.8‡" in README and "test-set noise included" in README


def test_test_set_noise_widens_the_critical_difference_where_runs_recorded_it(tmp_path):
    entries = E.load_entries(board(tmp_path))
    without = build_tables(entries)[0].groups
    noisy = [with_stderr(dict(e), 0.05) for e in entries]
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


def test_readme_and_compare_report_the_same_groups_and_intervals(tmp_path, capsys):
    root = board(tmp_path / "lb")
    readme = build_readme(root)
    assert "| Rank | Group | Strategy |" in readme
    assert "Tukey's HSD" in readme and "α = 0.05" in readme and "Critical difference" in readme
    assert "best first: a: replay" in readme
    report = compare(E.load_entries(root))
    (bench,) = report["benchmarks"]
    assert bench["groups"]["letters"] == {"replay": "a", "ewc": "b", "lwf": "b", "naive": "b"}
    assert bench["groups"]["test"].startswith("Tukey") and bench["groups"]["alpha"] == 0.05
    (table,) = build_tables(E.load_entries(root))
    for s in bench["strategies"]:
        stat = next(r for r in table.rows if r.label == s["label"]).stats["acc"]
        assert s["interval"]["half_width"] == stat.half and s["interval"]["runs"] == 6
        assert s["group"] in readme.split(f"| {s['label']} |")[0].splitlines()[-1]  # the README row's Group cell
    markdown = comparison_markdown(report)
    assert "| Group | Strategy | Mean ± 95% CI |" in markdown and "| replay | naive |" in markdown
    out = tmp_path / "cmp.md"
    assert main(["compare", str(root), "--markdown", str(out), "--json", str(tmp_path / "cmp.json")]) == 0
    assert out.read_text() == markdown
    assert [sorted(g) for g in json.loads((tmp_path / "cmp.json").read_text())["benchmarks"][0]["groups"]["groups"]] \
        == [["replay"], ["ewc", "lwf", "naive"]]
    capsys.readouterr()
    assert main(["compare", str(root), "--markdown", "-"]) == 0
    assert capsys.readouterr().out == markdown
