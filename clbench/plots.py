"""Figures shared by TensorBoard logging and the leaderboard page (matplotlib, Agg backend)."""

from __future__ import annotations


def r_matrix_figure(result: dict, key: str = "r_matrix"):
    """Heatmap of a result's R matrix: rows = after training stage, columns = test experience."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    r = np.asarray(result[key], dtype=float)
    names = result["experiences"]
    rows = names if len(r) == len(names) else ["joint"] * len(r)
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * len(names), 0.8 + 0.5 * len(r)), dpi=100)
    image = ax.imshow(r, vmin=0.0, vmax=1.0, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(r)), [f"after {n}" for n in rows], fontsize=8)
    for i in range(r.shape[0]):
        for j in range(r.shape[1]):
            ax.text(j, i, f"{100 * r[i, j]:.0f}", ha="center", va="center", fontsize=7,
                    color="white" if r[i, j] < 0.6 else "black")
    ax.set_xlabel("test experience")
    ax.set_title(f"{result['strategy']['name']} on {result['benchmark']['name']} ({result.get('order_label', '')})",
                 fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig
