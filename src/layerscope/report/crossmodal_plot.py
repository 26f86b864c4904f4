"""The crossmodal heat map: one panel per figure over (image layer, text layer), the best pair marked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layerscope.report.crossmodal_results import CrossmodalResult

TITLES = {"mutual_knn": "mutual k-NN", "cka": "linear CKA", "a_to_b": "image -> caption acc@k",
          "b_to_a": "caption -> image acc@k"}


def heatmap(combined: CrossmodalResult, out_dir: Path) -> list[str]:
    """``crossmodal_heatmap.png`` and ``.svg`` from a crossmodal run's combined figures; the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f for f in TITLES if f in combined.figures]
    if not names:
        return []
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    best, cell = combined.best, combined.best_cell
    for ax, name in zip(axes[0], names):
        im = ax.imshow(combined.figures[name].value, origin="lower", aspect="auto", cmap="viridis")
        ax.set_title(TITLES[name], fontsize=10)
        ax.set_xlabel("text layer")
        ax.set_ylabel("image layer")
        ax.set_xticks(range(len(combined.text_layers)), combined.text_layers, fontsize=7)
        ax.set_yticks(range(len(combined.image_layers)), combined.image_layers, fontsize=7)
        if best is not None and best.figure == name:
            ax.plot(cell[1], cell[0], marker="s", markersize=10, markerfacecolor="none", markeredgecolor="red")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"{combined.n} image-caption pairs", fontsize=10)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for ext in ("png", "svg"):
        path = out_dir / f"crossmodal_heatmap.{ext}"
        fig.savefig(path, dpi=110)
        written.append(path.name)
    plt.close(fig)
    return written

