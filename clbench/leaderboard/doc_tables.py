"""Leaderboard numbers in Markdown, written from the committed entries, so that they cannot drift.

A document quotes a leaderboard between two HTML comments, each on a line of its own::

    <!-- leaderboard-table: leaderboards/fashion-mnist-rotated fashion-mnist-rotated columns=acc,bwt rows=joint,naive -->
    <!-- /leaderboard-table -->

``python -m clbench.leaderboard.doc_tables [--check] FILE...`` writes what lies between them
(``--check`` writes nothing, prints what differs and exits 1). The comment names a leaderboard
directory (relative to ``--root``), a benchmark's label (the README's ``## label``) and options;
lists are comma-separated (a comma inside a label's parentheses stays; quote spaces as in a shell):

* ``leaderboard-table``: the README's rows (rank, group letters, label, runs, mean ± 95% interval
  per score), cut to the labels of ``rows=`` and the score keys of ``columns=``; ``notes`` adds
  the README's notes above and below the table (the groups' test; the groups);
* ``leaderboard-orders``: each row's ``columns=`` scores per task order, seeds averaged;
* ``leaderboard-paired``: each row of ``a=`` minus each of ``b=`` on each ``columns=`` score per
  replication unit, the mean difference's 95% interval and whether it holds 0; ``summary`` gives,
  in place of the per-unit columns (too many to read past a few orders), the number of units, in
  how many A is above B, and the gap its paired test detects with 80% power at α = 0.05
  (:func:`clbench.leaderboard.pairs.paired_test`: the units' spread and the test sets' noise);
* ``leaderboard-learned``: per task, each row's R diagonal (mean over its runs, the lowest in
  brackets) and its score after the last task, under a first line for ``floor=task:value,...``
  (as tables show R: points for a percentage); ``counts`` gives instead in how many (order, task)
  pairs the diagonal clears the untrained score and the floor (:mod:`~clbench.leaderboard.learned`).

Entries are read and tabled as ``render`` does; cells are :mod:`~clbench.leaderboard.table`'s.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from clbench.errors import UserError, did_you_mean, exit_status
from clbench.io import write_text
from clbench.leaderboard.entries import load_entries
from clbench.leaderboard.manifest import manifest_hashes, manifest_unranked
from clbench.leaderboard.notes import DIRTY_MARK, readme_notes
from clbench.leaderboard.markdown import md_text
from clbench.leaderboard.stats import interval, replication_unit, unit_means
from clbench.leaderboard.cell_text import fmt, group_cell, number, runs_cell
from clbench.leaderboard.learned import learned, task_names
from clbench.leaderboard.table import BenchmarkTable, Row, Stat, build_tables
from clbench.metrics.score_registry import RANK_BY

OPTIONS = {"leaderboard-table": ("columns", "rows", "notes"), "leaderboard-orders": ("columns", "rows"),
           "leaderboard-paired": ("columns", "a", "b", "summary"), "leaderboard-learned": ("rows", "floor", "counts")}
FLAGS = ("notes", "summary", "counts")  # options without a value
_KIND = "(leaderboard-(?:table|orders|paired|learned))"
_OPEN, _CLOSE = re.compile(rf"<!-- {_KIND}: (.+?) -->"), re.compile(rf"<!-- /{_KIND} -->")
_ANY = re.compile(r"\s*<!--\s*/?\s*leaderboard-")  # what looks like a fragment's comment, well formed or not
_USAGE = ("<!-- leaderboard-table|orders|paired|learned: DIR LABEL option... --> ... "
          "<!-- /leaderboard-table|orders|paired|learned -->")


@dataclass
class Fragment:
    kind: str
    args: str  # the opening comment's text after the kind
    line: int  # the opening comment's line, 1-based
    end: int = 0  # the closing comment's line


def find_fragments(lines: list[str], where: str) -> list[Fragment]:
    """The fragments of a document's ``lines``; a UserError for a malformed, stray or unclosed comment."""
    found, current, fenced = [], None, False  # fenced: inside ``` (a block that shows the syntax)
    for lineno, line in enumerate(lines, 1):
        fenced ^= line.lstrip().startswith(("```", "~~~"))
        opening, closing = _OPEN.fullmatch(line.strip()), _CLOSE.fullmatch(line.strip())
        if not fenced and _ANY.match(line) and not (opening or closing):
            raise UserError("malformed leaderboard fragment comment", where=f"{where}:{lineno}", fix=f"write {_USAGE}")
        if fenced or not (opening or closing):
            continue
        if bool(opening) == bool(current) or (closing and closing.group(1) != current.kind):
            raise UserError(f"{current.kind} opened at line {current.line} is not closed" if current else
                            f"<!-- /{closing.group(1)} --> closes no fragment", where=f"{where}:{lineno}",
                            fix=f"write {_USAGE}")
        if opening:
            current = Fragment(opening.group(1), opening.group(2), lineno)
        else:
            current.end = lineno
            found.append(current)
            current = None
    if current:
        raise UserError(f"{current.kind} is not closed", where=f"{where}:{current.line}",
                        fix=f"end it with a line <!-- /{current.kind} -->")
    return found


