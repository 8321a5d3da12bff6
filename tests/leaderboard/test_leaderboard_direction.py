"""Leaderboards of lower-is-better R matrices (errors): ranking, arrows, compare, and mixed directions refused."""

from __future__ import annotations

import json
import math
import re

import pytest
from scipy.stats import t

from clbench.cli.main import main
from clbench.errors import UserError
from clbench.leaderboard import entries as E
from clbench.leaderboard.compare import compare, print_comparison
from clbench.leaderboard.table import build_tables
from clbench.leaderboard.terminal import console_for_tables
from helpers import fake_entry, typed_entries

# final mean error per strategy and order (default, reverse, perm1); lower is better
ERR = {"naive": [0.40, 0.50, 0.45], "replay": [0.20, 0.30, 0.25], "ewc": [0.35, 0.25, 0.30]}
ORDERS = ["default", "reverse", "perm1"]


def error_entries() -> list[dict]:
    return [fake_entry(s, order, seed, ERR[s][k] + 0.01 * seed, higher_is_better=False)
            for s in ERR for k, order in enumerate(ORDERS) for seed in (0, 1)]


def write_board(root, entries) -> None:
    for entry in entries:
        E.write_entry(root, entry)


def _header(readme: str) -> list[str]:
    line = next(line for line in readme.splitlines() if line.startswith("| Rank"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_errors_rank_lowest_first_and_columns_say_their_direction(tmp_path):
    root = tmp_path / "lb"
    write_board(root, error_entries())
    assert main(["leaderboard", "render", str(root)]) == 0
    readme = (root / "README.md").read_text()
    header = _header(readme)
    assert header[4:9] == ["ACC ↓", "AIA ↓", "BWT ↑", "FWT ↑", "Forgetting ↓"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in readme.splitlines()
            if line.startswith("| ") and not line.startswith("| Rank")]
    assert [(r[0], r[2]) for r in rows] == [("1", "replay"), ("2", "ewc"), ("3", "naive")]
    assert "R: err (lower is better)" in readme and "R holds errors (lower is better)" in readme
    page = (root / "index.html").read_text()
    assert re.search(r'data-key="acc"[^>]*data-first="asc"[^>]*>ACC ↓<', page)
    assert re.search(r'data-key="bwt"[^>]*data-first="desc"[^>]*>BWT ↑<', page)
    assert re.search(r'data-key="forgetting"[^>]*data-first="asc"', page)


def test_compare_of_errors_takes_the_highest_error_as_the_worst_order(tmp_path, capsys):
    entries = typed_entries(error_entries())
    report = compare(entries, a="replay", b="naive")
    assert report["higher_is_better"] is False
    (bench,) = report["benchmarks"]
    assert bench["higher_is_better"] is False
    assert [s["label"] for s in bench["strategies"]] == ["replay", "ewc", "naive"]  # best (lowest) first
    ewc = next(s for s in bench["strategies"] if s["label"] == "ewc")
    assert (ewc["worst_order"], ewc["best_order"]) == ("default", "reverse")
    assert bench["strategies"][0]["rank_by_order"] == {"default": 1, "reverse": 2, "perm1": 1}  # ewc 0.25 < 0.30
    pt = bench["paired_test"]
    assert pt["mean_difference"] == pytest.approx(-0.2)
    assert (pt["n_pairs"], pt["a_better"], pt["b_better"]) == (3, 3, 0)  # replay's error is lower in every order
    # forgetting of an error matrix: still lower is better
    assert compare(entries, metric="forgetting")["higher_is_better"] is False
    assert compare(entries, metric="bwt")["higher_is_better"] is True

    print_comparison(report, console_for_tables())
    printed = capsys.readouterr().out
    assert "acc ↓ (%) per task order (lower is better)" in printed
    assert "replay better in 3, naive in 0 of 3" in printed

    root = tmp_path / "lb"
    write_board(root, [e.document for e in entries])
    out = tmp_path / "cmp.json"
    assert main(["compare", str(root), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["benchmarks"][0]["strategies"][0]["label"] == "replay"


def test_an_error_that_is_no_percentage_is_shown_in_its_own_unit(tmp_path, capsys):
    """A squared error of 2.34 is not "234 %": an R whose metric recorded ``percent: false`` shows
    its scores, intervals, critical difference and comparison as plain numbers (the MoE-theory
    benchmark's MSE); one that recorded no unit keeps the percentages (the test above)."""
    entries = [fake_entry(s, order, seed, 4 * ERR[s][k] + 0.04 * seed, higher_is_better=False, percent=False)
               for s in ERR for k, order in enumerate(ORDERS) for seed in (0, 1)]
    root = tmp_path / "lb"
    write_board(root, entries)
    assert main(["leaderboard", "render", str(root)]) == 0
    readme = (root / "README.md").read_text()
    assert _header(readme)[4:9] == ["ACC ↓", "AIA ↓", "BWT ↑", "FWT ↑", "Forgetting ↓"]
    replay = next(line for line in readme.splitlines() if line.startswith("| 1 "))
    assert "| 1.02 ± " in replay  # replay's mean final error over its order means 0.82, 1.22, 1.02
    assert "102.0" not in readme
    assert "R is not a percentage (err)" in readme
    assert "Scores are percentages, except in a table whose R is not one" in readme
    design = next(line for line in readme.splitlines() if line.startswith("Rank groups on ACC:"))
    assert "Critical difference" in design and "points" not in design
    page = (root / "index.html").read_text()
    half = t.ppf(0.975, 2) * 0.2 / math.sqrt(3)  # the order means' sd is 0.2: 1.02 ± 0.50, not in percent
    assert f"95% interval [{1.02 - half:.2f}, {1.02 + half:.2f}]" in page  # the ACC cell's tooltip

    report = compare(typed_entries(entries), a="replay", b="naive")
    assert (report["percent"], report["directed"]) == (False, True)
    print_comparison(report, console_for_tables())
    printed = capsys.readouterr().out
    assert "acc ↓ per task order (lower is better)" in printed and "(%)" not in printed
    assert "mean difference -0.80 (lower is better)" in printed and "points" not in printed


def test_accuracy_tables_carry_no_arrows(tmp_path):
    root = tmp_path / "lb"
    write_board(root, [fake_entry(s, o, 0, 1 - ERR[s][k]) for s in ERR for k, o in enumerate(ORDERS)])
    assert main(["leaderboard", "render", str(root)]) == 0
    readme = (root / "README.md").read_text()
    assert _header(readme)[4:9] == ["ACC", "AIA", "BWT", "FWT", "Forgetting"]
    assert "↑" not in readme and "↓" not in readme and "R holds errors" not in readme


def test_mixed_directions_in_one_benchmark_are_refused(tmp_path, capsys):
    mixed = [fake_entry("naive", "default", 0, 0.4, higher_is_better=False),
             fake_entry("replay", "default", 0, 0.8)]
    with pytest.raises(UserError, match="mix directions for score 'acc'"):
        build_tables(typed_entries(mixed))
    root = tmp_path / "lb"
    write_board(root, mixed)
    for command in (["leaderboard", "render", str(root)], ["compare", str(root)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "mix directions" in err
        assert all(f"{e['config_hash']}.json" in err for e in mixed)
    assert not (root / "README.md").exists()
    # the same directions on different benchmarks are separate tables, each in its own direction
    apart = [fake_entry("naive", "default", 0, 0.4, higher_is_better=False),
             fake_entry("naive", "default", 0, 0.8, benchmark="digits-dirichlet")]
    tables = {t.name: t for t in build_tables(typed_entries(apart))}
    assert tables["digits-domains"].higher["acc"] is False and tables["digits-dirichlet"].higher["acc"] is True


@pytest.mark.parametrize("r_metric", [
    {"names": ["err", "err"], "higher_is_better": "no"},
    {"names": ["err"], "higher_is_better": False},           # one name per test column
    {"higher_is_better": False},
    "lower",
])
def test_malformed_r_metric_is_refused(tmp_path, r_metric):
    entry = fake_entry("naive", "default", 0, 0.4, higher_is_better=False)
    entry["r_metric"] = r_metric
    entry["content_hash"] = E.content_hash(entry)
    path = E.write_entry(tmp_path, entry)
    # refused as the wrong type where the schema sees it, else by the re-scoring (clbench.leaderboard.rescore)
    with pytest.raises(UserError, match=r"malformed r_metric|r_metric(\.higher_is_better)?: input should be") as info:
        E.read_entry(path)
    assert str(path) in info.value.one_line()


def test_an_error_entry_with_scores_of_the_wrong_direction_is_refused(tmp_path):
    """Scores computed as if the errors were accuracies do not match the entry's own r_metric."""
    from clbench.metrics import cl_scores

    entry = fake_entry("naive", "default", 0, 0.4, higher_is_better=False)
    entry["scores"] = cl_scores(entry["r_matrix"], entry["r_init"])  # higher-is-better formulas
    entry["content_hash"] = E.content_hash(entry)
    path = E.write_entry(tmp_path, entry)
    with pytest.raises(UserError, match="score 'bwt' is .* but the entry's matrices give"):
        E.read_entry(path)
