"""R in the stream's own experience order: the run pages' fixed-order heatmaps, their mean over
orders and the per-experience curves, on entries with known matrices."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from clbench.data.streams import resolve_order
from clbench.results.fixed_order import canonical_names, fixed_order, mean_over_orders
from clbench.results.plots import curves_figure, fixed_order_figure, heatmap_figure, mean_over_orders_figure

NAMES = ["rot0", "rot90", "rot180", "rot270", "invert"]


def _entry(order, seed: int, offset: float) -> dict:
    """A run of ``order`` whose R cells tell the stage and the test experience: after training the
    stream's experience a, R on b is offset + (10 a + b) / 100, by stream index."""
    stream = SimpleNamespace(train_stream=[SimpleNamespace(name=n) for n in NAMES])
    run = [NAMES[i] for i in resolve_order(stream, order)]  # as a run draws its order
    index = [NAMES.index(n) for n in run]
    r = [[offset + (10 * a + b) / 100 for b in index] for a in index]
    label = order if isinstance(order, str) else f"perm{order['permutation']}"
    return {"strategy": {"name": "naive"}, "benchmark": {"name": "digits-domains"}, "order": order,
            "order_label": label, "seed": seed, "experiences": run, "single_stage": False,
            "r_matrix": r, "r_init": [offset / 2 + b / 100 for b in index],
            "r_metric": {"names": ["accuracy"] * 5, "higher_is_better": True}}


def _drawn(fig) -> np.ndarray:
    values = np.asarray(fig.axes[0].images[0].get_array(), dtype=float)
    return values


def test_a_permuted_runs_fixed_order_cell_is_its_run_order_cell_of_the_same_experiences():
    permuted = _entry({"permutation": 3}, 0, 0.0)
    assert permuted["experiences"] != NAMES  # the run trained another order
    assert canonical_names([permuted]) == NAMES  # put back from the permutation's seed alone
    run = permuted["experiences"]
    drawn = _drawn(fixed_order_figure(permuted, NAMES))
    assert drawn.shape == (6, 5)
    for i, trained in enumerate(NAMES):
        for j, tested in enumerate(NAMES):
            assert drawn[1 + i, j] == permuted["r_matrix"][run.index(trained)][run.index(tested)]
            assert drawn[1 + i, j] == pytest.approx((10 * i + j) / 100)
        assert drawn[0, i] == permuted["r_init"][run.index(trained)]
    rows = [t.get_text() for t in fixed_order_figure(permuted, NAMES).axes[0].get_yticklabels()]
    assert rows == ["untrained", *(f"after {n}" for n in NAMES)]


def test_the_mean_over_orders_averages_each_orders_runs_first():
    default = [_entry("default", 0, 0.0), _entry("default", 1, 0.2)]
    reverse = [_entry("reverse", 0, 0.4)]
    permuted = [_entry({"permutation": 1}, 0, 0.1)]
    runs = [*permuted, *reverse, *default]
    assert canonical_names(runs) == NAMES
    mean, rows, orders = mean_over_orders(runs, NAMES)
    assert orders == 3 and rows[0] == "untrained"
    per_order = [np.mean([fixed_order(e, NAMES)[0] for e in group], axis=0) for group in (default, reverse, permuted)]
    np.testing.assert_allclose(mean, np.mean(per_order, axis=0))
    # the offsets: (0 + 0.2) / 2 for default, 0.4 for reverse, 0.1 for the permutation
    np.testing.assert_allclose(mean[1:], [[(0.1 + 0.4 + 0.1) / 3 + (10 * a + b) / 100 for b in range(5)]
                                          for a in range(5)])
    np.testing.assert_allclose(_drawn(mean_over_orders_figure(runs, NAMES)), mean)


