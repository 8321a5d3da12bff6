"""The leaderboard page's own figures, and how every page figure is embedded.

:func:`png_uri` turns a matplotlib figure into the ``data:`` URI the pages embed (a palette PNG
without software metadata, so unchanged entries render to identical bytes);
:func:`order_bar_figure` is the index page's per-order chart. The run pages' figures (R
heatmaps, curves, utilization) are drawn by :mod:`clbench.results.plots`.
"""

from __future__ import annotations

import base64
import io

from clbench.leaderboard.table import arrow
from clbench.metrics.score_registry import title as score_title

BAR_METRIC = "acc"  # the score the index page charts per task order


PNG_COLOURS = 64  # a page's figures as palette PNGs: about a quarter of the bytes, the text as sharp


def png_uri(fig) -> str:
    """The figure as a ``data:`` URI of a 72-dpi palette PNG (no software metadata, so unchanged
    entries give identical bytes); the figure is closed."""
    import matplotlib.pyplot as plt
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    small = io.BytesIO()
    image.quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        small, format="png", optimize=True)
    return "data:image/png;base64," + base64.b64encode(small.getvalue()).decode("ascii")


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
    percent = comparison.get("percent", True)
    factor = 100.0 if percent else 1.0  # a percentage is drawn x 100, an error in its own unit
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(strategies), 3.2), dpi=100)
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
