"""Figures shared by TensorBoard logging and the leaderboard page (matplotlib, Agg backend)."""

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
    import numpy as np

    from clbench.results.record import single_stage

    r = np.asarray(result["r_matrix"], dtype=float)
    names = result["experiences"]
    rows = [f"after {n}" for n in (["joint"] if single_stage(result) else names)]
    if result.get("r_init") is not None:
        r = np.vstack([np.asarray(result["r_init"], dtype=float)[None, :], r])
        rows = ["untrained", *rows]
    title = f"{result['strategy']['name']} on {result['benchmark']['name']} ({result.get('order_label', '')})"
    return heatmap_figure(r, rows, names, title, higher=_higher(result), percent=result_percent(result))


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


def heatmap_figure(r, rows: list[str], columns: list[str], title: str, *, higher: bool = True,
                   percent: bool = True):
    """An R heatmap: rows and columns as labelled. Scores in [0, 1] are drawn as percentages on a
    fixed scale unless ``percent`` is False (R's metric recorded that it is none); errors (lower
    is better) on their own scale, the colour map reversed so that
    better is always brighter. Each cell's value is written in black or white, whichever
    contrasts more with the cell's colour; an unmeasured cell (NaN) is left blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    r = np.asarray(r, dtype=float)
    finite = r[np.isfinite(r)]
    unit = _unit(r, percent)
    low, high = (0.0, 1.0) if unit else (float(finite.min()), float(finite.max()) or 1.0)
    # A long stream (the theory benchmark's 100 rounds) keeps the size of a 24-experience map:
    # its cells are not numbered and every k-th experience is named.
    dense = len(columns) > MAX_CELLS
    fig, ax = plt.subplots(figsize=(1.2 + 0.62 * min(len(columns), MAX_CELLS), 0.9 + 0.42 * min(len(r), MAX_CELLS + 1)),
                           dpi=100)
    cmap = plt.get_cmap("viridis" if higher else "viridis_r")
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

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    run = list(result["experiences"])
    names = list(names or run)
    r = np.asarray(result["r_matrix"], dtype=float)
    stages = [f"+{n}" for n in run]
    if result.get("r_init") is not None:
        r = np.vstack([np.asarray(result["r_init"], dtype=float)[None, :], r])
        stages = ["untrained", *stages]
    unit = _unit(r, result_percent(result))
    scale = 100.0 if unit else 1.0
    fig, ax = plt.subplots(figsize=(2.4 + 0.45 * len(stages), 3.2), dpi=100)
    colours = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figures = result["expert_utilization"][stage]
    compositions = (result.get("route_compositions") or [{}])[stage] if result.get("route_compositions") else {}
    names = result["experiences"]
    panels = [layer for layer in layers if layer in figures]
    width = max(len(np.atleast_2d(figures[layer]["utilization"])[0]) for layer in panels) if panels else 1
    fig, axes = plt.subplots(1, max(1, len(panels)), squeeze=False, dpi=100,
                             figsize=(1.2 + (0.9 + 0.22 * width) * max(1, len(panels)),
                                      0.9 + 0.28 * min(len(names), 2 * MAX_CELLS)))
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
