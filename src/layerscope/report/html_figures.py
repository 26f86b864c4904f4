"""Interactive figures for report.html, built with plotly from figures already in results.json.

Each builder returns a :class:`Chart`: a plotly figure as plain JSON plus the title and caption the page
shows around it. Every string that comes from results.json is HTML-escaped before plotly sees it (plotly
renders a subset of HTML in titles, legends, ticks and hover text), so a name read from a results file
is always shown as text. plotly is imported lazily, when a report is written.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

CI_NAME = "95% interval"  # a band's name where its caller does not say which interval it is
# plotly's default colour cycle, named here so that a band and its line share one colour
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


def esc(value: Any) -> str:
    """A value as plotly text: HTML special characters escaped (plotly shows ``&lt;`` as ``<``)."""
    return html.escape(str(value), quote=False)


def num(value: Any) -> float | None:
    """A finite float, or None (plotly leaves a gap) for None, NaN, infinities and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


@dataclass
class Series:
    """One line over layers; ``low``/``high`` (same length) give an interval drawn as a band."""

    label: str
    layers: Sequence[str]
    values: Sequence[Any]
    low: Sequence[Any] | None = None
    high: Sequence[Any] | None = None
    num_layers: int | None = None  # for the relative-depth axis (layer / num_layers)
    dash: str | None = None  # e.g. "dash" for a reference level that does not depend on the layer


@dataclass
class Chart:
    title: str
    caption: str
    figure: dict[str, Any]
    kind: str = "lines"  # lines, bars, heatmap: what the page test expects plotly to draw
    notes: list[str] = field(default_factory=list)


@dataclass
class Section:
    """One part of the page: its charts under a heading, with the HTML, CSS, script and data it adds."""

    anchor: str
    title: str
    charts: list[Chart] = field(default_factory=list)
    intro: str = ""  # HTML: built by the view from escaped values
    html: str = ""  # HTML after the charts
    css: str = ""
    script: str = ""  # a script that registers itself in window.layerscopeExtras
    data: dict[str, Any] = field(default_factory=dict)  # merged into the page's JSON data block


def _go():
    import plotly.graph_objects as go  # the page writer checks first that plotly is installed

    return go


TITLE_CHARS = 100  # a chart title's line at most: at 15 px bold, what the page's chart width holds
TITLE_LINE_PX = 20


def title_lines(title: str, width: int = TITLE_CHARS) -> list[str]:
    """``title`` in lines of at most ``width`` characters, broken at spaces (a longer word stays whole), so a
    title naming the model, the data and the pooling is not cut at the chart's right edge."""
    import textwrap

    return textwrap.wrap(title, width=width, break_long_words=False, break_on_hyphens=False) or [title]


