"""Matplotlib figures made from saved results (Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


from contextlib import contextmanager
from contextvars import ContextVar


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _target(path) -> Path:
    """Where a plot goes: a plain name inside its result dir, a symlink there replaced, not followed."""
    from layerscope.report.writer import output_path

    return output_path(Path(path).parent, Path(path).name)


_DEPTHS: ContextVar[dict[str, int] | None] = ContextVar("layerscope_relative_depths", default=None)


@contextmanager
def depth_axis(depths: dict[str, int] | None):
    """Within the block, :func:`layer_lines` over layers draws models of different depth at relative depth
    (``depths``: each model's number of layers, from ``report.depth.relative_depths``; None: the layer axis),
    the axis report.html draws for the same results."""
    token = _DEPTHS.set(depths)
    try:
        yield
    finally:
        _DEPTHS.reset(token)


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

    ordered = sorted(names, key=key)
    numbers = [int(n) for n in ordered if n.lstrip("-").isdigit()]
    if numbers:  # the layers between measured ones get their place on the axis, so a gap shows as a gap
        missing = [str(k) for k in range(min(numbers), max(numbers) + 1) if str(k) not in ordered]
        ordered = sorted(ordered + missing, key=lambda n: key(n) if n not in missing else (0, int(n), ""))
    return ordered


def _break_gaps(xs: list[int], *columns: list) -> tuple[list, ...]:
    """Points in x order with a NaN between two that are not next to each other on the axis: a line is
    drawn only between neighbouring layers, never across layers that were not measured."""
    out_x: list = []
    outs: list[list] = [[] for _ in columns]
    for i, x in enumerate(xs):
        if i and x - xs[i - 1] > 1:
            out_x.append((x + xs[i - 1]) / 2)
            for o in outs:
                o.append(float("nan"))
        out_x.append(x)
        for o, c in zip(outs, columns):
            o.append(c[i])
    return (out_x, *outs)


CI_LABEL = "95% interval"  # a band's name where its caller does not say which interval it is


LONG_LABEL = 30  # legend entries longer than this go under the axes, where they do not squeeze the plot


def _outside_legend(ax, extra=(), below: bool | None = None) -> None:
    """The legend outside the axes, where it cannot cover lines, bars or their value labels: to the right,
    or under the axes in columns when its entries are long (``below`` None: decided by their length)."""
    handles, labels = ax.get_legend_handles_labels()
    for handle in extra:
        handles.append(handle)
        labels.append(handle.get_label())
    if not handles:
        return
    if below is None:
        below = max(len(label) for label in labels) > LONG_LABEL
    if below:
        ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  ncol=2 if len(handles) > 1 else 1, borderaxespad=0.0, frameon=False)
    else:
        ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  frameon=False)


def fit_title(fig, ax, text: str) -> None:
    """Set the title, re-wrapping it onto more lines until it lies inside the figure after layout. A word (a model
    id such as ``org/name-v2``) is never cut: once the lines are as narrow as the longest word, the font shrinks."""
    from layerscope.report.html_figures import title_lines  # the page's charts wrap their titles by the same rule

    ax.set_title(text)
    width = max(len(line) for line in text.splitlines() or [""])
    longest = max((len(word) for word in text.split()), default=1)
    size = ax.title.get_fontsize()
    for _ in range(16):
        fig.tight_layout()
        renderer = fig.canvas.get_renderer()
        box = ax.title.get_window_extent(renderer)
        if box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height:
            return
        if width > longest:
            width = max(longest, int(width * 0.8))
        else:
            size *= 0.9
        ax.set_title("\n".join(part for line in text.splitlines() for part in title_lines(line, width)),
                     fontsize=size)


def save(plt, fig, path: Path) -> str:
    """Write the figure as PNG at ``path`` and as SVG beside it (vector, for papers), then release it."""
    fig.savefig(_target(path), bbox_inches="tight", pad_inches=0.1)
    fig.savefig(_target(Path(path).with_suffix(".svg")), bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return Path(path).name


def _finish(plt, fig, ax, path: Path, *, title: str, xlabel: str, ylabel: str, hline: float | None,
            legend: bool, extra_handles=(), hline_label: str | None = None) -> str:
    """The common end of a line plot: reference line, labels, grid, legend, save, close."""
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8, linestyle="--", label=hline_label or "_reference")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        _outside_legend(ax, extra_handles)
    fit_title(fig, ax, title)
    return save(plt, fig, path)


def _nan(values) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def layer_lines(path: Path, series: dict[str, tuple[Sequence[str], Sequence[float | None]]], *, title: str,
                ylabel: str, xlabel: str = "layer", hline: float | None = None,
                bands: dict[str, tuple[Sequence[float | None], Sequence[float | None]]] | None = None,
                hline_label: str | None = None, refs: dict[str, float | None] | None = None,
                from_zero: bool = False, band_label: str = CI_LABEL) -> str:
    """One line per series over layer names; None values leave gaps (undefined figures).

    Series may cover different layers (models of different depth side by side): the x axis is the
    union of their layer names (with the layers between measured ones), each series drawn at its own
    names and joined only between neighbouring layers. ``bands`` gives, per series label, the (low, high)
    ends of an interval at the same layers, drawn as a shaded band in the line's colour, and named ``band_label``
    in the legend (which interval it is: Wilson, bootstrap, ...). ``refs`` are
    levels that do not depend on the layer (a baseline method), drawn as labelled horizontal lines;
    ``hline`` is an unlabelled (or ``hline_label``) dashed reference such as chance. ``from_zero``: the
    y axis starts at 0 (or below, where a value is negative).
    """
    from layerscope.report.depth import RELATIVE_LABEL, depth_of

    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    depths = _DEPTHS.get() if xlabel == "layer" else None
    if depths and any(depth_of(label, depths) is None for label in series):
        depths = None  # a line that names no model (a reference level, ...) cannot be placed by depth
    if depths:  # models of different depth: every series at layer / its model's number of layers
        series, bands, scale = _relative(series, bands, depths, depth_of)
        xlabel = RELATIVE_LABEL
    order = _layer_order(series)
    pos = {name: i for i, name in enumerate(order)}
    extra = []
    for label, (layers, values) in series.items():
        band = (bands or {}).get(label)
        lows, highs = (_nan(band[0]), _nan(band[1])) if band is not None else ([None] * len(layers),) * 2
        if depths:  # layers are block numbers here; a gap is a block not measured, then scaled to depth
            order_ = sorted(range(len(layers)), key=lambda i: layers[i])
            xs, ys, lows, highs = _break_gaps([layers[i] for i in order_], [_nan(values)[i] for i in order_],
                                              [lows[i] for i in order_], [highs[i] for i in order_])
            xs = [x / scale[label] for x in xs]
        else:
            order_ = sorted(range(len(layers)), key=lambda i: pos[str(layers[i])])
            xs, ys, lows, highs = _break_gaps([pos[str(layers[i])] for i in order_],
                                              [_nan(values)[i] for i in order_],
                                              [lows[i] for i in order_], [highs[i] for i in order_])
        (line,) = ax.plot(xs, ys, marker="o", label=label)
        if band is not None:
            poly = ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.2,
                                   linewidth=0, label=f"_{label} {band_label}")
            poly.set_gid(f"ci:{label}")
    if bands and any(b is not None for b in bands.values()):
        from matplotlib.patches import Patch

        extra.append(Patch(facecolor="grey", alpha=0.3, label=f"shaded: {band_label}"))
    styles = ("--", "-.", ":", (0, (5, 1, 1, 1)))
    levels = [v for v in (refs or {}).values() if v is not None]
    for i, (label, level) in enumerate((refs or {}).items()):
        if level is not None:  # after the series' colours, so a reference never shares a line's colour
            ax.axhline(level, color=f"C{(len(series) + i) % 10}", linewidth=1.4, linestyle=styles[i % len(styles)],
                       label=label, gid=f"ref:{label}")
    if from_zero or levels:  # the y range holds every line, band and reference (and 0 when asked)
        import numpy as np

        seen = [v for _, vals in series.values() for v in _nan(vals)] + levels + \
            [v for lo_hi in (bands or {}).values() if lo_hi for end in lo_hi for v in _nan(end)]
        seen = [v for v in seen if np.isfinite(v)] + ([0.0] if from_zero else [])
        if seen:
            bottom, top = min(seen), max(seen)
            pad = 0.05 * (top - bottom or 1.0)
            ax.set_ylim(bottom - (pad if bottom < 0 or not from_zero else 0.0), top + pad)
    if depths:
        ax.set_xlim(-0.03, 1.03)
    else:
        ax.set_xticks(range(len(order)))
        ax.set_xticklabels(order)
    return _finish(plt, fig, ax, path, title=title, xlabel=xlabel, ylabel=ylabel, hline=hline,
                   legend=bool(series), extra_handles=extra, hline_label=hline_label)


def _relative(series, bands, depths, depth_of):
    """Series (and bands) at their numbered layers only (``raw`` and named choices have no place on the
    relative-depth axis), with each series' model depth: layer k of L is drawn at k / L."""
    out, out_bands, scale = {}, {}, {}
    for label, (layers, values) in series.items():
        depth = depth_of(label, depths)
        band = (bands or {}).get(label)
        keep = [i for i, layer in enumerate(layers) if depth and str(layer).lstrip("-").isdigit()]
        out[label] = ([int(layers[i]) for i in keep], [values[i] for i in keep])
        scale[label] = depth or 1
        if band is not None:
            out_bands[label] = ([band[0][i] for i in keep], [band[1][i] for i in keep])
    return out, out_bands or None, scale


def xy_lines(path: Path, series: dict[str, tuple[Sequence[float], Sequence[float | None]]], *, title: str,
             xlabel: str, ylabel: str, logx: bool = False, hline: float | None = None) -> str:
    """One line per series over numeric x values (e.g. kept dimensions); None values leave gaps."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for label, (xs, values) in series.items():
        ax.plot(list(xs), _nan(values), marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
        ticks = sorted({x for xs, _ in series.values() for x in xs})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(int(t)) for t in ticks])
    return _finish(plt, fig, ax, path, title=title, xlabel=xlabel, ylabel=ylabel, hline=hline,
                   legend=bool(series))


def bars(path: Path, groups: dict[str, dict[str, float | None]], *, title: str, ylabel: str,
         errors: dict[str, dict[str, tuple[float | None, float | None] | None]] | None = None,
         band_label: str = CI_LABEL, hline: float | None = None) -> str:
    """Grouped bars: one group per key of ``groups``, one bar per inner key; None bars are left out.

    ``errors`` gives, per group and bar, the (low, high) ends of an interval (``band_label`` names which) drawn as
    an error bar; each bar's value label sits above the higher of the bar and its interval, the legend outside.
    ``hline``: a dashed chance line.
    """
    import numpy as np

    plt = _plt()
    labels = []
    for inner in groups.values():
        for k in inner:
            if k not in labels:
                labels.append(k)
    n_bars = len(groups) * max(1, len(labels))
    fig, ax = plt.subplots(figsize=(min(16, max(6, 0.45 * n_bars + 2)), 4.5), dpi=120)
    width = 0.8 / max(1, len(labels))
    xs = np.arange(len(groups))
    rotate = n_bars > 8  # narrow bars: value labels stand upright so neighbours never run into each other
    tops = []
    for j, label in enumerate(labels):
        vals = [inner.get(label) for inner in groups.values()]
        # one bar per group: its name goes in the title, not in a legend box that takes half the figure
        rects = ax.bar(xs + j * width - 0.4 + width / 2, _nan(vals), width,
                       label=label if len(labels) > 1 else f"_{label}")
        for r, v, group in zip(rects, vals, groups):
            if v is None:
                continue
            x = r.get_x() + r.get_width() / 2
            top = v
            ci = ((errors or {}).get(group) or {}).get(label)
            if ci is not None and ci[0] is not None and ci[1] is not None:
                eb = ax.errorbar([x], [v], yerr=[[v - ci[0]], [ci[1] - v]], fmt="none", ecolor="black",
                                 elinewidth=1, capsize=3, label=f"_ci {group} {label}")
                eb.lines[2][0].set_gid(f"ci:{group}:{label}")
                top = max(v, ci[1])
            tops.append(top)
            ax.annotate(f"{v:.3f}", (x, top), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7, rotation=90 if rotate else 0)
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8, linestyle="--", label="chance")
        tops.append(hline)
    if tops:  # head room for the labels above the tallest bar
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, max(hi, max(tops)) + (max(hi, max(tops)) - lo) * (0.18 if rotate else 0.08))
    ax.set_xticks(xs)
    ax.set_xticklabels(list(groups), rotation=30 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")
    extra = []
    if errors:
        from matplotlib.lines import Line2D

        extra.append(Line2D([], [], color="black", marker="|", linestyle="none", markersize=10,
                            label=f"error bar: {band_label}"))
    _outside_legend(ax, extra)
    fit_title(fig, ax, title + (f"\n{labels[0]}" if len(labels) == 1 else ""))
    return save(plt, fig, path)


def relative_luminance(rgb) -> float:
    """WCAG 2 relative luminance of an sRGB colour given as floats in [0, 1]."""
    def lin(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(float(c)) for c in tuple(rgb)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(rgb1, rgb2) -> float:
    """WCAG 2 contrast ratio between two colours (1 = none, 21 = black on white)."""
    a, b = sorted((relative_luminance(rgb1), relative_luminance(rgb2)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def text_color_for(rgb) -> str:
    """Black or white, whichever reads better on a cell of colour ``rgb``."""
    return "black" if contrast_ratio(rgb, (0, 0, 0)) >= contrast_ratio(rgb, (1, 1, 1)) else "white"


def heatmap(path: Path, matrix, row_labels: Sequence[str], col_labels: Sequence[str], *, title: str,
            xlabel: str = "", ylabel: str = "", vmin: float | None = None, vmax: float | None = None,
            annotate: bool = True, cmap: str = "viridis", rotate: bool = False) -> str:
    """A matrix as coloured cells; each value printed in black or white, whichever contrasts with its cell
    (``cmap``: a diverging map for signed values; ``rotate``: column labels slanted)."""
    import numpy as np

    plt = _plt()
    m = np.asarray(matrix, dtype=float)
    fig, ax = plt.subplots(figsize=(2.0 + 0.55 * len(col_labels), 1.5 + 0.5 * len(row_labels)), dpi=120)
    im = ax.imshow(m, vmin=vmin, vmax=vmax, cmap=cmap)
    ax.set_xticks(range(len(col_labels)))
    ax.set_xticklabels(col_labels, rotation=45 if rotate else 0, ha="right" if rotate else "center")
    ax.set_yticks(range(len(row_labels)))
    ax.set_yticklabels(row_labels)
    if annotate and m.size <= 900:
        size = 8 if max(m.shape) <= 10 else 7 if max(m.shape) <= 16 else 6
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                if np.isfinite(m[i, j]):
                    cell = im.cmap(im.norm(m[i, j]))
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=size,
                            color=text_color_for(cell))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fit_title(fig, ax, title)
    return save(plt, fig, path)