def split_list(value: str) -> list[str]:
    """``a,b (x=1, y=2)`` -> ``["a", "b (x=1, y=2)"]``: a comma inside parentheses stays."""
    return [part.strip() for part in re.split(r",(?![^()]*\))", value) if part.strip()]


class Leaderboards:
    """Each leaderboard directory's tables under ``root``, read once (reading rescores every entry)."""

    def __init__(self, root: str | Path = "."):
        self.root, self._tables = Path(root), {}

    def table(self, directory: str, label: str, where: str) -> BenchmarkTable:
        path = (self.root / directory).resolve()
        if not path.is_relative_to(self.root.resolve()) or not (path / "entries").is_dir():
            raise UserError(f"no leaderboard directory '{directory}' in {self.root}", where=where,
                            fix="name a folder with entries/, relative to the repository root (--root)")
        if path not in self._tables:
            hashes = manifest_hashes(path)  # as render does: the suite's grid only, in its order
            self._tables[path] = build_tables(load_entries(path, hashes), hashes, source=directory,
                                              unranked=manifest_unranked(path))
        tables = {t.label: t for t in self._tables[path]}
        if label not in tables:
            raise UserError(f"no benchmark '{label}' in {directory}", where=where, fix=did_you_mean(label, tables))
        return tables[label]


def _known(names: list[str], known: list[str], what: str, table: BenchmarkTable, where: str) -> list[str]:
    if unknown := [name for name in names if name not in known]:
        raise UserError(f"no {what} '{unknown[0]}' in {table.label}", where=where, fix=did_you_mean(unknown[0], known))
    return names


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def readme_rows(table: BenchmarkTable, scores: list[str], rows: list[Row], notes: bool = False) -> list[str]:
    """``rows`` with the ``scores`` columns as the README writes them (``templates/readme.md.j2``), and its notes."""
    lines = [_line(["Rank", "Group", "Strategy", "Runs"] + [md_text(table.title(s)) for s in scores]),
             "|---:|:---:|:---|---:|" + "---:|" * len(scores)]
    for row in rows:
        label = f"{row.label} {DIRTY_MARK}" if row.dirty else row.label
        lines.append(_line([str(row.rank or "—"), group_cell(table, row), md_text(label), runs_cell(row)]
                           + [fmt(row.stats.get(s), score=table.score(s)) for s in scores]))
    above, below = readme_notes(table) if notes else ([], [])
    return [x for text in above for x in (md_text(text), "")] + lines + [x for text in below for x in ("", md_text(text))]


