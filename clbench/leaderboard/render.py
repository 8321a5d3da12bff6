"""Render a leaderboard directory: ``README.md`` (tables), ``index.html`` and one page per table row.

All three are rendered from the jinja2 templates in ``clbench/leaderboard/templates``; their
words are those of :mod:`clbench.leaderboard.notes`. The pages need nothing but a browser:
figures are coloured tables, inline SVG or PNGs as ``data:`` URIs, the sorter is a few lines of
inline script, and a Content-Security-Policy forbids every network fetch, so they open from
disk or a CI artifact. ``index.html`` holds the tables and per-order charts only; each
strategy's name links to its row's page under ``pages/`` (every run's R matrix as a table of
coloured cells, in the stream's order or the run's as a switch on the page says, with their
mean over orders, so that they compare cell by cell; curves as inline SVG; the final per-class
recall; expert utilization). Only the index's charts, a long stream's heatmaps and the
utilization are matplotlib PNGs, each drawn once. Output is a pure function of the entries
(no timestamps, PNGs without software metadata): unchanged entries give identical files.

Sorting: click (or Enter on) a column header; the first click sorts the way "better" points
(descending for higher-is-better scores, ascending for rank, forgetting and an R of errors'
levels). ``index.html?sort=<key>&dir=asc`` opens it sorted, as the tests drive it in Chromium.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
from pathlib import Path

from clbench.leaderboard.compare import compare_table
from clbench.leaderboard.entries import load_entries
from clbench.leaderboard.figures import BAR_METRIC, groups_figure, order_bar_figure, png_uri
from clbench.leaderboard.manifest import manifest_hashes, manifest_unranked, read_manifest
from clbench.leaderboard.markdown import md_code, md_text
from clbench.leaderboard.notes import (DIRTY_MARK, INDEX, RECALL_MISSING, RECALL_NOTE, bench_meta, constant_note,
                                      direction_note, dirty_note, gmean_note, groups_note, groups_text, meta_line,
                                      page_notes, readme_notes, routing_note, trace_note,
                                      unranked_note)
from clbench.leaderboard.cell_text import TEST_SET_MARK, fmt, group_cell, number, runs_cell
from clbench.leaderboard.schema import Entry, Environment, OkEntry
from clbench.leaderboard.table import RANK_BY, BenchmarkTable, build_tables, made_dirty
from clbench.results.record import Status

README = "README.md"
DETAILS = "pages"  # one page per table row, beside index.html (runs/ holds working folders)
ROUTING_LAYERS = 6  # panels per run in the page's utilization figures (evenly spaced layers)


# -- provenance -----------------------------------------------------------------------------
def _provenance(entries: list[Entry], root: Path, manifest: dict | None) -> dict:
    def distinct(values) -> list[str]:
        return sorted({str(v) for v in values if v})

    failed = sum(e.status == Status.FAILED for e in entries)
    info = {
        "runs": len(entries), "failed": failed,
        "suites": distinct(e.suite for e in entries),
        "harness": distinct(f"clbench {e.harness.version}" for e in entries),
        "commits": distinct((e.harness.git_commit or "")[:12] for e in entries),
        "devices": distinct(_device(e.env) for e in entries),
        "torch": distinct(e.env.packages.get("torch") for e in entries),
        "suite": None, "missing": 0, "dirty": sum(made_dirty(e) for e in entries),
    }
    if manifest:
        have = {e.config_hash for e in entries}
        info["suite"] = manifest
        info["missing"] = sum(h not in have for h in manifest_hashes(root) or [])
    return info


def _device(env: Environment) -> str | None:
    """``cpu (AMD EPYC, AVX2, kernels pinned to avx2, bf16-mixed)``: on CPU the numbers depend on the
    kernels' instruction set (pinned: the same on any CPU of its vendor that has it) and the precision."""
    cpu = env.cpu
    if env.cuda or cpu is None:
        return env.device
    pin = f", kernels pinned to {cpu.pin}" if cpu.pin else ""
    precision = f", {env.precision}" if env.precision not in (None, "32-true") else ""
    return f"{env.device} ({cpu.model}, {cpu.isa}{pin}{precision})"


