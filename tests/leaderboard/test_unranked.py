"""A suite can show a strategy without ranking it (``unranked``: a baseline that did not function
on its stream): the sentence changes no run's hash, the manifest keeps it, and every table built
from the folder puts that row below the ranked rows, in no rank and no rank group, with the
sentence beneath; a received folder's sentence is checked like the rest of ``suite.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clbench.errors import UserError
from clbench.leaderboard import entries as E
from clbench.leaderboard.suite import load_suite

from helpers import fake_entry, smoke, typed_entries, write_suite

REASON = "it learned the rule in 1 of its 16 pairs (docs), so no comparison is read against it"


def _marked(data: dict, reason: str = REASON) -> dict:
    """The suite with its first strategy (naive) marked unranked."""
    strategies = list(data["strategies"])
    strategies[0] = {"class_path": strategies[0], "unranked": reason}
    return {**data, "strategies": strategies}


def test_the_sentence_changes_no_hash_and_the_manifest_keeps_it(tmp_path):
    plain = load_suite(write_suite(tmp_path, smoke(), "plain.yaml"))
    marked = load_suite(write_suite(tmp_path, _marked(smoke()), "marked.yaml"))
    assert [r.hash for r in marked.runs] == [r.hash for r in plain.runs]
    runs = marked.manifest()["runs"]
    assert [r.get("unranked") for r in runs] == [REASON if r["strategy"] == "naive" else None for r in runs]
    assert all("unranked" not in r for r in plain.manifest()["runs"])  # the other manifests read as before


@pytest.mark.parametrize("reason", ["", "   ", "first line\nsecond line", "first line\rsecond line", "x" * 401])
def test_a_suite_refuses_a_sentence_that_is_not_one_line(tmp_path, reason):
    path = write_suite(tmp_path, _marked(smoke(), reason))
    with pytest.raises(UserError) as err:
        load_suite(path)
    assert "strategies[0]" in str(err.value) and "unranked" in str(err.value)


def _board(tmp_path: Path, marked: str | None, reason=REASON) -> Path:
    """A folder of two orders of naive (the higher ACC), joint and replay, whose suite.json marks
    ``marked`` unranked."""
    accs = {"naive": (0.95, 0.93), "joint": (0.80, 0.78), "replay": (0.60, 0.62)}
    out, runs = tmp_path / "board", []
    for strategy, values in accs.items():
        for order, acc in zip(("default", "reverse"), values):
            entry = fake_entry(strategy, order, 0, acc)
            E.write_entry(out, entry)
            run = {"hash": entry["config_hash"], "strategy": strategy, "order": order, "seed": 0}
            if strategy == marked:
                run["unranked"] = reason
            runs.append(run)
    (out / "suite.json").write_text(json.dumps({"name": "t", "source": "t.yaml", "runs": runs}))
    return out


def test_the_marked_row_is_shown_below_the_ranked_rows_in_no_rank_and_no_group(tmp_path):
    from clbench.leaderboard.manifest import manifest_hashes, manifest_unranked
    from clbench.leaderboard.table import build_tables

    def table(marked):
        root = _board(tmp_path / str(marked), marked)
        hashes = manifest_hashes(root)
        return build_tables(E.load_entries(root, hashes), hashes, unranked=manifest_unranked(root))[0]

    control = table(None)  # unmarked, naive's higher ACC ranks it first
    assert [(r.label, r.rank) for r in control.rows] == [("naive", 1), ("joint", 2), ("replay", 3)]
    assert "naive" in control.groups.letters
    marked = table("naive")
    assert [(r.label, r.rank, r.unranked) for r in marked.rows] == \
        [("joint", 1, None), ("replay", 2, None), ("naive", None, REASON)]
    assert "naive" not in marked.groups.letters and set(marked.groups.letters) == {"joint", "replay"}
    assert marked.rows[-1].stats["acc"].mean == pytest.approx(0.94)  # still shown, with its scores


def test_readme_page_terminal_and_api_say_why(tmp_path, capsys):
    import clbench
    from clbench.leaderboard.render import render
    from clbench.leaderboard.table import build_tables
    from clbench.leaderboard.terminal import print_tables

    root = _board(tmp_path, "naive")
    readme, index = render(root)
    text = readme.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "naive" in line]
    assert rows and rows[0].startswith("| — | — | naive |")
    note = f"Not ranked (shown below the ranked rows, in no rank group): naive: {REASON}."
    assert note in text and note in index.read_text()
    rows = clbench.load_leaderboard(root).table()
    assert [(r["strategy"], r["rank"], r["group"]) for r in rows][-1] == ("naive", None, None)
    from clbench.leaderboard.manifest import manifest_unranked
    print_tables(build_tables(E.load_entries(root), unranked=manifest_unranked(root)))
    assert "Not ranked" in " ".join(capsys.readouterr().out.split())


def test_compare_pairs_the_two_best_ranked_rows(tmp_path):
    import clbench

    result = clbench.compare(_board(tmp_path, "naive"))
    bench = result["benchmarks"][0]
    assert {bench["paired_test"]["a"], bench["paired_test"]["b"]} == {"joint", "replay"}
    assert [(s["label"], s["unranked"]) for s in bench["strategies"]][0] == ("naive", REASON)  # still listed
    assert [p["n_strategies"] for p in bench["rank_stability"]["pairs"]] == [2]  # naive is in no per-order ranking
    assert [s.get("rank_by_order") for s in bench["strategies"]] == \
        [None, {"default": 1, "reverse": 1}, {"default": 2, "reverse": 2}]


@pytest.mark.parametrize("reason", [7, "", "two\nlines", "two\rlines", "x" * 401])
def test_a_received_manifest_with_a_malformed_sentence_is_refused(tmp_path, reason):
    from clbench.leaderboard.manifest import read_manifest

    root = _board(tmp_path, "naive", reason)
    with pytest.raises(UserError) as err:
        read_manifest(root)
    assert "unranked" in str(err.value) and "suite.json" in str(err.value)


def test_committed_entries_are_typed_the_same_with_a_marked_row(tmp_path):
    """A marked row's entries are the folder's own: the mark lives in suite.json, never in an entry."""
    root = _board(tmp_path, "naive")
    docs = [json.loads(p.read_text()) for p in sorted((root / "entries").glob("*.json"))]
    assert all("unranked" not in json.dumps(d) for d in docs) and len(typed_entries(docs)) == 6


def test_a_reason_is_text_in_every_output_never_markup(tmp_path, capsys):
    """suite.json is received text: rich markup or Markdown in the reason is printed as written."""
    import clbench
    from clbench.leaderboard.compare import comparison_markdown, print_comparison
    from clbench.leaderboard.manifest import manifest_unranked
    from clbench.leaderboard.render import render
    from clbench.leaderboard.table import build_tables
    from clbench.leaderboard.terminal import print_tables

    reason = "[bold red]loud[/] and *starred* | piped"
    root = _board(tmp_path, "naive", reason)
    print_tables(build_tables(E.load_entries(root), unranked=manifest_unranked(root)))
    report = clbench.compare(root)
    print_comparison(report)
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("[bold red]loud[/]") == 2
    markdown = comparison_markdown(report) + render(root)[0].read_text()
    assert "*starred*" not in markdown and markdown.count(r"\*starred\*") == 2
    # a row's label is the entries' words (a config value of a received folder): text too
    tables = build_tables(E.load_entries(root), unranked=manifest_unranked(root))
    tables[0].rows[0].label = report["benchmarks"][0]["strategies"][0]["label"] = "[bold]bold[/] label"
    print_tables(tables)
    print_comparison(report)
    out = " ".join(capsys.readouterr().out.split())
    # as written in the table, the comparison's table and its not-ranked line (naive is compare's first); never styled
    assert out.count("[bold]bold[/] label") == 3 and " bold label" not in out
