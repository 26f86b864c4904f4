"""Matplotlib figures made from saved results (Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _target(path) -> Path:
    """Where a plot goes: a plain name inside its result dir, a symlink there replaced, not followed."""
    from layerscope.report.writer import output_path

    return output_path(Path(path).parent, Path(path).name)


def _layer_order(series) -> list[str]:
    """All layer names of every series, in model order (raw, 0, 1, ...; unknown names keep first-seen order)."""
    names: list[str] = []
    for layers, _ in series.values():
        for name in layers:
            if str(name) not in names:
                names.append(str(name))

    def key(name: str):
        if name == "raw":
            return (0, -1, "")
        try:
            return (0, int(name), "")
        except ValueError:
            return (1, names.index(name), name)

    return sorted(names, key=key)


def _finish(plt, fig, ax, path: Path, *, title: str, xlabel: str, ylabel: str, hline: float | None,
            legend: bool) -> str:
    """The common end of a line plot: reference line, labels, grid, legend, save, close."""
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8, linestyle="--")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(_target(path))
    plt.close(fig)
    return Path(path).name


def layer_lines(path: Path, series: dict[str, tuple[Sequence[str], Sequence[float | None]]], *, title: str,
                ylabel: str, xlabel: str = "layer", hline: float | None = None) -> str:
    """One line per series over layer names; None values leave gaps (undefined figures).

    Series may cover different layers (models of different depth side by side): the x axis is the
    union of their layer names, each series drawn at its own names.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    order = _layer_order(series)
    pos = {name: i for i, name in enumerate(order)}
    for label, (layers, values) in series.items():
        xs = [pos[str(name)] for name in layers]
        ys = [float("nan") if v is None else v for v in values]
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order)
    return _finish(plt, fig, ax, path, title=title, xlabel=xlabel, ylabel=ylabel, hline=hline,
                   legend=bool(series))


def xy_lines(path: Path, series: dict[str, tuple[Sequence[float], Sequence[float | None]]], *, title: str,
             xlabel: str, ylabel: str, logx: bool = False, hline: float | None = None) -> str:
    """One line per series over numeric x values (e.g. kept dimensions); None values leave gaps."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for label, (xs, values) in series.items():
        ax.plot(list(xs), [float("nan") if v is None else v for v in values], marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
        ticks = sorted({x for xs, _ in series.values() for x in xs})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(int(t)) for t in ticks])
    return _finish(plt, fig, ax, path, title=title, xlabel=xlabel, ylabel=ylabel, hline=hline,
                   legend=bool(series))


def bars(path: Path, groups: dict[str, dict[str, float | None]], *, title: str, ylabel: str) -> str:
    """Grouped bars: one group per key of ``groups``, one bar per inner key; None bars are left out."""
    import numpy as np

    plt = _plt()
    labels = []
    for inner in groups.values():
        for k in inner:
            if k not in labels:
                labels.append(k)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * max(1, len(labels)) / 2), 4.5), dpi=120)
    width = 0.8 / max(1, len(labels))
    xs = np.arange(len(groups))
    for j, label in enumerate(labels):
        vals = [inner.get(label) for inner in groups.values()]
        heights = [float("nan") if v is None else v for v in vals]
        rects = ax.bar(xs + j * width - 0.4 + width / 2, heights, width, label=label)
        for r, v in zip(rects, vals):
            if v is not None:
                ax.annotate(f"{v:.3f}", (r.get_x() + r.get_width() / 2, r.get_height()), ha="center",
                            va="bottom", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels(list(groups))
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(_target(path))
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
    fig.savefig(_target(path))
    plt.close(fig)
    return Path(path).name