def _regenerate(root_arg: str, manifest: dict | None) -> str:
    """The command that remakes the folder; the paths quoted for the shell, as ``suite.json`` may say anything."""
    folder = shlex.quote(root_arg)
    suite = f" --suite {shlex.quote(manifest['source'])}" if manifest and manifest.get("source") else ""
    return f"clbench leaderboard run{suite} --output {folder}"


def _suite(manifest: dict | None) -> dict | None:
    return manifest and {"name": manifest["name"], "source": manifest.get("source", ""),
                         "description": manifest.get("description")}


# -- README ---------------------------------------------------------------------------------
def render_readme(tables: list[BenchmarkTable], entries: list[Entry], info: dict, root_arg: str) -> str:
    """``README.md``: the tables in Markdown, from ``templates/readme.md.j2``."""
    manifest, suite = info["suite"], _suite(info["suite"])
    contexts = []
    for table in tables:
        rows = [{"rank": str(row.rank or "—"), "label": f"{row.label} {DIRTY_MARK}" if row.dirty else row.label,
                 "group": group_cell(table, row), "runs": runs_cell(row),
                 "cells": [fmt(row.stats.get(s), score=table.score(s)) for s in table.scores],
                 "wall": "—" if row.wall_seconds is None else f"{row.wall_seconds:.1f}"} for row in table.rows]
        contexts.append({"label": table.label, "meta": meta_line(bench_meta(table)),
                         "notes": readme_notes(table)[0], "titles": [table.title(s) for s in table.scores],
                         "rows": rows, "after": readme_notes(table)[1]})
    text = _templates().get_template("readme.md.j2").render(
        suite=suite, status=_status(info), regenerate=_regenerate(root_arg, manifest), notes=page_notes(tables),
        index=INDEX, tables=contexts, failed=_failed(entries))
    return text.removesuffix("\n")  # every block ends with a blank line; the file, with one newline


# -- HTML -----------------------------------------------------------------------------------
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "base-uri 'none'; form-action 'none'")


@functools.cache
def _templates():
    """The templates of ``clbench/leaderboard/templates``: pages HTML-escaped, the README not
    (what it takes from files goes through the ``md`` and ``code`` filters instead). One
    environment per process, so that each template is compiled once, not once per page."""
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("clbench.leaderboard", "templates"), undefined=StrictUndefined,
                      autoescape=select_autoescape(["html", "html.j2"], default_for_string=True),
                      keep_trailing_newline=True)
    env.filters["md"] = md_text
    env.filters["code"] = md_code
    return env


def detail_name(table: BenchmarkTable, row) -> str:
    """The run page of a table row, relative to the leaderboard directory (stable across renders)."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{table.label} {row.label}".lower()).strip("-")[:60]
    digest = hashlib.sha256(f"{table.key}\n{row.key}".encode()).hexdigest()[:10]
    return f"{DETAILS}/{slug}-{digest}.html"


def _cell(stat, score) -> dict:
    """A score's cell: the mean, its 95% interval (``± half-width``, or ``[low, high]`` where a
    bound of the score cut it; ‡: one unit's test set), and a tooltip with the runs, units, the
    interval's ends and the sd over units."""
    if stat is None:
        return {"value": "", "tip": None, "mean": "—", "ci": None}
    tip = [f"{stat.n} runs, {stat.units} units"]
    if stat.half is not None:
        ends = f"[{number(stat.low, score)}, {number(stat.high, score)}]"
        tip.append(f"95% interval {ends}" + (" (test set)" if stat.from_test_set else " (t over units)"))
    if stat.std is not None:
        tip.append(f"sd {number(stat.std, score)}")
    mark = TEST_SET_MARK if stat.from_test_set else ""
    ci = None if stat.half is None else (f"[{number(stat.low, score)}, {number(stat.high, score)}]{mark}" if stat.cut
                                         else f"± {number(stat.half, score)}{mark}")
    return {"value": repr(stat.mean), "tip": ", ".join(tip), "mean": number(stat.mean, score), "ci": ci}


