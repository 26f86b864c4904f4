"""What each saved matplotlib figure shows, read from the figure objects just before they are written:
titles, axis labels, legend entries, tick labels and the colour limits of images."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Shown:
    file: str
    titles: list[str] = field(default_factory=list)
    xlabels: list[str] = field(default_factory=list)
    ylabels: list[str] = field(default_factory=list)
    legends: list[str] = field(default_factory=list)
    xticks: list[list[str]] = field(default_factory=list)
    clims: list[tuple[float, float]] = field(default_factory=list)

    def title(self) -> str:
        return " ".join(" ".join(self.titles).split())


def capture(monkeypatch) -> dict[str, Shown]:
    """Patch the one place figures are saved; returns {file name: Shown}, filled as plots are written."""
    from pathlib import Path

    import layerscope.report.plots as plots

    seen: dict[str, Shown] = {}
    real = plots.save

    def save(plt, fig, path):
        shown = Shown(Path(path).name)
        fig.canvas.draw()  # tick labels are filled in at draw time
        for ax in fig.axes:
            if ax.get_title():
                shown.titles.append(ax.get_title())
            shown.xlabels.append(ax.get_xlabel())
            shown.ylabels.append(ax.get_ylabel())
            shown.xticks.append([t.get_text() for t in ax.get_xticklabels()])
            legend = ax.get_legend()
            if legend is not None:
                shown.legends += [t.get_text() for t in legend.get_texts()]
            shown.clims += [tuple(float(v) for v in im.get_clim()) for im in ax.get_images()]
        for legend in fig.legends:
            shown.legends += [t.get_text() for t in legend.get_texts()]
        if fig._suptitle is not None:
            shown.titles.append(fig._suptitle.get_text())
        seen[shown.file] = shown
        return real(plt, fig, path)

    monkeypatch.setattr(plots, "save", save)
    return seen
