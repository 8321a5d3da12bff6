"""Every leaderboard fragment of the documents is what the committed entries give, and the
fragments' command writes, checks and refuses as it says (``clbench.leaderboard.doc_tables``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clbench.leaderboard import doc_tables
from clbench.leaderboard.doc_tables import find_fragments, main, regenerate, run, split_list
from clbench.leaderboard.cell_text import fmt
from clbench.leaderboard.markdown import md_text

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
GROW = "leaderboards/grow trace-mini"  # a small committed leaderboard: 4 rows, 2 orders


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_document_fragments_are_what_the_entries_give(path, boards):
    name = str(path.relative_to(ROOT))
    _, reports = regenerate(path.read_text(encoding="utf-8"), name, boards)
    assert not reports, ("\n\n".join(reports) + f"\n\nrewrite them: python -m clbench.leaderboard.doc_tables {name}")


def test_the_documents_quote_leaderboards_through_fragments():
    quoting = [p.name for p in DOCUMENTS if find_fragments(p.read_text(encoding="utf-8").splitlines(), p.name)]
    assert {"datasets.md", "language-models.md", "moe-vit.md", "strategies.md"} <= set(quoting)


@pytest.fixture(autouse=True)
def shared(boards, monkeypatch):
    """The command reads the leaderboards these tests share, once (as it would read them once)."""
    monkeypatch.setattr(doc_tables, "Leaderboards", lambda root: boards)


def _document(tmp_path, body: str) -> Path:
    path = tmp_path / "doc.md"
    path.write_text(f"# A document\n\nSome text.\n\n{body}\nMore text.\n", encoding="utf-8")
    return path


def test_a_fragment_is_written_from_the_entries_and_then_checks(tmp_path, boards, capsys):
    path = _document(tmp_path, f"<!-- leaderboard-table: {GROW} columns=acc,bwt rows=seq_lora,seq_ft -->\n"
                                "stale text\n<!-- /leaderboard-table -->\n")
    assert run([str(path)], check=True, root=ROOT) == 1
    assert run([str(path)], check=False, root=ROOT) == 0
    text = path.read_text(encoding="utf-8")
    table = boards.table(*GROW.split(), "test")
    rows = {row.label: row for row in table.rows}
    assert "stale text" not in text and text.startswith("# A document\n") and text.endswith("\nMore text.\n")
    assert "| Rank | Group | Strategy | Runs | OP (TRACE) | BWT |\n" in text
    for label in ("seq_ft", "seq_lora"):  # the table's order, the README's cells
        row = rows[label]
        cells = [fmt(row.stats[s], score=table.score(s)) for s in ("acc", "bwt")]
        assert f"| {row.rank} | {table.groups.letters[label]} | {label} | 2 | {cells[0]} | {cells[1]} |" in text
    assert text.index("| seq_ft |") < text.index("| seq_lora |")
    assert "grow (variant" not in text
    capsys.readouterr()
    assert main(["--check", str(path), "--root", str(ROOT)]) == 0
    assert capsys.readouterr().out == ""


def test_check_fails_on_a_changed_cell_and_says_where(tmp_path, capsys):
    path = _document(tmp_path, f"<!-- leaderboard-orders: {GROW} columns=acc -->\n<!-- /leaderboard-orders -->\n")
    assert main([str(path), "--root", str(ROOT)]) == 0
    text = path.read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if line.startswith("| seq_lora |"))
    changed = line.replace(line.split(" | ")[1], "99.9", 1)
    path.write_text(text.replace(line, changed), encoding="utf-8")
    capsys.readouterr()
    assert main(["--check", str(path), "--root", str(ROOT)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:5: <!-- leaderboard-orders: {GROW} columns=acc --> differs from the entries" in out
    assert f"-{changed}\n+{line}\n" in out
    assert path.read_text(encoding="utf-8") == text.replace(line, changed)  # --check writes nothing


def test_a_paired_fragment_is_each_difference_per_order(tmp_path, boards):
    path = _document(tmp_path, f"<!-- leaderboard-paired: {GROW} a=seq_ft b=seq_lora columns=bwt -->\n"
                                "<!-- /leaderboard-paired -->\n")
    run([str(path)], check=False, root=ROOT)
    rows = {row.label: row for row in boards.table(*GROW.split(), "test").rows}
    by_order = {label: {e.order_label: e.scores["bwt"] for e in rows[label].ok} for label in rows}
    line = next(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("| seq_ft − "))
    cells = line.split(" | ")
    assert cells[:2] == ["| seq_ft − seq_lora", "BWT"]
    assert [float(c) for c in cells[2:4]] == pytest.approx(
        [100 * (by_order["seq_ft"][o] - by_order["seq_lora"][o]) for o in ("standard", "order1")], abs=0.051)
    assert cells[-1] in ("holds 0 |", "above 0 |", "below 0 |")


SHORT = "leaderboards/trace-mini-smollm2-short trace-mini"  # 4 orders: enough for a paired test


def test_a_summary_fragment_is_the_pair_over_its_orders_and_the_gap_it_can_detect(tmp_path, boards):
    """``summary``: one line per pair and score in place of a column per order; the gap detected
    with 80% power includes the test sets' noise, so it is wider than the interval's half-width."""
    path = _document(tmp_path, f"<!-- leaderboard-paired: {SHORT} a=mh_moe b=seq_lora columns=bwt,acc summary -->\n"
                                "<!-- /leaderboard-paired -->\n")
    run([str(path)], check=False, root=ROOT)
    rows = {row.label: row for row in boards.table(*SHORT.split(), "test").rows}
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("| mh_moe − ")]
    assert [line.split(" | ")[1] for line in lines] == ["BWT", "OP (TRACE)"]
    diffs = [e.scores["bwt"] - f.scores["bwt"] for e in rows["mh_moe"].ok for f in rows["seq_lora"].ok
             if e.order_label == f.order_label]
    _, _, n, above, mean, verdict, detected = lines[0].rstrip(" |").split(" | ")
    assert (int(n), int(above)) == (4, sum(d > 0 for d in diffs))
    centre, half = (float(x) for x in mean.split(" ± "))
    assert centre == pytest.approx(100 * sum(diffs) / 4, abs=0.051)
    assert verdict == ("holds 0" if centre - half <= 0 <= centre + half else "above 0" if centre > 0 else "below 0")
    assert float(detected) > half


def _counts(tmp_path, floor: str) -> dict[str, list[str]]:
    path = _document(tmp_path, f"<!-- leaderboard-learned: {SHORT} floor={floor} counts -->\n"
                                "<!-- /leaderboard-learned -->\n")
    run([str(path)], check=False, root=ROOT)
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("| ")][1:]
    return {line.split(" | ")[0][2:]: line.rstrip(" |").split(" | ")[1:] for line in lines}


def test_a_learned_fragment_counts_the_diagonals_that_clear_the_untrained_score_and_the_floor(tmp_path, boards):
    """With a floor at the untrained score (0 here) a diagonal clears the floor at least wherever it
    clears the untrained score; with a floor at 100% none does; the counts are out of every run's tasks."""
    rows = {md_text(row.label): row for row in boards.table(*SHORT.split(), "test").rows}
    at_zero = _counts(tmp_path, "C-STANCE:0,FOMC:0,ScienceQA:0,NumGLUE-cm:0")
    at_top = _counts(tmp_path, "C-STANCE:100,FOMC:100,ScienceQA:100,NumGLUE-cm:100")
    assert set(at_zero) == set(rows) and any(not u.startswith("16 of 16") for u, _ in at_zero.values())
    for label, (untrained, floor) in at_zero.items():
        total = 4 * len(rows[label].ok)
        assert untrained.split(" (")[0].endswith(f"of {total}") and floor.split(" (")[0].endswith(f"of {total}")
        assert int(floor.split(" of ")[0]) >= int(untrained.split(" of ")[0])
        assert at_top[label][1].startswith(f"0 of {total} (C-STANCE 0/4, FOMC 0/4")


