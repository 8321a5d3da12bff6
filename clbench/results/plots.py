"""Figures shared by TensorBoard logging and the leaderboard page.

Drawn with matplotlib's object-oriented ``Figure``, never pyplot: a figure is an object that is
dropped when done (no global registry to close, safe in any thread), and a render does not pay
pyplot's import."""

from __future__ import annotations

from clbench.metrics.score_registry import result_percent

MAX_CELLS = 24  # experiences a heatmap shows at full size, cell by cell


def _ticks(labels: list[str]) -> tuple[list[int], list[str]]:
    """Positions and labels of at most ``MAX_CELLS`` evenly spaced ticks."""
    step = -(-len(labels) // MAX_CELLS)  # ceil
    positions = list(range(0, len(labels), step))
    return positions, [labels[i] for i in positions]


def r_matrix_figure(result: dict):
    """Heatmap of a result's R matrix: rows = after training stage (the untrained model first,
    when the result has it), columns = test experience, both in the run's order."""
    r, rows = run_order(result)
    title = f"{result['strategy']['name']} on {result['benchmark']['name']} ({result.get('order_label', '')})"
    return heatmap_figure(r, rows, result["experiences"], title, higher=_higher(result), percent=result_percent(result))


def run_order(result: dict):
    """A result's R in the run's order (the untrained row first, when recorded) and its rows' labels."""
    import numpy as np

    from clbench.results.record import single_stage

    r = np.asarray(result["r_matrix"], dtype=float)
    rows = [f"after {n}" for n in (["joint"] if single_stage(result) else result["experiences"])]
    if result.get("r_init") is not None:
        r = np.vstack([np.asarray(result["r_init"], dtype=float)[None, :], r])
        rows = ["untrained", *rows]
    return r, rows


def r_matrix_cells(result: dict) -> dict:
    """:func:`r_matrix_figure`'s heatmap as table cells (:func:`heatmap_cells`)."""
    r, rows = run_order(result)
    return heatmap_cells(r, rows, result["experiences"], higher=_higher(result), percent=result_percent(result))


def fixed_order_cells(result: dict, names: list[str]) -> dict:
    """:func:`fixed_order_figure`'s heatmap as table cells (:func:`heatmap_cells`)."""
    from clbench.results.fixed_order import fixed_order

    r, rows = fixed_order(result, names)
    return heatmap_cells(r, rows, list(names), higher=_higher(result), percent=result_percent(result))


def mean_over_orders_cells(results: list[dict], names: list[str]) -> dict:
    """:func:`mean_over_orders_figure`'s heatmap as table cells (:func:`heatmap_cells`)."""
    from clbench.results.fixed_order import mean_over_orders

    r, rows, _ = mean_over_orders(results, names)
    return heatmap_cells(r, rows, list(names), higher=_higher(results[0]), percent=result_percent(results[0]))


def _higher(result: dict) -> bool:
    return (result.get("r_metric") or {}).get("higher_is_better", True)


def _unit(r, percent: bool = True) -> bool:
    """Whether R is drawn as a percentage: its metric may be one (``percent``) and every finite
    value lies in [0, 1] (a squared error below 1 is still drawn as measured)."""
    import numpy as np

    if not percent:
        return False

    finite = np.asarray(r, dtype=float)
    finite = finite[np.isfinite(finite)]
    return finite.size == 0 or (finite.min() >= 0.0 and finite.max() <= 1.0)


def luminance(rgba) -> float:
    """WCAG 2's relative luminance of an sRGB colour (components in [0, 1])."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def text_colour(rgba) -> str:
    """Black or white, whichever has the higher WCAG contrast ratio on a cell of colour ``rgba``."""
    lum = luminance(rgba)
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def _scale(r, percent: bool = True) -> tuple[float, float, bool]:
    """The colour scale of an R heatmap: its ends and whether it is drawn as a percentage (a fixed
    [0, 1] scale), else the finite values' own range."""
    import numpy as np

    r = np.asarray(r, dtype=float)
    finite = r[np.isfinite(r)]
    unit = _unit(r, percent)
    if unit or finite.size == 0:
        return 0.0, 1.0, unit
    return float(finite.min()), float(finite.max()) or 1.0, unit


def heatmap_cells(r, rows: list[str], columns: list[str], *, higher: bool = True, percent: bool = True) -> dict:
    """An R heatmap as the cells of an HTML table, coloured as :func:`heatmap_figure` colours them:
    each cell's text (a percentage, or the value as measured), its background (viridis on the same
    scale, reversed for errors) and its text colour (black or white, whichever contrasts more);
    an unmeasured cell (NaN) is blank and uncoloured. No figure is drawn."""
    import matplotlib
    import numpy as np
    from matplotlib.colors import Normalize, to_hex

    r = np.asarray(r, dtype=float)
    low, high, unit = _scale(r, percent)
    cmap = matplotlib.colormaps["viridis" if higher else "viridis_r"]
    colours = cmap(Normalize(vmin=low, vmax=high)(r))  # every cell at once, as imshow maps them
    lines = []
    for label, values, rgbas in zip(rows, r, colours):
        cells = []
        for column, value, rgba in zip(columns, values, rgbas):
            if not np.isfinite(value):
                cells.append({"text": "", "background": None, "colour": None,
                              "title": f"{label} · {column}: not measured"})
                continue
            rgba = tuple(float(c) for c in rgba)
            text = f"{100 * value:.0f}" if unit else f"{value:.3g}"
            exact = f"{100 * value:.2f} %" if unit else f"{value:.6g}"
            cells.append({"text": text, "background": to_hex(rgba), "colour": text_colour(rgba),
                          "title": f"{label} · {column}: {exact}"})
        lines.append({"label": label, "cells": cells})
    return {"columns": list(columns), "rows": lines, "unit": unit}


def heatmap_figure(r, rows: list[str], columns: list[str], title: str, *, higher: bool = True,
                   percent: bool = True):
    """An R heatmap: rows and columns as labelled. Scores in [0, 1] are drawn as percentages on a
    fixed scale unless ``percent`` is False (R's metric recorded that it is none); errors (lower
    is better) on their own scale, the colour map reversed so that
    better is always brighter. Each cell's value is written in black or white, whichever
    contrasts more with the cell's colour; an unmeasured cell (NaN) is left blank."""
    import matplotlib
    import numpy as np
    from matplotlib.figure import Figure

    r = np.asarray(r, dtype=float)
    low, high, unit = _scale(r, percent)
    # A long stream (the theory benchmark's 100 rounds) keeps the size of a 24-experience map:
    # its cells are not numbered and every k-th experience is named.
    dense = len(columns) > MAX_CELLS
    fig = Figure(figsize=(1.2 + 0.62 * min(len(columns), MAX_CELLS), 0.9 + 0.42 * min(len(r), MAX_CELLS + 1)),
                 dpi=100)
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis" if higher else "viridis_r"]
    image = ax.imshow(r, vmin=low, vmax=high, cmap=cmap, aspect="auto")
    ax.set_xticks(*_ticks(columns), rotation=45, ha="right", fontsize=8)
    ax.set_yticks(*_ticks(rows), fontsize=8)
    for i in range(0 if dense else r.shape[0]):
        for j in range(r.shape[1]):
            if not np.isfinite(r[i, j]):
                continue
            ax.text(j, i, f"{100 * r[i, j]:.0f}" if unit else f"{r[i, j]:.3g}", ha="center", va="center",
                    fontsize=9, color=text_colour(cmap(image.norm(r[i, j]))))
    ax.set_xlabel("test experience")
    ax.set_title(title, fontsize=9)
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if unit:  # the bar in the cells' unit: percent
        from matplotlib.ticker import FuncFormatter

        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{100 * value:.0f}"))
        bar.set_label("%", fontsize=8)
    fig.tight_layout()
    return fig


def fixed_order_figure(result: dict, names: list[str]):
    """A run's R heatmap in the stream's own order ``names`` (rows "after X" and columns X name the
    same experiences in every run, whatever order it trained them in)."""
    from clbench.results.fixed_order import fixed_order

    r, rows = fixed_order(result, names)
    title = (f"{result['strategy']['name']} on {result['benchmark']['name']} ({result.get('order_label', '')}, "
             "stream order)")
    return heatmap_figure(r, rows, list(names), title, higher=_higher(result), percent=result_percent(result))


def mean_over_orders_figure(results: list[dict], names: list[str]):
    """The mean over orders of the runs' R heatmaps in the stream's own order ``names``."""
    from clbench.results.fixed_order import mean_over_orders

    r, rows, orders = mean_over_orders(results, names)
    first = results[0]
    title = (f"{first['strategy']['name']} on {first['benchmark']['name']}: mean over {orders} "
             f"order{'s' if orders != 1 else ''}")
    return heatmap_figure(r, rows, list(names), title, higher=_higher(first), percent=result_percent(first))


MAX_LINES = 20  # experiences a curves figure draws, one line and colour each


def curves_figure(result: dict, names: list[str] | None = None):
    """The plot continual-learning papers draw: x the stages of the run (the untrained model
    first, when recorded), y the score on each test experience after that stage, one line per
    experience, in the stream's own order ``names`` (the run's where None), so a line's colour
    names the same experience in every run's figure."""
    import matplotlib
    import numpy as np
    from matplotlib.figure import Figure

    run = list(result["experiences"])
    names = list(names or run)
    r = np.asarray(result["r_matrix"], dtype=float)
    stages = [f"+{n}" for n in run]
    if result.get("r_init") is not None:
        r = np.vstack([np.asarray(result["r_init"], dtype=float)[None, :], r])
        stages = ["untrained", *stages]
    unit = _unit(r, result_percent(result))
    scale = 100.0 if unit else 1.0
    fig = Figure(figsize=(2.4 + 0.45 * len(stages), 3.2), dpi=100)
    ax = fig.subplots()
    colours = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    x = np.arange(len(stages))
    for k, name in enumerate(names):
        j = run.index(name)
        ax.plot(x, scale * r[:, j], marker="o", markersize=3, linewidth=1.4, color=colours(k % colours.N), label=name)
    ax.set_xticks(x, stages, rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("after training (run order)", fontsize=8)
    ax.set_ylabel("R (%)" if unit else "R", fontsize=8)
    if unit:
        ax.set_ylim(0, 100)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(f"{result['strategy']['name']} on {result['benchmark']['name']} ({result.get('order_label', '')})",
                 fontsize=9)
    ax.legend(title="test experience", fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def _f(value: float) -> str:
    """An SVG coordinate: one decimal, no trailing zero (the same bytes for the same figure)."""
    return f"{value:.1f}".removesuffix(".0")


def curves_svg(result: dict, names: list[str] | None = None) -> str:
    """:func:`curves_figure` as inline SVG markup, written rather than drawn (no matplotlib
    layout or rasterizing): x the stages in the run's order, y the score on each test
    experience after that stage, one line and colour per experience in the stream's order
    ``names`` (the run's where None; the colours those of :func:`curves_figure`), a legend, and
    each point's value as its tooltip. An unmeasured point (NaN) breaks its line."""
    import math
    from html import escape

    import matplotlib
    import numpy as np
    from matplotlib.colors import to_hex

    run = list(result["experiences"])
    names = list(names or run)
    r, _ = run_order(result)
    stages = [f"+{n}" for n in run]
    if result.get("r_init") is not None:
        stages = ["untrained", *stages]
    unit = _unit(r, result_percent(result))
    scale = 100.0 if unit else 1.0
    values = scale * r
    finite = values[np.isfinite(values)]
    if unit:
        low, high, ticks = 0.0, 100.0, [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    else:
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if high <= low:
            low, high = low - 0.5, high + 0.5
        pad = 0.05 * (high - low)
        low, high = low - pad, high + pad
        ticks = list(np.linspace(low, high, 5))
    colours = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    left, top, width, height = 48.0, 24.0, max(150.0, 34.0 * len(stages)), 150.0
    bottom = top + height
    longest = max([len(s) for s in stages] + [1])
    legend_x = left + width + 14
    legend_w = 16 + 6.2 * max([len(n) for n in names] + [len("test experience")])
    total_w, total_h = legend_x + legend_w, bottom + 14 + 4.6 * min(longest, 24)

    def x(i: int) -> float:
        return left + width * (i + 0.5) / len(stages)

    def y(v: float) -> float:
        return bottom - height * (v - low) / (high - low)

    title = f"{result['strategy']['name']} on {result['benchmark']['name']} ({result.get('order_label', '')})"
    out = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{_f(total_w)}" height="{_f(total_h)}" '
           f'viewBox="0 0 {_f(total_w)} {_f(total_h)}" role="img" aria-label="{escape(title)}: R per test experience '
           f'over the stages">',
           f'<text x="{_f(left + width / 2)}" y="14" text-anchor="middle" class="title">{escape(title)}</text>']
    for t in ticks:
        label = f"{t:.0f}" if unit else f"{t:.3g}"
        out.append(f'<line class="grid" x1="{_f(left)}" x2="{_f(left + width)}" y1="{_f(y(t))}" y2="{_f(y(t))}"/>'
                   f'<text x="{_f(left - 4)}" y="{_f(y(t) + 3)}" text-anchor="end">{label}</text>')
    for i, stage in enumerate(stages):
        out.append(f'<line class="grid" x1="{_f(x(i))}" x2="{_f(x(i))}" y1="{_f(top)}" y2="{_f(bottom)}"/>'
                   f'<text x="{_f(x(i))}" y="{_f(bottom + 10)}" text-anchor="end" '
                   f'transform="rotate(-45 {_f(x(i))} {_f(bottom + 10)})">{escape(stage)}</text>')
    out.append(f'<rect class="frame" x="{_f(left)}" y="{_f(top)}" width="{_f(width)}" height="{_f(height)}"/>')
    out.append(f'<text x="12" y="{_f(top + height / 2)}" text-anchor="middle" '
               f'transform="rotate(-90 12 {_f(top + height / 2)})">{"R (%)" if unit else "R"}</text>')
    out.append(f'<text x="{_f(legend_x)}" y="{_f(top + 4)}">test experience</text>')
    for k, name in enumerate(names):
        j = run.index(name)
        colour = to_hex(colours(k % colours.N))
        column = values[:, j]
        segments, current = [], []
        for i, v in enumerate(column):
            if math.isfinite(v):
                current.append(f"{_f(x(i))},{_f(y(v))}")
            elif current:
                segments.append(current)
                current = []
        if current:
            segments.append(current)
        for segment in segments:
            out.append(f'<polyline points="{" ".join(segment)}" stroke="{colour}"/>')
        for i, v in enumerate(column):
            if math.isfinite(v):
                shown = f"{v:.1f}" if unit else f"{v:.4g}"
                out.append(f'<circle cx="{_f(x(i))}" cy="{_f(y(v))}" r="2.5" fill="{colour}"><title>{escape(name)} '
                           f'after {escape(stages[i])}: {shown}</title></circle>')
        ly = top + 18 + 14 * k
        out.append(f'<line x1="{_f(legend_x)}" x2="{_f(legend_x + 12)}" y1="{_f(ly - 3)}" y2="{_f(ly - 3)}" '
                   f'stroke="{colour}" stroke-width="2"/>'
                   f'<text x="{_f(legend_x + 16)}" y="{_f(ly)}">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def routing_layers(result: dict, max_layers: int | None = None) -> list[str]:
    """The MoE layers of a result's routing records, in order; ``max_layers`` picks evenly spaced ones."""
    stages = result.get("expert_utilization") or []
    layers = sorted(stages[-1]) if stages else []
    if max_layers is None or len(layers) <= max_layers:
        return layers
    step = (len(layers) - 1) / (max_layers - 1)
    return [layers[round(i * step)] for i in range(max_layers)]


def utilization_figure(result: dict, layers: list[str], stage: int = -1):
    """Per-domain expert utilization (rows: test experience, columns: expert; each row sums to 1)
    of the given MoE layers after training stage ``stage``, one panel per layer, with the layer's
    N_eff in its title when the result has it."""
    import numpy as np
    from matplotlib.figure import Figure

    figures = result["expert_utilization"][stage]
    compositions = (result.get("route_compositions") or [{}])[stage] if result.get("route_compositions") else {}
    names = result["experiences"]
    panels = [layer for layer in layers if layer in figures]
    width = max(len(np.atleast_2d(figures[layer]["utilization"])[0]) for layer in panels) if panels else 1
    fig = Figure(dpi=100, figsize=(1.2 + (0.9 + 0.22 * width) * max(1, len(panels)),
                                   0.9 + 0.28 * min(len(names), 2 * MAX_CELLS)))
    axes = fig.subplots(1, max(1, len(panels)), squeeze=False)
    for ax, layer in zip(axes[0], panels):
        u = np.atleast_2d(np.asarray(figures[layer]["utilization"], dtype=float))
        # Rows are domain ids. A stream over a subset of its benchmark's tasks (trace-mini with
        # ``tasks``) keeps each task's own id, so rows outnumber experiences: show the rows that
        # hold units, named by id, rather than put experience names on the wrong rows.
        rows = list(range(len(u)))
        labels = names[: len(u)]
        if len(u) != len(names):
            rows = [d for d in rows if not np.isnan(u[d]).all()]
            labels = [f"domain {d}" for d in rows]
        u = u[rows]
        ax.imshow(u, vmin=0.0, vmax=1.0, cmap="magma", aspect="auto")
        positions, shown = _ticks(labels)
        ax.set_yticks(positions, shown if ax is axes[0][0] else [""] * len(positions), fontsize=7)
        ax.set_xticks(range(u.shape[1]), [str(e) for e in range(u.shape[1])], fontsize=6)
        n_eff = compositions.get(layer, {}).get("n_eff")
        short = layer if len(layer) <= 28 else "…" + layer[-27:]
        ax.set_title(short + ("" if n_eff is None else f"\nN_eff {n_eff:.2f}"), fontsize=7)
        ax.set_xlabel("expert", fontsize=7)
    for ax in axes[0][len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return fig