def test_no_fixed_order_when_runs_train_different_experiences():
    a, b = _entry("default", 0, 0.0), _entry("default", 1, 0.0)
    b["experiences"] = [f"t{i}" for i in range(5)]  # a stream drawn anew for each seed
    assert canonical_names([a, b]) is None
    twice = {**a, "order": "order1", "experiences": ["rot0", "rot0", "rot90", "rot180", "rot270"]}
    assert canonical_names([twice]) is None
    # with no default, reverse or permutation run, the first run's order (a suite's first order)
    named = {**_entry("reverse", 0, 0.0), "order": "standard"}
    assert canonical_names([named, _entry({"permutation": 2}, 0, 0.0)]) == NAMES
    assert canonical_names([named]) == NAMES[::-1]


def test_curves_draw_each_experiences_column_over_the_stages_in_the_streams_order():
    run = _entry("reverse", 0, 0.0)
    fig = curves_figure(run, NAMES)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == NAMES
    assert [t.get_text() for t in ax.get_xticklabels()] == ["untrained", *(f"+{n}" for n in run["experiences"])]
    r = np.vstack([run["r_init"], run["r_matrix"]])
    for line, name in zip(ax.get_lines(), NAMES):
        np.testing.assert_allclose(line.get_ydata(), 100 * r[:, run["experiences"].index(name)])
    colours = [line.get_color() for line in ax.get_lines()]
    again = curves_figure(_entry({"permutation": 4}, 0, 0.0), NAMES)
    assert [line.get_color() for line in again.axes[0].get_lines()] == colours  # one colour per experience