def test_a_learned_fragment_shows_each_tasks_diagonal_and_final_score(tmp_path, boards):
    path = _document(tmp_path, f"<!-- leaderboard-learned: {SHORT} rows=seq_lora -->\n<!-- /leaderboard-learned -->\n")
    run([str(path)], check=False, root=ROOT)
    [learned, final] = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("| seq_lora")]
    row = next(row for row in boards.table(*SHORT.split(), "test").rows if row.label == "seq_lora")
    diagonal = [e.r_matrix[e.experiences.index("FOMC")][e.experiences.index("FOMC")] for e in row.ok]
    last = [e.r_matrix[-1][e.experiences.index("FOMC")] for e in row.ok]
    assert learned.split(" | ")[3] == f"{100 * sum(diagonal) / 4:.0f} ({100 * min(diagonal):.0f})"
    assert final.split(" | ")[3] == f"{100 * sum(last) / 4:.0f}"


BAD = [
    ("<!-- leaderboard-table: leaderboards/none trace-mini -->\n<!-- /leaderboard-table -->\n",
     "no leaderboard directory 'leaderboards/none'"),
    ("<!-- leaderboard-table: ../outside trace-mini -->\n<!-- /leaderboard-table -->\n",
     "no leaderboard directory '../outside'"),
    ("<!-- leaderboard-table: leaderboards/grow trace-mni -->\n<!-- /leaderboard-table -->\n",
     "no benchmark 'trace-mni' in leaderboards/grow (did you mean 'trace-mini'?"),
    (f"<!-- leaderboard-table: {GROW} columns=acc,bwd -->\n<!-- /leaderboard-table -->\n", "no score 'bwd'"),
    (f"<!-- leaderboard-table: {GROW} rows=naive -->\n<!-- /leaderboard-table -->\n", "no row 'naive'"),
    (f"<!-- leaderboard-table: {GROW} colums=acc -->\n<!-- /leaderboard-table -->\n", "unknown or repeated option"),
    (f"<!-- leaderboard-paired: {GROW} a=seq_ft -->\n<!-- /leaderboard-paired -->\n", "a=, b="),
    (f"<!-- leaderboard-paired: {GROW} a=seq_ft b=seq_lora summary=yes -->\n<!-- /leaderboard-paired -->\n",
     "unknown or repeated option"),
    (f"<!-- leaderboard-learned: {SHORT} floor=C-STANCE:37 -->\n<!-- /leaderboard-learned -->\n",
     "floor gives no value for FOMC, ScienceQA, NumGLUE-cm"),
    (f"<!-- leaderboard-learned: {SHORT} floor=C-STANCE:x -->\n<!-- /leaderboard-learned -->\n", "no task:number"),
    (f"<!-- leaderboard-learned: {SHORT} floor=FOMX:3 -->\n<!-- /leaderboard-learned -->\n", "no task 'FOMX'"),
    (f"<!-- leaderboard-table: {GROW} -->\nno end\n", "leaderboard-table is not closed"),
    ("<!-- /leaderboard-orders -->\n", "closes no fragment"),
    (f"<!-- leaderboard-table: {GROW} -->\n<!-- leaderboard-table: {GROW} -->\n", "opened at line 5 is not closed"),
    (f"<!-- leaderboard-tabel: {GROW} -->\n<!-- /leaderboard-tabel -->\n", "malformed leaderboard fragment"),
    (f"<!-- leaderboard-table: {GROW} rows='seq_ft -->\n<!-- /leaderboard-table -->\n", "cannot read"),
]


@pytest.mark.parametrize("body, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, body, message):
    path = _document(tmp_path, body)
    before = path.read_text(encoding="utf-8")
    assert main([str(path), "--root", str(ROOT)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"clbench: error: {path}:") and message in err, err
    assert path.read_text(encoding="utf-8") == before


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "none.md")]) == 2
    assert capsys.readouterr().err == f"clbench: error: {tmp_path / 'none.md'}: no such file (give Markdown files, " \
                                      "e.g. docs/*.md README.md)\n"


def test_the_syntax_shown_in_a_code_block_is_no_fragment():
    text = "```\n<!-- leaderboard-table: leaderboards/none x -->\n```\n<!-- leaderboard-table: a b -->\n\n" \
           "<!-- /leaderboard-table -->\n"
    [fragment] = find_fragments(text.splitlines(), "doc.md")
    assert (fragment.kind, fragment.args, fragment.line, fragment.end) == ("leaderboard-table", "a b", 4, 6)


def test_lists_keep_the_commas_of_a_label():
    assert split_list("joint, ewc (gamma=1.0, mode=online),naive") == ["joint", "ewc (gamma=1.0, mode=online)", "naive"]