def _layout(title: str, xlabel: str, ylabel: str, **extra) -> dict[str, Any]:
    lines = title_lines(title)
    more = TITLE_LINE_PX * (len(lines) - 1)
    layout = {
        "title": {"text": "<br>".join(f"<b>{esc(line)}</b>" for line in lines), "x": 0.0, "xanchor": "left",
                  "font": {"size": 15}},
        "xaxis": {"title": {"text": esc(xlabel)}, "showgrid": True, "gridcolor": "#e5e5e5", "zeroline": False},
        "yaxis": {"title": {"text": esc(ylabel)}, "showgrid": True, "gridcolor": "#e5e5e5", "zeroline": False},
        "template": "plotly_white", "hovermode": "closest", "height": 430 + more,
        "margin": {"l": 70, "r": 20, "t": 60 + more, "b": 60},
        # the legend to the right of the plot area, where it never covers a line or a value label
        "legend": {"x": 1.02, "xanchor": "left", "y": 1.0, "font": {"size": 11}},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    if "height" in extra:  # a chart's own height keeps its plot area; the title's extra lines come on top
        layout["height"] = extra["height"] + more
    return layout


def _finish(go, traces: list, layout: dict[str, Any]) -> dict[str, Any]:
    """Validate through plotly's figure class, then hand back its plain JSON."""
    import json

    return json.loads(go.Figure(data=traces, layout=layout).to_json())


def layer_position(name: str) -> int | None:
    """The block number of a layer name ("3" -> 3); None for "raw" and other names."""
    try:
        return int(str(name))
    except ValueError:
        return None


def layer_order(series: Sequence[Series]) -> list[str]:
    names: list[str] = []
    for s in series:
        for name in s.layers:
            if str(name) not in names:
                names.append(str(name))
    def key(name: str) -> tuple[int, int]:
        if name == "raw":
            return (-1, 0)
        pos = layer_position(name)
        return (0, pos) if pos is not None else (1, names.index(name))

    ordered = sorted(names, key=key)
    numbers = [p for p in map(layer_position, ordered) if p is not None]
    if numbers:  # the layers between measured ones get their place, so a gap shows as a gap
        have = set(numbers)
        ordered = sorted(ordered + [str(k) for k in range(min(numbers), max(numbers)) if k not in have], key=key)
    return ordered


def _gap_points(layers: Sequence[str]) -> list[int]:
    """Indices after which the next layer is not the next block (0 then 6): a line must break there."""
    pos = [layer_position(x) for x in layers]
    return [j for j in range(len(pos) - 1) if pos[j] is not None and pos[j + 1] is not None
            and pos[j + 1] - pos[j] > 1]


def layer_curves(series: Sequence[Series], *, title: str, caption: str, ylabel: str, xlabel: str = "layer",
                 hline: float | None = None, relative: bool = False, digits: int = 4,
                 from_zero: bool = False, band: str = CI_NAME) -> Chart:
    """Lines over layers, each with its interval band (named ``band``) and hover values.

    ``relative`` puts every series at layer / num_layers (0 = embedding output, 1 = last block), so models
    of different depth overlay; layers without a block number (``raw``) are left out there.
    """
    go = _go()
    traces, notes, dropped = [], [], 0
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        xs, ys, lo, hi, names = [], [], [], [], []
        for j, layer in enumerate(s.layers):
            if relative:
                pos = layer_position(layer)
                if pos is None or not s.num_layers:
                    dropped += 1
                    continue
                xs.append(pos / s.num_layers)
            else:
                xs.append(esc(layer))
            names.append(esc(layer))
            ys.append(num(s.values[j]))
            lo.append(num(s.low[j]) if s.low is not None else None)
            hi.append(num(s.high[j]) if s.high is not None else None)
        has_band = any(a is not None and b is not None for a, b in zip(lo, hi))
        # layers measured sparsely (0 and 6, not 1-5): points with whiskers, no line or band between them
        sparse = bool(_gap_points([s.layers[j] for j in range(len(s.layers))
                                   if not relative or layer_position(s.layers[j]) is not None]))
        error = None
        if sparse and has_band:
            error = {"type": "data", "symmetric": False, "color": colour, "thickness": 1.5, "width": 5,
                     "array": [None if b is None or y is None else b - y for y, b in zip(ys, hi)],
                     "arrayminus": [None if a is None or y is None else y - a for y, a in zip(ys, lo)]}
        if has_band and not sparse:
            keep = [k for k in range(len(xs)) if lo[k] is not None and hi[k] is not None]
            traces.append(go.Scatter(
                x=[xs[k] for k in keep] + [xs[k] for k in reversed(keep)],
                y=[hi[k] for k in keep] + [lo[k] for k in reversed(keep)],
                mode="lines", fill="toself", fillcolor=_rgba(colour, 0.18), line={"width": 0}, hoverinfo="skip",
                name=f"{esc(s.label)}: {band}", legendgroup=f"g{i}", showlegend=False))
        depth = [f"{x:.2f}" if relative else "" for x in xs]
        custom = [[n, d, "" if a is None else f"{a:.{digits}f}", "" if b is None else f"{b:.{digits}f}"]
                  for n, d, a, b in zip(names, depth, lo, hi)]
        hover = (f"<b>{esc(s.label)}</b><br>layer %{{customdata[0]}}"
                 + (f" of {s.num_layers} (depth %{{customdata[1]}})" if relative else "")
                 + f"<br>{esc(ylabel)}: %{{y:.{digits}f}}"
                 + (f"<br>{band}: [%{{customdata[2]}}, %{{customdata[3]}}]" if has_band else "")
                 + "<extra></extra>")
        traces.append(go.Scatter(x=xs, y=ys, mode="markers" if sparse else "lines" if s.dash else "lines+markers",
                                 name=esc(s.label), legendgroup=f"g{i}", error_y=error,
                                 line={"color": colour, "width": 2, "dash": s.dash or "solid"},
                                 marker={"size": 7}, customdata=custom,
                                 hovertemplate=hover, connectgaps=False))
    if any(t.fill == "toself" for t in traces):
        notes.append(f"Shaded band: {band} (hover a point for its interval).")
    if any(t.error_y is not None and t.error_y.array is not None for t in traces):
        notes.append(f"Whiskers: {band}.")
    if any(t.mode == "markers" for t in traces):
        notes.append("Layers measured sparsely are drawn as points, not joined across the layers in between.")
    if dropped and relative:
        notes.append("Layers without a block number (raw) are left out of the relative-depth axis.")
    xaxis: dict[str, Any] = {"range": [-0.03, 1.03]} if relative else {
        "type": "category", "categoryorder": "array", "categoryarray": [esc(n) for n in layer_order(series)]}
    shapes = []
    if hline is not None:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": hline, "y1": hline,
                       "line": {"color": "#888", "width": 1, "dash": "dash"}})
    layout = _layout(title, "relative depth (layer / number of layers)" if relative else xlabel, ylabel,
                     xaxis=xaxis, shapes=shapes, **({"yaxis": {"rangemode": "tozero"}} if from_zero else {}))
    return Chart(title, caption, _finish(go, traces, layout), "lines", notes)


