"""Matplotlib figures made from saved results (Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def layer_lines(path: Path, series: dict[str, tuple[Sequence[str], Sequence[float | None]]], *, title: str,
                ylabel: str, xlabel: str = "layer", hline: float | None = None) -> str:
    """One line per series over layer names; None values leave gaps (undefined figures)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for label, (layers, values) in series.items():
        xs = list(range(len(layers)))
        ys = [float("nan") if v is None else v for v in values]
        ax.plot(xs, ys, marker="o", label=label)
        ax.set_xticks(xs)
        ax.set_xticklabels(layers)
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8, linestyle="--")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path).name


def heatmap(path: Path, matrix, row_labels: Sequence[str], col_labels: Sequence[str], *, title: str,
            xlabel: str = "", ylabel: str = "", vmin: float | None = None, vmax: float | None = None,
            annotate: bool = True) -> str:
    import numpy as np

    plt = _plt()
    m = np.asarray(matrix, dtype=float)
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * len(col_labels), 1.0 + 0.5 * len(row_labels)), dpi=120)
    im = ax.imshow(m, vmin=vmin, vmax=vmax, cmap="viridis")
    ax.set_xticks(range(len(col_labels)))
    ax.set_xticklabels(col_labels)
    ax.set_yticks(range(len(row_labels)))
    ax.set_yticklabels(row_labels)
    if annotate and m.size <= 900:
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                if np.isfinite(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6, color="w")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path).name
