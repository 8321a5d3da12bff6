"""Render a leaderboard directory: ``README.md`` (tables) and a self-contained ``index.html``.

The page needs nothing but a browser: figures are matplotlib PNGs embedded as ``data:`` URIs,
the sortable table is a few lines of inline script, and a Content-Security-Policy forbids
every network fetch, so it opens from disk or a CI artifact as it is. Output is a pure
function of the entries (no timestamps, PNGs without software metadata), so re-rendering
unchanged entries gives identical files.

Sorting: click (or Enter on) a column header; the first click sorts the way "better" points
(descending for higher-is-better scores, ascending for rank, forgetting and the levels of an R
of errors). ``index.html?sort=<key>&dir=asc``
opens the page sorted, which is also how the tests drive the sorter in headless Chromium.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from clbench.leaderboard.compare import compare_table
from clbench.leaderboard.entries import load_entries
from clbench.leaderboard.manifest import manifest_hashes, read_manifest
from clbench.leaderboard.table import (RANK_BY, TITLES, BenchmarkTable, arrow, build_tables, fmt, made_dirty,
                                      runs_cell, scoring)

README = "README.md"
INDEX = "index.html"
BAR_METRIC = "acc"


# -- provenance -----------------------------------------------------------------------------
def _provenance(entries: list[dict], root: Path, manifest: dict | None) -> dict:
    def distinct(values) -> list[str]:
        return sorted({str(v) for v in values if v})

    failed = sum(e["status"] == "failed" for e in entries)
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
    ok = [e for e in entries if e["status"] == "ok"]
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


def _routing_section(table: BenchmarkTable) -> list[str]:
    """Per-run heatmaps of the final stage's per-domain expert utilization, folded away."""
    from clbench.plots import routing_layers, utilization_figure

    parts = []
    for row in table.rows:
        runs = [e for e in sorted(row.ok, key=lambda e: (table.orders.index(e["order_label"]), e["seed"]))
                if e.get("expert_utilization")]
        for e in runs:
            layers = routing_layers(e, ROUTING_LAYERS)
            total = len(routing_layers(e))
            caption = (f"{row.label} · order {e['order_label']} · seed {e['seed']}: expert utilization per test "
                       f"experience after the last stage ({len(layers)} of {total} MoE layers)")
            parts.append(f'<figure class="routing" data-hash="{_e(e["config_hash"])}"><img alt="{_e(caption)}" '
                         f'src="{_png(utilization_figure(e, layers))}"><figcaption>{_e(caption)}</figcaption></figure>')
    if not parts:
        return []
    return ["<details><summary>Expert utilization (rows: test experience; columns: expert)</summary>",
            '<div class="grid">', *parts, "</div></details>"]


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
              f"{NOTES} Open [`index.html`]({INDEX}) for the sortable table, R-matrix heatmaps of every run "
              "and per-order charts; `clbench compare` gives the comparison across task orders.", ""]
    for table in tables:
        lines += [f"## {table.label}", "", _meta_line(_bench_meta(table)), ""]
        for note in (direction_note(table), routing_note(table)):
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
        if dirty_note(table):
            lines += [dirty_note(table), ""]
    failed = [e for e in entries if e["status"] == "failed"]
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


def order_bar_figure(comparison: dict, metric: str = BAR_METRIC):
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
    title = TITLES.get(metric, metric) + ("" if higher else f" {arrow(higher)}")
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


def _heatmap(entry: dict) -> str:
    from clbench.plots import r_matrix_figure

    return _png(r_matrix_figure(entry))