def xy_lines(series: dict[str, tuple[Sequence[float], Sequence[Any]]], *, title: str, caption: str, xlabel: str,
             ylabel: str, logx: bool = False, hline: float | None = None, digits: int = 4) -> Chart:
    """Lines over numeric x values (e.g. dimensions kept)."""
    go = _go()
    traces = []
    for i, (label, (xs, ys)) in enumerate(series.items()):
        traces.append(go.Scatter(x=list(xs), y=[num(v) for v in ys], mode="lines+markers", name=esc(label),
                                 line={"color": COLOURS[i % len(COLOURS)], "width": 2},
                                 hovertemplate=f"<b>{esc(label)}</b><br>{esc(xlabel)}: %{{x}}<br>{esc(ylabel)}: "
                                               f"%{{y:.{digits}f}}<extra></extra>"))
    shapes = [] if hline is None else [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": hline, "y1": hline,
                                        "line": {"color": "#888", "width": 1, "dash": "dash"}}]
    ticks = sorted({x for xs, _ in series.values() for x in xs if num(x) is not None})
    xaxis: dict[str, Any] = {"type": "log", "tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks]} if logx else {}
    layout = _layout(title, xlabel, ylabel, xaxis=xaxis, shapes=shapes)
    return Chart(title, caption, _finish(go, traces, layout), "lines")


def bars(groups: dict[str, dict[str, Any]], *, title: str, caption: str, ylabel: str,
         errors: dict[str, dict[str, tuple[Any, Any]]] | None = None, digits: int = 3, band: str = CI_NAME,
         hline: float | None = None) -> Chart:
    """Grouped bars (one group per key, one bar per inner key) with value labels and interval whiskers."""
    go = _go()
    labels: list[str] = []
    for inner in groups.values():
        for k in inner:
            if k not in labels:
                labels.append(k)
    traces = []
    for i, label in enumerate(labels):
        xs = [esc(g) for g in groups]
        ys = [num(groups[g].get(label)) for g in groups]
        err = None
        if errors:
            plus, minus = [], []
            for g, y in zip(groups, ys):
                lo, hi = ((errors.get(g) or {}).get(label) or (None, None))
                ok = y is not None and num(lo) is not None and num(hi) is not None
                plus.append(num(hi) - y if ok else None)
                minus.append(y - num(lo) if ok else None)
            if any(p is not None for p in plus):
                err = {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "color": "#333",
                       "thickness": 1.2, "width": 4}
        traces.append(go.Bar(x=xs, y=ys, name=esc(label), marker={"color": COLOURS[i % len(COLOURS)]},
                             error_y=err, text=[None if y is None else f"{y:.{digits}f}" for y in ys],
                             # with whiskers, inside the foot of the bar (a label on top would sit on the whisker);
                             # without, above the bar, where a bar of height 0 still shows its value
                             textposition="inside" if err else "outside", insidetextanchor="start", textangle=0,
                             cliponaxis=False, textfont={"size": 11},
                             hovertemplate=f"%{{x}}<br>{esc(label)}: %{{y:.4f}}<extra></extra>"))
    shapes = [] if hline is None else [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": hline, "y1": hline,
                                        "line": {"color": "#888", "width": 1, "dash": "dash"}}]
    layout = _layout(title, "", ylabel, barmode="group", showlegend=len(labels) > 1,
                     xaxis={"type": "category", "tickangle": -30 if len(groups) > 5 else 0},
                     yaxis={"rangemode": "tozero"}, shapes=shapes)
    if errors:
        caption += f" Whiskers: {band}."
    if hline is not None:
        caption += " Dashed line: chance."
    return Chart(title, caption, _finish(go, traces, layout), "bars")