def unit_values(row: Row, score: str, unit: str) -> dict:
    """The row's mean ``score`` per replication unit (an order, its seeds averaged; or (order, seed))."""
    runs = {(e.order_label, e.seed): (v, None) for e in row.ok
            if isinstance(v := e.scores.get(score), (int, float)) and math.isfinite(v)}
    return {key: mean for key, (mean, _) in unit_means(runs, unit).items()}


def order_rows(table: BenchmarkTable, scores: list[str], rows: list[Row]) -> list[str]:
    """Each row's ``scores`` (joined by " / ") under each task order, seeds averaged."""
    head = f"Strategy ({' / '.join(md_text(table.title(s)) for s in scores)})"
    lines = [_line([head] + [md_text(o) for o in table.orders]), "|:---|" + "---:|" * len(table.orders)]
    for row in rows:
        per = {s: unit_values(row, s, "order") for s in scores}
        lines.append(_line([md_text(row.label)] + [" / ".join(number(per[s].get(o), table.score(s)) for s in scores)
                                                   for o in table.orders]))
    return lines


def paired_rows(table: BenchmarkTable, scores: list[str], a_rows: list[Row], b_rows: list[Row]) -> list[str]:
    """Each ``a`` minus each ``b`` per replication unit, and the mean difference's 95% interval."""
    unit = replication_unit(set(table.orders))  # the order (its seeds averaged), or (order, seed) of one order
    pairs = []
    for a, b, score in ((a, b, s) for a in a_rows for b in b_rows if a is not b for s in scores):
        ua, ub = unit_values(a, score, unit), unit_values(b, score, unit)
        if diffs := {k: ua[k] - ub[k] for k in ua if k in ub}:  # none: a score one has not (N_eff of an adapter)
            pairs.append((a, b, score, diffs))
    keys = sorted({k for *_, diffs in pairs for k in diffs}, key=lambda k: table.orders.index(k) if unit == "order"
                  else k[1])
    lines = [_line(["A − B", "Score"] + [md_text(k if unit == "order" else f"seed {k[1]}") for k in keys]
                   + ["Mean ± 95% interval", "The interval"]), "|:---|:---|" + "---:|" * (len(keys) + 1) + ":---|"]
    for a, b, score, diffs in pairs:
        meta = table.score(score)
        ci = interval(list(diffs.values()))
        stat = Stat.of(ci, len(diffs))
        cells = [number(diffs[k], meta) if k in diffs else "—" for k in keys] + [fmt(stat, score=meta)]
        signed = [c if c.startswith(("-", "—")) else f"+{c}" for c in cells]  # a difference shows its sign
        lines.append(_line([md_text(f"{a.label} − {b.label}"), md_text(table.title(score))] + signed
                           + [_verdict(ci)]))
    return lines


def _verdict(ci) -> str:
    """Whether a difference's 95% interval holds 0, or lies above or below it ("—": one unit, no interval)."""
    if ci.half is None:
        return "—"
    return "holds 0" if ci.low <= 0 <= ci.high else "above 0" if ci.mean > 0 else "below 0"


def paired_summary_rows(table: BenchmarkTable, scores: list[str], a_rows: list[Row], b_rows: list[Row]) -> list[str]:
    """Each ``a`` minus each ``b``: units, in how many A is above B, the mean difference's 95% interval,
    whether it holds 0, and the gap detected with 80% power at α = 0.05 planned in advance."""
    from clbench.leaderboard.pairs import paired_test

    unit = replication_unit(set(table.orders))
    name = "Orders" if unit == "order" else "Seeds"
    lines = [_line(["A − B", "Score", name, "A above B in", "Mean ± 95% interval", "The interval",
                    "Detected with 80% power"]), "|:---|:---|---:|---:|---:|:---|---:|"]
    for a, b, score in ((a, b, s) for a in a_rows for b in b_rows if a is not b for s in scores):
        meta = table.score(score)
        pt = paired_test(a, b, score, unit=unit)  # its units are the per-unit means the other fragments pair
        diffs = [pair["a"] - pair["b"] for pair in pt["pairs"]]
        if not diffs:  # a score one has not (N_eff of an adapter)
            continue
        ci = interval(diffs)
        mean = fmt(Stat.of(ci, len(diffs)), score=meta)
        power = pt.get("power")
        lines.append(_line([md_text(f"{a.label} − {b.label}"), md_text(table.title(score)), str(len(diffs)),
                            str(sum(d > 0 for d in diffs)), mean if mean.startswith("-") else f"+{mean}",
                            _verdict(ci), number(power["detectable"], meta) if power else "—"]))
    return lines