def _contrast(a, b) -> float:
    from matplotlib.colors import to_rgba

    from clbench.results.plots import luminance

    high, low = sorted((luminance(to_rgba(a)), luminance(to_rgba(b))), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_cell_text_is_a_percentage_in_the_colour_that_contrasts_more_with_its_cell():
    values = np.linspace(0.0, 1.0, 21)
    for higher in (True, False):
        fig = heatmap_figure([values, [float("nan")] * 21], ["after a", "after b"], [str(j) for j in range(21)], "t",
                             higher=higher)
        ax = fig.axes[0]
        image = ax.images[0]
        texts = ax.texts
        assert [t.get_text() for t in texts] == [f"{100 * v:.0f}" for v in values]  # NaN: no text
        for j, text in enumerate(texts):
            cell = image.cmap(image.norm(values[j]))
            other = "white" if text.get_color() == "black" else "black"
            assert _contrast(text.get_color(), cell) >= _contrast(other, cell) and _contrast(text.get_color(), cell) > 4
        assert {t.get_color() for t in texts} == {"black", "white"}


def test_an_error_below_one_is_drawn_as_measured_not_as_a_percentage():
    """A squared error whose values happen to lie in [0, 1] (recorded as no percentage) keeps its
    unit in the heatmap and the curves; an R without a recorded unit is still read from its range."""
    from clbench.results.plots import r_matrix_figure

    run = _entry("default", 0, 0.0)
    run.update(r_metric={"names": ["mse"] * 5, "higher_is_better": False},
               metrics={"mse": {"title": "MSE", "higher_is_better": False, "percent": False}})
    fig = r_matrix_figure(run)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts[:2] == ["0", "0.01"]  # r_init 0.0 and 0.01 as measured; as a percentage: "0" and "1"
    assert fig.axes[1].get_ylabel() != "%"
    curves = curves_figure(run, NAMES)
    assert curves.axes[0].get_ylabel() == "R"
    np.testing.assert_allclose(curves.axes[0].get_lines()[0].get_ydata()[1:], [r[0] for r in run["r_matrix"]])


def test_table_cells_are_coloured_and_lettered_as_the_heatmap_draws_them():
    """The run pages' R tables: each cell's background is the colour the heatmap figure gives it,
    its text the figure's text in the figure's (most contrasting) colour; NaN is blank."""
    from matplotlib.colors import to_hex

    from clbench.results.plots import heatmap_cells

    values = np.linspace(0.0, 1.0, 21)
    for higher in (True, False):
        r = [values, [float("nan")] * 21]
        cells = heatmap_cells(r, ["after a", "after b"], [str(j) for j in range(21)], higher=higher)
        fig = heatmap_figure(r, ["after a", "after b"], [str(j) for j in range(21)], "t", higher=higher)
        image, texts = fig.axes[0].images[0], fig.axes[0].texts
        first, blank = cells["rows"]
        assert [c["text"] for c in first["cells"]] == [t.get_text() for t in texts]
        assert [c["colour"] for c in first["cells"]] == [t.get_color() for t in texts]
        assert [c["background"] for c in first["cells"]] == [to_hex(image.cmap(image.norm(v))) for v in values]
        assert all(c["text"] == "" and c["background"] is None for c in blank["cells"])
        assert first["cells"][3]["title"] == "after a · 3: 15.00 %"


def test_fixed_order_cells_hold_the_stream_order_values_and_the_mean():
    from clbench.results.plots import fixed_order_cells, mean_over_orders_cells, r_matrix_cells

    permuted = _entry({"permutation": 3}, 0, 0.0)
    cells = fixed_order_cells(permuted, NAMES)
    assert cells["columns"] == NAMES
    assert [row["label"] for row in cells["rows"]] == ["untrained", *(f"after {n}" for n in NAMES)]
    assert [[c["text"] for c in row["cells"]] for row in cells["rows"][1:]] == [[f"{10 * a + b}" for b in range(5)]
                                                                                for a in range(5)]
    run = r_matrix_cells(permuted)  # the same run in its own order
    assert run["columns"] == permuted["experiences"]
    assert [[c["text"] for c in row["cells"]] for row in run["rows"][1:]] == [[f"{100 * v:.0f}" for v in line]
                                                                              for line in permuted["r_matrix"]]
    runs = [_entry("default", 0, 0.0), _entry("reverse", 0, 0.2)]
    mean = mean_over_orders_cells(runs, NAMES)
    assert [c["text"] for c in mean["rows"][1]["cells"]] == [f"{100 * (0.1 + b / 100):.0f}" for b in range(5)]


def test_curves_svg_draws_each_experiences_column_in_the_figures_colours():
    """The run pages' curves: written as SVG, one polyline per experience in the stream's order,
    coloured as :func:`curves_figure` colours them, a point per stage with its value as tooltip."""
    import re

    from matplotlib.colors import to_hex

    from clbench.results.plots import curves_svg

    run = _entry("reverse", 0, 0.0)
    svg = curves_svg(run, NAMES)
    assert svg.startswith('<svg class="plot"') and svg.endswith("</svg>")
    lines = re.findall(r'<polyline points="([^"]+)" stroke="(#[0-9a-f]{6})"/>', svg)
    assert len(lines) == len(NAMES)
    fig = curves_figure(run, NAMES)
    assert [colour for _, colour in lines] == [to_hex(line.get_color()) for line in fig.axes[0].get_lines()]
    assert all(len(points.split()) == 1 + len(NAMES) for points, _ in lines)  # untrained + one point per stage
    r = np.vstack([run["r_init"], run["r_matrix"]])
    tips = re.findall(r"<title>rot90 after ([^:]+): ([0-9.]+)</title>", svg)
    assert [stage for stage, _ in tips] == ["untrained", *(f"+{n}" for n in run["experiences"])]
    assert [float(v) for _, v in tips] == [round(100 * v, 1) for v in r[:, run["experiences"].index("rot90")]]
    # an unmeasured point breaks its line; a name is escaped
    gap = {**run, "r_matrix": [[float("nan")] + line[1:] if k == 2 else line for k, line in enumerate(run["r_matrix"])],
           "experiences": ["<b>", *run["experiences"][1:]]}
    svg = curves_svg(gap)
    assert "<b>" not in svg and "&lt;b&gt;" in svg and svg.count("<polyline") == len(NAMES) + 1