def heatmap(matrix: Sequence[Sequence[Any]], rows: Sequence[str], cols: Sequence[str], *, title: str, caption: str,
            xlabel: str, ylabel: str, zlabel: str, zmin: float | None = None, zmax: float | None = None,
            text: Sequence[Sequence[str]] | None = None, reverse: bool = False, digits: int = 2) -> Chart:
    """A matrix as coloured cells, each labelled with its value (or ``text``) in a colour that contrasts
    with its cell (plotly picks black or white per cell)."""
    go = _go()
    z = [[num(v) for v in row] for row in matrix]
    cells = len(rows) * len(cols)
    label_size = 11 if cells <= 100 else 9 if cells <= 400 else 7
    trace: dict[str, Any] = dict(
        z=z, x=[esc(c) for c in cols], y=[esc(r) for r in rows], colorscale="Viridis", reversescale=reverse,
        zmin=zmin, zmax=zmax, colorbar={"title": {"text": esc(zlabel), "side": "right"}}, xgap=1, ygap=1,
        hovertemplate=f"{esc(ylabel)} %{{y}}, {esc(xlabel)} %{{x}}<br>{esc(zlabel)}: %{{z:.4f}}<extra></extra>")
    if text is not None:
        trace["text"] = [[esc(t) for t in row] for row in text]
        trace["texttemplate"] = "%{text}"
        trace["hovertemplate"] = (f"{esc(ylabel)} %{{y}}, {esc(xlabel)} %{{x}}<br>%{{text}}<br>{esc(zlabel)}: "
                                  "%{z:.3f}<extra></extra>")
    elif cells <= 900:
        trace["texttemplate"] = f"%{{z:.{digits}f}}"
    trace["textfont"] = {"size": label_size}
    height = max(360, min(900, 90 + 34 * len(rows)))
    layout = _layout(title, xlabel, ylabel, height=height,
                     xaxis={"type": "category", "showgrid": False, "tickangle": -45 if text is not None else 0},
                     yaxis={"type": "category", "showgrid": False, "autorange": "reversed"})
    return Chart(title, caption, _finish(go, [go.Heatmap(**trace)], layout), "heatmap")
