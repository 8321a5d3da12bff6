"""Figures shared by TensorBoard logging and the leaderboard page (matplotlib, Agg backend)."""

from __future__ import annotations


def r_matrix_figure(result: dict, key: str = "r_matrix"):
    """Heatmap of a result's R matrix: rows = after training stage (the untrained model first,
    when the result has it), columns = test experience. Scores in [0, 1] are drawn as
    percentages on a fixed scale; errors (lower is better) on their own scale, the colour map
    reversed so that better is always brighter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    r = np.asarray(result[key], dtype=float)
    names = result["experiences"]
    rows = [f"after {n}" for n in (names if len(r) == len(names) else ["joint"] * len(r))]
    if key == "r_matrix" and result.get("r_init") is not None:
        r = np.vstack([np.asarray(result["r_init"], dtype=float)[None, :], r])
        rows = ["untrained", *rows]
    higher = (result.get("r_metric") or {}).get("higher_is_better", True)
    finite = r[np.isfinite(r)]
    unit = finite.size == 0 or (finite.min() >= 0.0 and finite.max() <= 1.0)
    low, high = (0.0, 1.0) if unit else (float(finite.min()), float(finite.max()) or 1.0)
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * len(names), 0.8 + 0.5 * len(r)), dpi=100)
    image = ax.imshow(r, vmin=low, vmax=high, cmap="viridis" if higher else "viridis_r")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(r)), rows, fontsize=8)
    middle = low + 0.6 * (high - low)
    for i in range(r.shape[0]):
        for j in range(r.shape[1]):
            bright = (r[i, j] >= middle) == higher
            ax.text(j, i, f"{100 * r[i, j]:.0f}" if unit else f"{r[i, j]:.3g}", ha="center", va="center",
                    fontsize=7, color="black" if bright else "white")
    ax.set_xlabel("test experience")
    ax.set_title(f"{result['strategy']['name']} on {result['benchmark']['name']} ({result.get('order_label', '')})",
                 fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig
