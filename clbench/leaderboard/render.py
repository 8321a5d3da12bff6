"""Render a leaderboard directory: ``README.md`` (tables), ``index.html`` and one page per table row.

The pages need nothing but a browser: they are rendered from the jinja2 templates in
``clbench/leaderboard/templates``, figures are matplotlib PNGs embedded as ``data:`` URIs, the
sortable table is a few lines of inline script, and a Content-Security-Policy forbids every
network fetch, so they open from disk or a CI artifact as they are. ``index.html`` holds the
tables and per-order charts only, so it stays small; each strategy's name links to its row's
page under ``pages/`` (R-matrix heatmaps of every run, the final per-class recall, expert
utilization), which the browser loads only when it is opened. Output is a pure function of the
entries (no timestamps, PNGs without software metadata), so re-rendering unchanged entries
gives identical files.

Sorting: click (or Enter on) a column header; the first click sorts the way "better" points
(descending for higher-is-better scores, ascending for rank, forgetting and the levels of an R
of errors). ``index.html?sort=<key>&dir=asc``
opens the page sorted, which is also how the tests drive the sorter in headless Chromium.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
from pathlib import Path

from clbench.leaderboard.compare import compare_table
from clbench.leaderboard.entries import load_entries
from clbench.leaderboard.manifest import manifest_hashes, read_manifest
from clbench.leaderboard.table import (RANK_BY, BenchmarkTable, arrow, build_tables, fmt, made_dirty, number,
                                      runs_cell, scoring)
from clbench.metrics.score_registry import title as score_title
from clbench.results.record import Status

README = "README.md"
INDEX = "index.html"
DETAILS = "pages"  # one page per table row, beside index.html (runs/ holds working folders)
BAR_METRIC = "acc"


# -- provenance -----------------------------------------------------------------------------
def _provenance(entries: list[dict], root: Path, manifest: dict | None) -> dict:
    def distinct(values) -> list[str]:
        return sorted({str(v) for v in values if v})

    failed = sum(e["status"] == Status.FAILED for e in entries)
    info = {
        "runs": len(entries), "failed": failed,
        "suites": distinct(e.get("suite") for e in entries),
        "harness": distinct(f"clbench {e['harness'].get('version')}" for e in entries),
        "commits": distinct((e["harness"].get("git_commit") or "")[:12] for e in entries),
        "devices": distinct(e["env"].get("device") for e in entries),
        "torch": distinct((e["env"].get("packages") or {}).get("torch") for e in entries),
        "suite": None, "missing": 0, "dirty": sum(made_dirty(e) for e in entries),
    }
    if manifest:
        have = {e["config_hash"] for e in entries}
        info["suite"] = manifest
        info["missing"] = sum(h not in have for h in manifest_hashes(root) or [])
    return info


def _regenerate(root_arg: str, manifest: dict | None) -> str:
    suite = f" --suite {manifest['source']}" if manifest and manifest.get("source") else ""
    return f"clbench leaderboard run{suite} --output {root_arg} && clbench leaderboard render {root_arg}"


def _bench_meta(table: BenchmarkTable) -> dict:
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


def _meta_line(meta: dict) -> str:
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
    """What the scores of a lower-is-better R mean (None for accuracy tables, whose notes are the page's)."""
    if table.r_higher:
        return None
    return ("R holds errors (lower is better): ACC and AIA are mean final and incremental errors (↓); BWT < 0 "
            "still means forgetting and FWT > 0 helpful transfer (↑); Forgetting is the mean rise of each "
            "experience's error above its best (↓). Rows are ranked by lowest mean ACC; ↑/↓ mark each column's "
            "better direction.")


NOTES = ("Scores are percentages: mean ± sample standard deviation over task orders and seeds "
         "(one run shows the value alone). ACC is the final average accuracy over all experiences; AIA the "
         "average incremental accuracy; BWT < 0 means forgetting; FWT is forward transfer against the "
         "untrained model; Forgetting is the mean drop from each experience's best accuracy to its final one "
         "(lower is better). Rows are ranked by mean ACC. Joint training has a single stage, so its BWT, FWT and "
         "Forgetting are undefined (—).")


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


def _label(row) -> str:
    return f"{row.label} {DIRTY_MARK}" if row.dirty else row.label


ROUTING_NOTE = ("N_eff (MoE methods): the route-wise effective composition number after the last stage, averaged "
                "over MoE layers: how many compositions (language models: task, position and token-frequency "
                "buckets; classifiers: test experience and class) share one route, weighted by the routes' share "
                "of the test units of the experiences trained; 1 means every route carries one composition. A "
                "plain number, not a percentage.")
ROUTING_LAYERS = 6  # panels per run in the page's utilization figures (evenly spaced layers)


def routing_note(table: BenchmarkTable) -> str | None:
    return ROUTING_NOTE if "n_eff" in table.scores else None


# -- README ---------------------------------------------------------------------------------
def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def render_readme(tables: list[BenchmarkTable], entries: list[dict], info: dict, root_arg: str) -> str:
    lines = ["# clbench leaderboard", ""]
    manifest = info["suite"]
    if manifest:
        desc = f": {manifest['description']}" if manifest.get("description") else ""
        lines.append(f"Suite `{manifest['name']}` (`{manifest.get('source', '')}`){desc}")
        lines.append("")
    status = f"{info['runs']} runs"
    if info["failed"]:
        status += f", {info['failed']} failed"
    if info["missing"]:
        status += f", {info['missing']} of the suite's runs not yet run"
    if info["dirty"]:
        status += f", {info['dirty']} made from uncommitted code ({DIRTY_MARK})"
    lines.append(f"{status} · {', '.join(info['harness'])} · commit {', '.join(info['commits']) or 'unknown'} · "
                 f"device {', '.join(info['devices']) or 'unknown'} · torch {', '.join(info['torch']) or 'unknown'}")
    lines += ["", f"Regenerate: `{_regenerate(root_arg, manifest)}` (runs only what is missing; add `--force` "
                  "to rerun every entry after a code change)", "",
              f"{NOTES} Open [`index.html`]({INDEX}) for the sortable table and per-order charts (each strategy "
              "links to its runs' R-matrix heatmaps); `clbench compare` gives the comparison across task orders.", ""]
    for table in tables:
        lines += [f"## {table.label}", "", _meta_line(_bench_meta(table)), ""]
        for note in (direction_note(table), trace_note(table), routing_note(table)):
            if note:
                lines += [note, ""]
        head = ["Rank", "Strategy", "Runs", *[_md(table.title(s)) for s in table.scores], "Wall s"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join(["---:", ":---", "---:"] + ["---:"] * len(table.scores) + ["---:"]) + "|")
        for row in table.rows:
            wall = row.wall_seconds
            cells = [str(row.rank or "—"), _md(_label(row)), runs_cell(row),
                     *[fmt(row.stats.get(s), score=s) for s in table.scores], f"{wall:.1f}" if wall is not None else "—"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for note in (dirty_note(table), gmean_note(table)):
            if note:
                lines += [note, ""]
    failed = [e for e in entries if e["status"] == Status.FAILED]
    if failed:
        lines += ["## Failed runs", ""]
        for e in failed:
            lines.append(f"- {_md(e['strategy']['name'])} on {_md(e['benchmark']['name'])}, order "
                         f"{_md(e['order_label'])}, seed {e['seed']} (`{e['config_hash'][:12]}`): {_md(e['error'])}")
        lines.append("")
    return "\n".join(lines)


# -- figures --------------------------------------------------------------------------------
def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def order_bar_figure(comparison: dict, metric: str = BAR_METRIC, title: str | None = None):
    """Grouped bars: one group per strategy, one bar per task order (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    strategies = comparison["strategies"]
    orders = comparison["orders"]
    x = np.arange(len(strategies))
    width = 0.8 / max(1, len(orders))
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(strategies), 3.2), dpi=100)
    for k, order in enumerate(orders):
        heights = [100 * s["per_order"].get(order, np.nan) for s in strategies]
        ax.bar(x - 0.4 + width * (k + 0.5), heights, width, label=order)
    ax.set_xticks(x, [s["label"] for s in strategies], rotation=20, ha="right", fontsize=8)
    higher = comparison.get("higher_is_better", True)
    title = title or score_title(metric) + ("" if higher else f" {arrow(higher)}")
    ax.set_ylabel(f"{title} (%)")
    if higher:
        ax.set_ylim(0, 100)
    else:  # an error need not stay below 100 %
        ax.set_ylim(bottom=0)
    ax.set_title(f"{comparison['benchmark']}: {title} per task order", fontsize=9)
    ax.legend(title="order", fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# -- HTML -----------------------------------------------------------------------------------
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "base-uri 'none'; form-action 'none'")


def _templates():
    """The page templates (``clbench/leaderboard/templates``), HTML-escaped by default."""
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    return Environment(loader=PackageLoader("clbench.leaderboard", "templates"), undefined=StrictUndefined,
                       autoescape=select_autoescape(["html", "j2"]), keep_trailing_newline=True)


def detail_name(table: BenchmarkTable, row) -> str:
    """The run page of a table row, relative to the leaderboard directory (stable across renders)."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{table.label} {row.label}".lower()).strip("-")[:60]
    digest = hashlib.sha256(f"{table.key}\n{row.key}".encode()).hexdigest()[:10]
    return f"{DETAILS}/{slug}-{digest}.html"


def _cell(stat, score: str) -> dict:
    if stat is None:
        return {"value": "", "n": None, "mean": "—", "sd": None}
    return {"value": repr(stat.mean), "n": stat.n, "mean": number(stat.mean, score),
            "sd": None if stat.std is None else number(stat.std, score)}


def _table_context(table: BenchmarkTable) -> dict:
    columns = [{"key": "rank", "title": "Rank", "type": "num", "first": "asc"},
               {"key": "strategy", "title": "Strategy", "type": "text", "first": "asc"},
               {"key": "runs", "title": "Runs", "type": "num", "first": "desc"}]
    columns += [{"key": s, "title": table.title(s), "type": "num", "first": "desc" if table.higher.get(s, True)
                 else "asc"} for s in table.scores]
    columns.append({"key": "wall", "title": "Wall s", "type": "num", "first": "asc"})
    rows = []
    for row in table.rows:
        wall = row.wall_seconds
        rows.append({"label": row.label, "rank": row.rank or "—", "rank_value": "" if row.rank is None else row.rank,
                     "detail": detail_name(table, row) if row.ok else None, "dirty": bool(row.dirty),
                     "runs": runs_cell(row), "runs_value": len(row.ok),
                     "cells": [_cell(row.stats.get(s), s) for s in table.scores],
                     "wall": "—" if wall is None else f"{wall:.1f}", "wall_value": "" if wall is None else repr(wall)})
    orders = None
    if BAR_METRIC in table.scores:
        comparison = compare_table(table, BAR_METRIC)
        rs = comparison["rank_stability"]
        tau = rs["kendall_tau_mean"]
        orders = {"tau": "—" if tau is None else f"{tau:.3f}", "pairs": len(rs["pairs"]),
                  "title": table.title(BAR_METRIC), "png": _png(order_bar_figure(comparison, title=table.title(BAR_METRIC)))}
    after = [(note, "dirty") for note in [dirty_note(table)] if note]
    after += [(note, "") for note in [gmean_note(table, page=True)] if note]
    return {"label": table.label, "meta": _meta_line(_bench_meta(table)), "columns": columns, "rows": rows,
            "notes": [n for n in (direction_note(table), trace_note(table), routing_note(table)) if n],
            "after": after, "orders": orders}


def _failed(entries: list[dict]) -> list[dict]:
    return [{"strategy": e["strategy"]["name"], "benchmark": e["benchmark"]["name"], "order": e["order_label"],
             "seed": e["seed"], "hash": e["config_hash"][:12], "error": e["error"]}
            for e in entries if e["status"] == Status.FAILED]


def _status(info: dict) -> str:
    status = f"{info['runs']} runs" + (f", {info['failed']} failed" if info["failed"] else "")
    if info["missing"]:
        status += f", {info['missing']} of the suite's runs not yet run"
    if info["dirty"]:
        status += f", {info['dirty']} made from uncommitted code ({DIRTY_MARK})"
    return (f"{status} · {', '.join(info['harness'])} · commit {', '.join(info['commits']) or 'unknown'} · device "
            f"{', '.join(info['devices']) or 'unknown'} · torch {', '.join(info['torch']) or 'unknown'}")


def render_html(tables: list[BenchmarkTable], entries: list[dict], info: dict, root_arg: str) -> str:
    """``index.html``: the tables and per-order charts; no heatmap (those are on the run pages)."""
    manifest = info["suite"]
    suite = None if not manifest else {"name": manifest["name"], "source": manifest.get("source", ""),
                                       "description": manifest.get("description")}
    return _templates().get_template("index.html.j2").render(
        csp=CSP, suite=suite, status=_status(info), regenerate=_regenerate(root_arg, manifest), notes=NOTES,
        tables=[_table_context(t) for t in tables], failed=_failed(entries), dirty_mark=DIRTY_MARK)


def _runs(table: BenchmarkTable, row) -> list[dict]:
    return sorted(row.ok, key=lambda e: (table.orders.index(e["order_label"]), e["seed"]))


def _run_caption(e: dict, title: str) -> str:
    acc = e["scores"].get(RANK_BY)
    return (f"order {e['order_label']} · seed {e['seed']}"
            + (f" · {title} {100 * acc:.1f}" if isinstance(acc, (int, float)) else "")
            + (f" · {DIRTY_MARK} uncommitted code" if made_dirty(e) else ""))


def _recall_lines(e: dict) -> dict | None:
    """A run's final per-class recall (``recall_final``) as table lines, in percent; None if not recorded."""
    recall = e.get("recall_final")
    if not recall:
        return None
    gmeans = (e.get("matrices") or {}).get("gmean") or [[]]
    lines = []
    named = list(zip(e["experiences"], recall.get("columns") or [], gmeans[-1] + [None] * len(e["experiences"])))
    if recall.get("global") is not None:
        named.append(("global test set", recall["global"], (e.get("scores") or {}).get("global_gmean")))
    for name, values, gmean in named:
        if values is None:
            continue
        lines.append({"name": name, "cells": [{"text": "·" if v is None else f"{100 * v:.0f}", "zero": v == 0}
                                              for v in values],
                      "gmean": "—" if gmean is None else f"{100 * gmean:.1f}"})
    width = max((len(line["cells"]) for line in lines), default=0)
    return {"lines": lines, "classes": list(range(width))}


RECALL_NOTE = ("Recall of each class (columns) on each test experience and on the stream-wide test set (rows) after "
               "the last stage; · marks a class with no test sample there. G-mean is the geometric mean of a row's "
               "recalls, so one class never predicted (recall 0, in red) makes it 0.")
RECALL_MISSING = ("These entries do not record per-class recall (recall_final, written by runs since it was added); "
                  "rerun them with --force to see which classes make G-mean 0.")


def render_run_page(table: BenchmarkTable, row) -> str:
    """A row's page: its runs' R-matrix heatmaps, final per-class recall and expert utilization."""
    from clbench.results.plots import r_matrix_figure, routing_layers, utilization_figure

    title = table.title(RANK_BY).removesuffix(" ↓").removesuffix(" ↑")
    runs = _runs(table, row)
    heatmaps = [{"hash": e["config_hash"], "caption": _run_caption(e, title), "png": _png(r_matrix_figure(e))}
                for e in runs]
    recalls = []
    for e in runs:
        lines = _recall_lines(e)
        if lines:
            recalls.append({"hash": e["config_hash"], "caption": _run_caption(e, title), **lines})
    imbalance = any("gmean_final" in e["scores"] or "global_gmean" in e["scores"] for e in runs)
    recall_note = RECALL_NOTE if recalls else RECALL_MISSING if imbalance else None
    routing = []
    for e in runs:
        if not e.get("expert_utilization"):
            continue
        layers = routing_layers(e, ROUTING_LAYERS)
        caption = (f"order {e['order_label']} · seed {e['seed']}: expert utilization per test experience after the "
                   f"last stage ({len(layers)} of {len(routing_layers(e))} MoE layers)")
        routing.append({"hash": e["config_hash"], "caption": caption, "png": _png(utilization_figure(e, layers))})
    summary = f"{runs_cell(row)} runs · " + " · ".join(f"{table.title(s)} {fmt(row.stats.get(s), score=s)}"
                                                       for s in table.scores)
    return _templates().get_template("run.html.j2").render(
        csp=CSP, label=row.label, benchmark=table.label, index=INDEX, summary=summary, heatmaps=heatmaps,
        recalls=recalls, recall_note=recall_note, routing=routing)


def render(root: str | Path) -> tuple[Path, Path]:
    """Write ``root/README.md`` and ``root/index.html`` from the entries under ``root``."""
    from clbench.errors import UserError
    from clbench.io import write_text

    root_arg = str(root)
    root = Path(root)
    # With a suite manifest, only the suite's grid is shown: entries of configs the suite no
    # longer lists (e.g. before a hyper-parameter change) stay on disk but out of the tables.
    manifest = read_manifest(root)  # a malformed suite.json is refused, not passed over
    hashes = manifest_hashes(root)
    entries = load_entries(root, hashes)
    if not entries:
        raise UserError(f"no entries in {root / 'entries'}", where=root_arg,
                        fix="run 'clbench leaderboard run --output DIR' first")
    tables = build_tables(entries, hashes, source=root_arg)
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