# -- HTML -----------------------------------------------------------------------------------
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       padding: 0 1rem; color: #1d2327; }
h1 { margin-bottom: .2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; }
.meta, .note { color: #555; } code { background: #f3f3f3; padding: 0 .25rem; border-radius: 3px; }
.dirty { color: #b3261e; font-weight: 600; }
table.sortable { border-collapse: collapse; margin: .8rem 0; }
table.sortable th, table.sortable td { padding: .3rem .6rem; border-bottom: 1px solid #e4e4e4; }
table.sortable th { cursor: pointer; user-select: none; background: #f6f8fa; text-align: right; white-space: nowrap; }
table.sortable th[aria-sort=ascending]::after { content: " ▲"; }
table.sortable th[aria-sort=descending]::after { content: " ▼"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text, th.text { text-align: left; }
.grid { display: flex; flex-wrap: wrap; gap: .6rem; }
figure { margin: 0; } figcaption { font-size: 12px; color: #555; }
"""

SCRIPT = """
(function () {
  "use strict";
  function key(row, i, numeric) {
    var cell = row.cells[i];
    var raw = cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent;
    return numeric ? (raw === "" ? NaN : parseFloat(raw)) : raw.toLowerCase();
  }
  function sortTable(table, i, dir) {
    var head = table.tHead.rows[0].cells;
    var numeric = head[i].getAttribute("data-type") === "num";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a, i, numeric), y = key(b, i, numeric);
      if (numeric) {
        if (isNaN(x) || isNaN(y)) { return isNaN(x) - isNaN(y); }
        return dir === "asc" ? x - y : y - x;
      }
      return dir === "asc" ? x.localeCompare(y) : y.localeCompare(x);
    });
    rows.forEach(function (r) { body.appendChild(r); });
    Array.prototype.forEach.call(head, function (c) { c.removeAttribute("aria-sort"); });
    head[i].setAttribute("aria-sort", dir === "asc" ? "ascending" : "descending");
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      th.tabIndex = 0;
      function go() {
        var now = th.getAttribute("aria-sort");
        var dir = now ? (now === "ascending" ? "desc" : "asc") : (th.getAttribute("data-first") || "desc");
        sortTable(table, i, dir);
      }
      th.addEventListener("click", go);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") { go(); } });
    });
    table.setAttribute("data-sortable-ready", "1");
  });
  var params = new URLSearchParams(window.location.search);
  var wanted = params.get("sort");
  if (wanted) {
    Array.prototype.forEach.call(tables, function (table) {
      var head = Array.prototype.slice.call(table.tHead.rows[0].cells);
      var i = head.findIndex(function (c) { return c.getAttribute("data-key") === wanted; });
      if (i >= 0) { sortTable(table, i, params.get("dir") === "asc" ? "asc" : "desc"); }
    });
  }
  document.documentElement.setAttribute("data-ready", "1");
})();
"""

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "base-uri 'none'; form-action 'none'")


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _html_table(table: BenchmarkTable) -> str:
    cols = [("rank", "Rank", "num", "asc"), ("strategy", "Strategy", "text", "asc"), ("runs", "Runs", "num", "desc")]
    cols += [(s, table.title(s), "num", "desc" if table.higher.get(s, True) else "asc") for s in table.scores]
    cols.append(("wall", "Wall s", "num", "asc"))
    head = "".join(f'<th data-key="{k}" data-type="{t}" data-first="{d}" class="{t}" scope="col">{_e(title)}</th>'
                   for k, title, t, d in cols)
    body = []
    for row in table.rows:
        cells = [f'<td class="num" data-value="{row.rank if row.rank is not None else ""}">{row.rank or "—"}</td>',
                 f'<td class="text">{_e(row.label)}' + (f' <sup class="dirty" title="made from uncommitted code">'
                                                        f'{DIRTY_MARK}</sup>' if row.dirty else "") + '</td>',
                 f'<td class="num" data-value="{len(row.ok)}">{_e(runs_cell(row))}</td>']
        for s in table.scores:
            stat = row.stats.get(s)
            value = "" if stat is None else repr(stat.mean)
            title = "" if stat is None else f' title="n = {stat.n}"'
            cells.append(f'<td class="num" data-value="{value}"{title}>{_e(fmt(stat, score=s))}</td>')
        wall = row.wall_seconds
        cells.append(f'<td class="num" data-value="{"" if wall is None else repr(wall)}">'
                     f'{"—" if wall is None else f"{wall:.1f}"}</td>')
        body.append(f'<tr data-strategy="{_e(row.label)}">' + "".join(cells) + "</tr>")
    return (f'<table class="sortable" data-benchmark="{_e(table.label)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def render_html(tables: list[BenchmarkTable], entries: list[dict], info: dict, root_arg: str) -> str:
    parts = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
             f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             "<title>clbench leaderboard</title>", f"<style>{CSS}</style></head><body>", "<h1>clbench leaderboard</h1>"]
    manifest = info["suite"]
    if manifest:
        desc = f": {_e(manifest['description'])}" if manifest.get("description") else ""
        parts.append(f'<p class="meta">Suite <code>{_e(manifest["name"])}</code> '
                     f'(<code>{_e(manifest.get("source", ""))}</code>){desc}</p>')
    status = f"{info['runs']} runs" + (f", {info['failed']} failed" if info["failed"] else "")
    if info["missing"]:
        status += f", {info['missing']} of the suite's runs not yet run"
    if info["dirty"]:
        status += f", {info['dirty']} made from uncommitted code ({DIRTY_MARK})"
    parts.append(f'<p class="meta">{_e(status)} · {_e(", ".join(info["harness"]))} · commit '
                 f'{_e(", ".join(info["commits"]) or "unknown")} · device {_e(", ".join(info["devices"]) or "unknown")}'
                 f' · torch {_e(", ".join(info["torch"]) or "unknown")}</p>')
    parts.append(f'<p class="meta">Regenerate: <code>{_e(_regenerate(root_arg, manifest))}</code></p>')
    parts.append(f'<p class="note">{_e(NOTES)} Click a column header to sort.</p>')
    for table in tables:
        parts.append(f'<section class="benchmark" id="{_e(table.label)}"><h2>{_e(table.label)}</h2>')
        parts.append(f'<p class="meta">{_e(_meta_line(_bench_meta(table)))}</p>')
        for note in (direction_note(table), routing_note(table)):
            if note:
                parts.append(f'<p class="note">{_e(note)}</p>')
        parts.append(_html_table(table))
        if dirty_note(table):
            parts.append(f'<p class="note dirty">{_e(dirty_note(table))}</p>')
        if BAR_METRIC in table.scores:
            comparison = compare_table(table, BAR_METRIC)
            rs = comparison["rank_stability"]
            tau = rs["kendall_tau_mean"]
            parts.append(f'<h3>Across task orders</h3><p class="meta">Rank stability across orders: Kendall\'s tau '
                         f'{"—" if tau is None else f"{tau:.3f}"} (mean over {len(rs["pairs"])} order pairs).</p>')
            parts.append(f'<img class="orders" alt="{_e(table.label)}: ACC per task order" '
                         f'src="{_png(order_bar_figure(comparison))}">')
        parts.append("<h3>R matrices (rows: after training stage; columns: test experience; %)</h3>")
        for row in table.rows:
            runs = sorted(row.ok, key=lambda e: (table.orders.index(e["order_label"]), e["seed"]))
            if not runs:
                continue
            parts.append(f'<h4>{_e(row.label)}</h4><div class="grid">')
            for e in runs:
                acc = e["scores"].get(RANK_BY)
                caption = f"order {e['order_label']} · seed {e['seed']}" + (
                    f" · ACC {100 * acc:.1f}" if isinstance(acc, (int, float)) else "") + (
                    f" · {DIRTY_MARK} uncommitted code" if made_dirty(e) else "")
                parts.append(f'<figure class="heatmap" data-hash="{_e(e["config_hash"])}">'
                             f'<img alt="R matrix of {_e(row.label)}, {_e(caption)}" src="{_heatmap(e)}">'
                             f"<figcaption>{_e(caption)}</figcaption></figure>")
            parts.append("</div>")
        parts += _routing_section(table)
        parts.append("</section>")
    failed = [e for e in entries if e["status"] == "failed"]
    if failed:
        parts.append('<section id="failed"><h2>Failed runs</h2><ul>')
        for e in failed:
            parts.append(f"<li>{_e(e['strategy']['name'])} on {_e(e['benchmark']['name'])}, order "
                         f"{_e(e['order_label'])}, seed {e['seed']} (<code>{_e(e['config_hash'][:12])}</code>): "
                         f"{_e(e['error'])}</li>")
        parts.append("</ul></section>")
    parts.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(parts) + "\n"


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
    write_text(index, render_html(tables, entries, info, root_arg))
    return readme, index