def _table_context(table: BenchmarkTable) -> dict:
    columns = [{"key": "rank", "title": "Rank", "type": "num", "first": "asc"},
               {"key": "group", "title": "Group", "type": "text", "first": "asc"},
               {"key": "strategy", "title": "Strategy", "type": "text", "first": "asc"},
               {"key": "runs", "title": "Runs", "type": "num", "first": "desc"}]
    columns += [{"key": s, "title": table.title(s), "type": "num", "first": "desc" if table.higher.get(s, True)
                 else "asc"} for s in table.scores]
    columns.append({"key": "wall", "title": "Wall s", "type": "num", "first": "asc"})
    rows = []
    for row in table.rows:
        wall = row.wall_seconds
        rows.append({"label": row.label, "rank": row.rank or "—", "rank_value": "" if row.rank is None else row.rank,
                     "group": group_cell(table, row),
                     "detail": detail_name(table, row) if row.ok else None, "dirty": bool(row.dirty),
                     "runs": runs_cell(row), "runs_value": len(row.ok),
                     "cells": [_cell(row.stats.get(s), table.score(s)) for s in table.scores],
                     "wall": "—" if wall is None else f"{wall:.1f}", "wall_value": "" if wall is None else repr(wall)})
    orders = None
    if BAR_METRIC in table.scores:
        comparison = compare_table(table, BAR_METRIC, paired=False)
        rs = comparison["rank_stability"]
        tau = rs["kendall_tau_mean"]
        orders = {"tau": "—" if tau is None else f"{tau:.3f}", "pairs": len(rs["pairs"]),
                  "title": table.title(BAR_METRIC), "png": png_uri(order_bar_figure(comparison, title=table.title(BAR_METRIC)))}
    groups = None
    if table.groups is not None and table.groups.method is not None:
        title = table.title(RANK_BY).removesuffix(" ↓").removesuffix(" ↑")
        groups = {"text": groups_text(table), "title": title,
                  "png": png_uri(groups_figure(table.groups, title, table.label, table.percent))}
    after = [(note, "") for note in [unranked_note(table)] if note]
    after += [(note, "dirty") for note in [dirty_note(table)] if note]
    after += [(note, "") for note in [gmean_note(table, page=True), constant_note(table)] if note]
    return {"label": table.label, "meta": meta_line(bench_meta(table)), "columns": columns, "rows": rows,
            "notes": [n for n in (direction_note(table), trace_note(table), routing_note(table), groups_note(table))
                      if n],
            "after": after, "orders": orders, "groups": groups}


def _failed(entries: list[Entry]) -> list[dict]:
    return [{"strategy": e.strategy.name, "benchmark": e.benchmark.name, "order": e.order_label,
             "seed": e.seed, "hash": e.config_hash[:12], "error": e.error}
            for e in entries if e.status == Status.FAILED]


def _status(info: dict) -> str:
    status = f"{info['runs']} runs" + (f", {info['failed']} failed" if info["failed"] else "")
    if info["missing"]:
        status += f", {info['missing']} of the suite's runs not yet run"
    if info["dirty"]:
        status += f", {info['dirty']} made from uncommitted code ({DIRTY_MARK})"
    return (f"{status} · {', '.join(info['harness'])} · commit {', '.join(info['commits']) or 'unknown'} · device "
            f"{', '.join(info['devices']) or 'unknown'} · torch {', '.join(info['torch']) or 'unknown'}")


def render_html(tables: list[BenchmarkTable], entries: list[Entry], info: dict, root_arg: str) -> str:
    """``index.html``: the tables and per-order charts; no heatmap (those are on the run pages)."""
    manifest, suite = info["suite"], _suite(info["suite"])
    return _templates().get_template("index.html.j2").render(
        csp=CSP, suite=suite, status=_status(info), regenerate=_regenerate(root_arg, manifest),
        notes=page_notes(tables), tables=[_table_context(t) for t in tables], failed=_failed(entries),
        dirty_mark=DIRTY_MARK)


def _runs(table: BenchmarkTable, row) -> list[OkEntry]:
    return sorted(row.ok, key=lambda e: (table.orders.index(e.order_label), e.seed))