def _floor(values: list[str], tasks: list[str], percent: bool, table: BenchmarkTable, where: str) -> dict[str, float]:
    """``floor=C-STANCE:37,...`` as fractions of R per task; every task once, as a number."""
    out: dict[str, float] = {}
    for item in values:
        task, _, value = item.rpartition(":")
        try:
            out[_known([task], tasks, "task", table, where)[0]] = float(value) / (100 if percent else 1)
        except ValueError:
            raise UserError(f"floor '{item}' is no task:number", where=where,
                            fix="write floor=TASK:VALUE,... as tables show R (37 for 37%)") from None
    if missing := [t for t in tasks if t not in out]:
        raise UserError(f"floor gives no value for {', '.join(missing)}", where=where, fix="give every task one")
    return out


def learned_rows(table: BenchmarkTable, rows: list[Row], floor: dict[str, float] | None, counts: bool) -> list[str]:
    """Each row's diagonal and final score per task, or (``counts``) how often its diagonal clears the
    untrained score and the floor (:mod:`clbench.leaderboard.learned`)."""
    tasks, meta = task_names(table), table.score(RANK_BY)
    records = {row.label: learned(row, floor) for row in rows}
    if counts:
        heads = ["Strategy", "Above the untrained score"] + (["Above the floor"] if floor else [])
        lines = [_line(heads), "|:---|" + ":---|" * (len(heads) - 1)]
        for row in rows:
            rec = records[row.label]
            cells = []
            for attr in ("above_untrained",) + (("above_floor",) if floor else ()):
                per = [(t, getattr(rec[t], attr), len(rec[t].diagonal)) for t in tasks if t in rec]
                cells.append("—" if not per or any(k is None for _, k, _ in per) else
                             f"{sum(k for _, k, _ in per)} of {sum(n for *_, n in per)} ("
                             + ", ".join(f"{md_text(t)} {k}/{n}" for t, k, n in per) + ")")
            lines.append(_line([md_text(row.label)] + cells))
        return lines
    lines = [_line(["Strategy", "Row"] + [md_text(t) for t in tasks]), "|:---|:---|" + "---:|" * len(tasks)]
    if floor:
        lines.append(_line(["(any)", "floor"] + [number(floor[t], meta, 0) for t in tasks]))
    for row in rows:
        rec = records[row.label]
        seen = [rec.get(t) for t in tasks]
        lines.append(_line([md_text(row.label), "learned"] + [
            f"{number(sum(r.diagonal) / len(r.diagonal), meta, 0)} ({number(min(r.diagonal), meta, 0)})"
            if r and r.diagonal else "—" for r in seen]))
        lines.append(_line([md_text(row.label), "after the last task"] + [
            number(sum(r.final) / len(r.final), meta, 0) if r and r.final else "—" for r in seen]))
    return lines


