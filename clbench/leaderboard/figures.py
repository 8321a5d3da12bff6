"""The leaderboard page's own figures, and how every page figure is embedded.

:func:`png_uri` turns a matplotlib figure into the ``data:`` URI the pages embed (a palette PNG
without software metadata, so unchanged entries render to identical bytes);
:func:`order_bar_figure` is the index page's per-order chart and :func:`groups_figure` its
critical-difference diagram. The run pages draw no R heatmap: their R matrices are HTML tables
and their curves inline SVG (:mod:`clbench.results.plots`); only a long stream's heatmap and
the expert utilization are PNGs.
"""

from __future__ import annotations

import base64
import io

from clbench.leaderboard.stats import ALPHA, TEST, Groups
from clbench.leaderboard.table import arrow
from clbench.metrics.score_registry import shown
from clbench.metrics.score_registry import title as score_title

BAR_METRIC = "acc"  # the score the index page charts per task order


PNG_COLOURS = 64  # a page's figures as palette PNGs: about a quarter of the bytes, the text as sharp


def png_uri(fig) -> str:
    """The figure as a ``data:`` URI of a 72-dpi palette PNG (no software metadata, so unchanged
    entries give identical bytes). It is drawn once, in the layout its
    function gave it (``tight_layout``): ``bbox_inches="tight"`` would draw it twice."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, metadata={"Software": None})
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    small = io.BytesIO()
    image.quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        small, format="png", optimize=True)
    return "data:image/png;base64," + base64.b64encode(small.getvalue()).decode("ascii")


def order_bar_figure(comparison: dict, metric: str = BAR_METRIC, title: str | None = None):
    """Grouped bars: one group per strategy, one bar per task order (mean over seeds)."""
    import numpy as np
    from matplotlib.figure import Figure

    strategies = comparison["strategies"]
    orders = comparison["orders"]
    x = np.arange(len(strategies))
    width = 0.8 / max(1, len(orders))
    percent = comparison.get("percent", True)
    factor = 100.0 if percent else 1.0  # a percentage is drawn x 100, an error in its own unit
    fig = Figure(figsize=(1.6 + 1.1 * len(strategies), 3.2), dpi=100)
    ax = fig.subplots()
    for k, order in enumerate(orders):
        heights = [factor * s["per_order"].get(order, np.nan) for s in strategies]
        ax.bar(x - 0.4 + width * (k + 0.5), heights, width, label=order)
    ax.set_xticks(x, [s["label"] for s in strategies], rotation=20, ha="right", fontsize=8)
    higher = comparison.get("higher_is_better", True)
    title = title or score_title(metric) + ("" if higher else f" {arrow(higher)}")
    ax.set_ylabel(f"{title} (%)" if percent else title)
    if higher and percent:
        ax.set_ylim(0, 100)
    else:  # an error need not stay below 100 %
        ax.set_ylim(bottom=0)
    ax.set_title(f"{comparison['benchmark']}: {title} per task order", fontsize=9)
    ax.legend(title="order", fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def groups_figure(groups: Groups, title: str, benchmark: str, percent: bool = True):
    """A critical-difference diagram (Demšar 2006's picture, on the score instead of mean ranks):
    each method hangs from its mean on the score axis (better to the right), a thick bar joins
    methods of one group, and the bar at the top is the largest pair's critical difference.
    ``percent``: the score is a percentage (drawn x 100), else drawn in its own unit."""
    from matplotlib.figure import Figure

    order = sorted(groups.means, key=lambda m: (-groups.means[m] if groups.higher else groups.means[m], m))
    factor = 100.0 if percent else 1.0
    x = {m: factor * groups.means[m] for m in order}
    k = len(order)
    members = [g for g in groups.groups if len(g) > 1]
    low, high = min(x.values()), max(x.values())
    cd = factor * groups.critical[1] if groups.critical else 0.0
    span = max(high - low, cd, 1.0 if percent else 0.01)
    left, right = low - 0.08 * span, high + 0.08 * span
    half = (k + 1) // 2
    bar_y = [-0.8 - 0.3 * i for i in range(len(members))]
    rows_top = (bar_y[-1] if bar_y else -0.2) - 0.45
    fig = Figure(figsize=(7.5, 1.3 + 0.32 * max(half, k - half) + 0.2 * len(members)), dpi=100)
    ax = fig.subplots()
    ax.axhline(0, color="black", lw=1)
    for i, m in enumerate(order):  # better half labelled on the better side
        row = i if i < half else k - 1 - i
        y = rows_top - 0.38 * row
        side = right if i < half else left
        if not groups.higher:
            side = left if i < half else right
        ax.plot([x[m], x[m], side], [0, y, y], color="0.35", lw=0.8)
        ax.plot([x[m]], [0], "o", color="black", ms=3)
        ax.text(side, y, f" {m} {shown(groups.means[m], percent)} ({groups.letters.get(m, '')}) ", va="center", fontsize=8,
                ha="left" if side == right else "right")
    for y, group in zip(bar_y, members):
        xs = [x[m] for m in group]
        ax.plot([min(xs) - 0.01 * span, max(xs) + 0.01 * span], [y, y], color="tab:red", lw=4,
                solid_capstyle="round")
    if groups.critical:
        start = low if groups.higher else high
        ax.plot([start, start + (cd if groups.higher else -cd)], [0.45, 0.45], color="black", lw=1.5)
        ax.text(start, 0.6, f"critical difference {cd:.{1 if percent else 2}f}", fontsize=8, va="bottom", ha="left")
    ax.set_xlim(left, right) if groups.higher else ax.set_xlim(right, left)
    ax.set_ylim(rows_top - 0.38 * max(half, k - half), 1.1)
    ax.set_yticks([])
    for spine in ("left", "right", "top"):
        ax.spines[spine].set_visible(False)
    ax.spines["bottom"].set_position(("data", 0))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_title(f"{benchmark}: rank groups on {title} ({TEST}, α = {ALPHA}; better →)", fontsize=9)
    fig.tight_layout()
    return fig