def _run_caption(e: OkEntry, table: BenchmarkTable, title: str) -> str:
    acc = e.scores.get(RANK_BY)
    return (f"order {e.order_label} · seed {e.seed}"
            + (f" · {title} {number(acc, table.score(RANK_BY))}" if isinstance(acc, (int, float)) else "")
            + (f" · {DIRTY_MARK} uncommitted code" if made_dirty(e) else ""))


def _recall_lines(e: OkEntry) -> dict | None:
    """A run's final per-class recall (``recall_final``) as table lines, in percent; None if not recorded."""
    recall = e.recall_final
    if not recall:
        return None
    gmeans = e.matrices.get("gmean") or [[]]
    lines = []
    named = list(zip(e.experiences, recall.get("columns") or [], gmeans[-1] + [None] * len(e.experiences)))
    if recall.get("global") is not None:
        named.append(("global test set", recall["global"], e.scores.get("global_gmean")))
    for name, values, gmean in named:
        if values is None:
            continue
        lines.append({"name": name, "cells": [{"text": "·" if v is None else f"{100 * v:.0f}", "zero": v == 0}
                                              for v in values],
                      "gmean": "—" if gmean is None else f"{100 * gmean:.1f}"})
    width = max((len(line["cells"]) for line in lines), default=0)
    return {"lines": lines, "classes": list(range(width))}


def _matrix(experiences: int, cells, figure) -> dict:
    """One view of an R matrix: an HTML table of coloured cells (``cells()``), or, for a long
    stream (more than ``MAX_CELLS`` experiences, whose cells would be too many to write), its
    heatmap as a PNG (``figure()``, drawn once)."""
    from clbench.results.plots import MAX_CELLS

    if experiences <= MAX_CELLS:
        return {"table": cells(), "png": None}
    return {"table": None, "png": png_uri(figure())}


def render_run_page(table: BenchmarkTable, row) -> str:
    """A row's page: its runs' R matrices (one view each, in the stream's order or the run's, as a
    switch on the page picks, with the mean over orders), per-experience curves, final per-class
    recall and expert utilization."""
    from clbench.results.plots import routing_layers, utilization_figure

    title = table.title(RANK_BY).removesuffix(" ↓").removesuffix(" ↑")
    runs = _runs(table, row)
    fixed = _fixed_order(table, runs, title)
    recalls = []
    for e in runs:
        lines = _recall_lines(e)
        if lines:
            recalls.append({"hash": e.config_hash, "caption": _run_caption(e, table, title), **lines})
    imbalance = any("gmean_final" in e.scores or "global_gmean" in e.scores for e in runs)
    recall_note = RECALL_NOTE if recalls else RECALL_MISSING if imbalance else None
    routing = []
    for e in runs:
        if not e.expert_utilization:
            continue
        layers = routing_layers(e.document, ROUTING_LAYERS)
        caption = (f"order {e.order_label} · seed {e.seed}: expert utilization per test experience after the "
                   f"last stage ({len(layers)} of {len(routing_layers(e.document))} MoE layers)")
        routing.append({"hash": e.config_hash, "caption": caption,
                        "png": png_uri(utilization_figure(e.document, layers))})
    summary = f"{runs_cell(row)} runs · " + " · ".join(f"{table.title(s)} {fmt(row.stats.get(s), score=table.score(s))}"
                                                       for s in table.scores)
    return _templates().get_template("run.html.j2").render(
        csp=CSP, label=row.label, benchmark=table.label, index=INDEX, summary=summary, fixed=fixed, recalls=recalls,
        recall_note=recall_note, routing=routing)