def render_fragment(fragment: Fragment, boards: Leaderboards, where: str) -> str:
    """What belongs between the fragment's comments: a blank line, the table, a blank line."""
    try:
        words = shlex.split(fragment.args)
    except ValueError as err:
        raise UserError(f"cannot read the fragment's arguments: {err}", where=where, fix=f"write {_USAGE}") from None
    options: dict[str, list[str]] = {}
    for word in words[2:]:
        key, sep, value = word.partition("=")
        if key not in OPTIONS[fragment.kind] or key in options or bool(sep) == (key in FLAGS):
            raise UserError(f"unknown or repeated option '{word}' of {fragment.kind}", where=where,
                            fix=f"give each of {', '.join(OPTIONS[fragment.kind])} once at most, as key=value")
        options[key] = split_list(value)
    if len(words) < 2 or (fragment.kind == "leaderboard-paired" and not {"a", "b"} <= set(options)):
        raise UserError(f"{fragment.kind} needs a directory, a benchmark label (and a=, b= to pair)", where=where,
                        fix=f"write {_USAGE}")
    table = boards.table(words[0], words[1], where)
    scores = _known(options.get("columns") or list(table.scores), table.scores, "score", table, where)
    rows, labels = {row.label: row for row in table.rows}, [row.label for row in table.rows]
    if fragment.kind == "leaderboard-learned":
        wanted = _known(options.get("rows") or labels, labels, "row", table, where)
        floor = _floor(options["floor"], task_names(table), table.score(RANK_BY).percent, table, where) \
            if "floor" in options else None
        lines = learned_rows(table, [rows[n] for n in labels if n in wanted], floor, "counts" in options)
    elif fragment.kind == "leaderboard-paired":  # a= and b= in their own order
        a_rows, b_rows = ([rows[n] for n in _known(options[k], labels, "row", table, where)] for k in "ab")
        lines = (paired_summary_rows if "summary" in options else paired_rows)(table, scores, a_rows, b_rows)
    else:  # rows in the table's order
        wanted = _known(options.get("rows") or labels, labels, "row", table, where)
        chosen = [rows[n] for n in labels if n in wanted]
        lines = readme_rows(table, scores, chosen, "notes" in options) if fragment.kind == "leaderboard-table" \
            else order_rows(table, scores, chosen)
    return "\n" + "\n".join(lines) + "\n\n"


def regenerate(text: str, where: str, boards: Leaderboards) -> tuple[str, list[str]]:
    """``text`` with every fragment written from the entries, and a report of each one that changed."""
    lines = text.splitlines(keepends=True)
    out, reports, done = [], [], 0
    for fragment in find_fragments([line.rstrip("\r\n") for line in lines], where):
        here = f"{where}:{fragment.line}"
        written, expected = "".join(lines[fragment.line:fragment.end - 1]), render_fragment(fragment, boards, here)
        out += lines[done:fragment.line] + [expected]
        done = fragment.end - 1
        if written != expected:
            diff = difflib.unified_diff(written.splitlines(), expected.splitlines(), "as written", "from the entries",
                                        n=0, lineterm="")
            reports.append(f"{here}: {lines[fragment.line - 1].strip()} differs from the entries:\n" + "\n".join(diff))
    return "".join(out + lines[done:]), reports


def run(files: list[str], check: bool, root: str | Path = ".") -> int:
    """Write (or, ``check``, compare) the fragments of ``files``; 1 where a check found differences."""
    boards, changed = Leaderboards(root), 0
    for name in files:
        if not Path(name).is_file():
            raise UserError("no such file", where=name, fix="give Markdown files, e.g. docs/*.md README.md")
        text, reports = regenerate(Path(name).read_text(encoding="utf-8"), name, boards)
        changed += len(reports)
        if check and reports:
            print("\n".join(reports))
        elif reports:
            write_text(name, text)
            print(f"{name}: rewrote {len(reports)} fragment(s)")
    if check and changed:
        print(f"{changed} fragment(s) differ from the entries; without --check this command rewrites them")
    return int(check and changed > 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("python -m clbench.leaderboard.doc_tables", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a fragment differs")
    parser.add_argument("--root", default=".", help="the folder the fragments' directories are in (default: .)")
    args = parser.parse_args(argv)
    return exit_status(lambda: run(args.files, args.check, args.root), "clbench: interrupted")


if __name__ == "__main__":
    raise SystemExit(main())
