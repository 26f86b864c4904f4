"""The crossmodal heat map: one panel per figure over (image layer, text layer), the best pair marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TITLES = {"mutual_knn": "mutual k-NN", "cka": "linear CKA", "a_to_b": "image -> caption acc@k",
          "b_to_a": "caption -> image acc@k"}


def heatmap(combined: dict[str, Any], out_dir: Path) -> list[str]:
    """``crossmodal_heatmap.png`` and ``.svg`` from a crossmodal run's combined figures; the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figures = combined["figures"]
    names = [f for f in TITLES if f in figures]
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    best = combined.get("best") or {}
    for ax, name in zip(axes[0], names):
        value = np.array(figures[name]["value"], dtype=float)
        im = ax.imshow(value, origin="lower", aspect="auto", cmap="viridis")
        ax.set_title(TITLES[name], fontsize=10)
        ax.set_xlabel("text layer")
        ax.set_ylabel("image layer")
        ax.set_xticks(range(len(combined["text_layers"])), combined["text_layers"], fontsize=7)
        ax.set_yticks(range(len(combined["image_layers"])), combined["image_layers"], fontsize=7)
        if best.get("figure") == name:
            ax.plot(combined["text_layers"].index(best["text_layer"]), combined["image_layers"].index(best["image_layer"]),
                    marker="s", markersize=10, markerfacecolor="none", markeredgecolor="red")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"{combined['n']} image-caption pairs", fontsize=10)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for ext in ("png", "svg"):
        path = out_dir / f"crossmodal_heatmap.{ext}"
        fig.savefig(path, dpi=110)
        written.append(path.name)
    plt.close(fig)
    return written