def _fixed_order(table: BenchmarkTable, runs: list[OkEntry], title: str) -> dict:
    """The row's R matrices and curves. Each run's R in the stream's own experience order, so
    that runs of different orders compare cell by cell, and in its own order (the page shows
    one of the two, as its switch says); the mean R over orders; and each multi-stage run's
    per-experience curves over its stages. Only the run's order where the runs share no fixed
    order (a stream drawn for each seed); curves in each run's own order then, and none past
    ``MAX_LINES`` experiences."""
    from markupsafe import Markup

    from clbench.results.fixed_order import canonical_names
    from clbench.results.plots import (MAX_LINES, curves_svg, fixed_order_cells, fixed_order_figure,
                                       mean_over_orders_cells, mean_over_orders_figure, r_matrix_cells,
                                       r_matrix_figure)
    from clbench.results.record import single_stage

    results = [e.document for e in runs]  # R's figures read runner results (clbench.results.plots)
    names = canonical_names([e.document for r in table.rows for e in r.ok]) or canonical_names(results)
    if names is not None and any(sorted(e.experiences) != sorted(names) for e in runs):
        names = canonical_names(results)
    matrices, mean = [], None
    for e in runs:
        views = []
        if names is not None:
            views.append({"order": "stream", **_matrix(len(names), lambda e=e: fixed_order_cells(e.document, names),
                                                       lambda e=e: fixed_order_figure(e.document, names))})
        views.append({"order": "run", **_matrix(len(e.experiences), lambda e=e: r_matrix_cells(e.document),
                                                lambda e=e: r_matrix_figure(e.document))})
        matrices.append({"hash": e.config_hash, "caption": _run_caption(e, table, title), "views": views})
    if names is not None:
        orders = len({e.order_label for e in runs})
        mean = {"order": None, **_matrix(len(names), lambda: mean_over_orders_cells(results, names),
                                         lambda: mean_over_orders_figure(results, names)),
                "caption": f"mean over {orders} order{'s' if orders != 1 else ''} ({len(runs)} run"
                           f"{'s' if len(runs) != 1 else ''}, each order's averaged first)"}
    curves = [{"hash": e.config_hash, "caption": _run_caption(e, table, title),
               "svg": Markup(curves_svg(e.document, names))}
              for e in runs if not single_stage(e.document) and len(e.experiences) <= MAX_LINES]
    return {"names": names or [], "mean": mean, "matrices": matrices, "curves": curves}


def _refuse_links(root: Path) -> None:
    """Refuse a ``pages``, ``entries`` or ``runs`` that is a symbolic link: render writes pages and
    deletes stale ones in ``pages/``, and a link would take that (and the entries read) to a folder
    outside the leaderboard, whose ``*.html`` files would be deleted."""
    from clbench.errors import UserError
    from clbench.leaderboard.cell import RUNS_DIR
    from clbench.leaderboard.entries import ENTRIES_DIR

    for name in (DETAILS, ENTRIES_DIR, RUNS_DIR):
        path = root / name
        if path.is_symlink():
            raise UserError(f"{name} is a symbolic link (to {os.readlink(path)}), and render writes and deletes files "
                            "only inside the leaderboard folder", where=str(path),
                            fix="replace the link by a folder (copy what it points to), or render the folder it "
                                "points into")
    from clbench.leaderboard.layout import check_layout

    check_layout(root)  # then a README.md that is a folder, a pages that is a file, ...


def render(root: str | Path) -> tuple[Path, Path]:
    """Write ``root/README.md`` and ``root/index.html`` from the entries under ``root``."""
    from clbench.errors import UserError
    from clbench.io import write_text

    root_arg = str(root)
    root = Path(root)
    _refuse_links(root)
    # With a suite manifest, only the suite's grid is shown: entries of configs the suite no
    # longer lists (e.g. before a hyper-parameter change) stay on disk but out of the tables.
    manifest = read_manifest(root)  # a malformed suite.json is refused, not passed over
    hashes = manifest_hashes(root)
    entries = load_entries(root, hashes)
    if not entries:
        raise UserError(f"no entries in {root / 'entries'}", where=root_arg,
                        fix="run 'clbench leaderboard run --output DIR' first")
    tables = build_tables(entries, hashes, source=root_arg, unranked=manifest_unranked(root))
    info = _provenance(entries, root, manifest)
    readme, index = root / README, root / INDEX
    write_text(readme, render_readme(tables, entries, info, root_arg))
    written = set()
    for table in tables:
        for row in table.rows:
            if row.ok:
                name = detail_name(table, row)
                write_text(root / name, render_run_page(table, row))
                written.add(root / name)
    for stale in sorted((root / DETAILS).glob("*.html")):  # pages of rows no longer in the tables
        if stale not in written:
            stale.unlink()
    write_text(index, render_html(tables, entries, info, root_arg))
    return readme, index
