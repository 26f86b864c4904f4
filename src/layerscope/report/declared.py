"""An analysis's declared figures (analyses/figures.py) drawn from typed results: PNGs, report.md, report.html
and the console, all from the one declaration.

``results`` here is a typed ``Results`` (analyses/results.py): per model ``summary``, ``table(name)`` and
``value(name)``; ``decl`` the analysis's ``Figures`` declaration. Strings from results reach report.md through
``md_data``, report.html through ``html.escape`` (or plotly's escaping) and the console through Rich's escape.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from layerscope.report.templates import Raw as _Raw, fill, lookup  # noqa: F401  (fill: what callers import)

_LAYER = re.compile(r"raw|\d+")
def _rows(results, model: str, curve) -> list[dict[str, Any]]:
    rows = list(results.per_model[model].table(curve.table))
    if curve.layers_only:
        rows = [r for r in rows if _LAYER.fullmatch(str(r.get(curve.x, "")))]
    return [r for r in rows if curve.where is None or curve.where(r)]


def _ci(line, row, end: str):
    return row.get(line.ci[0 if end == "low" else 1]) if line.ci else row.get(f"{line.column}_ci_{end}")


# what a row's ``<figure>_ci_method`` says its interval is, as a chart's legend and caption name it
BAND_NAMES = (("wilson", "95% Wilson interval"), ("paired-bootstrap", "95% paired bootstrap interval"),
              ("bootstrap", "95% bootstrap interval"))


def band_name(curve, lines) -> str:
    """The name of a chart's bands: the curve's own (``band``), else the one the rows' ``_ci_method`` gives (every
    band of the chart the same kind of interval), else "95% interval" (never a kind it is not)."""
    if curve.band:
        return curve.band
    methods = {method for _, _, low, _, _, method in lines.values() if low is not None and method}
    names = {next((name for key, name in BAND_NAMES if str(m).startswith(key)), None) for m in methods}
    return names.pop() if len(names) == 1 and None not in names else "95% interval"




def slug(model: str) -> str:
    """A model's name as a file name part (``{slug}`` in a declared file name)."""
    return "".join(ch if ch.isalnum() else "_" for ch in model)[-40:]


def _chance(results, curve):
    if curve.chance is None:
        return curve.level
    levels = {curve.chance(fig.summary) if callable(curve.chance) else lookup(fig.summary, curve.chance, None)
              for fig in results.per_model.values()}
    level = levels.pop() if len(levels) == 1 else None
    return level if isinstance(level, (int, float)) and not isinstance(level, bool) else None


def _charts(results, curve, joiner: str = " "):
    """(file, model or None, {label: (layers, values, low, high, model)}, {label: level}) per chart of a curve: a
    line per declared ``Line``, per model where models share a chart, and per value of the ``group`` columns; a
    row without an x value is a flat reference (``refs``: the column naming it), not a point."""
    several = results.several
    out = []
    for model in results.per_model:
        lines, refs = {}, {}
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for r in _rows(results, model, curve):
            if r.get(curve.x) is None and curve.refs is not None:
                refs[f"{r.get(curve.refs)} (no layer)"] = r.get(curve.lines[0].column)
                continue
            groups.setdefault(tuple(str(r.get(g)) for g in curve.group), []).append(r)
        for key, rows in groups.items():
            for line in curve.lines:
                parts = [model] if several and not curve.per_model else []
                parts += [line.label] if len(curve.lines) > 1 or not (parts or key) else []
                label = joiner.join([*parts, fill(curve.label, rows[0], str)] if curve.label else [*parts, *key])
                has_ci = any(_ci(line, r, "low") is not None for r in rows)
                xs = [r.get(curve.x) if curve.logx else str(r.get(curve.x)) for r in rows]
                method = next((r.get(f"{line.column}_ci_method") for r in rows
                               if has_ci and r.get(f"{line.column}_ci_method")), None)
                lines[label] = (xs, [r.get(line.column) for r in rows],
                                [_ci(line, r, "low") for r in rows] if has_ci else None,
                                [_ci(line, r, "high") for r in rows] if has_ci else None, model, method)
        if curve.most is not None:
            lines = dict(list(lines.items())[:curve.most])
        if "{slug}" in curve.file:
            out.append((curve.file.replace("{slug}", slug(model)), model, lines, refs))
        elif curve.per_model:
            suffix = "_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", model) if several else ""
            out.append((curve.file + suffix, model, lines, refs))
        else:
            if not out:
                out.append((curve.file, None, {}, {}))
            out[0][2].update(lines)
            out[0][3].update(refs)
    return out


# -- PNG ------------------------------------------------------------------------------------------------------

def plots(decl, results, out_dir: Path) -> list[str]:
    from layerscope.report import declared_grids
    from layerscope.report.plots import layer_lines, xy_lines

    files = []
    for curve in decl.curves:
        if not curve.png:
            continue
        for file, model, lines, refs in _charts(results, curve):
            if not lines or all(v is None for _, values, *_rest in lines.values() for v in values):
                continue
            series = {label: (layers, values) for label, (layers, values, *_rest) in lines.items()}
            bands = {label: (lo, hi) for label, (_, _, lo, hi, *_rest) in lines.items() if lo is not None}
            title = _text(decl, results, curve.title) + (f" ({model})" if model and results.several else "")
            title = declared_grids.png_title(title, results)
            if curve.logx:
                files.append(xy_lines(Path(out_dir) / f"{file}.png", series, title=title, xlabel=curve.xlabel,
                                      ylabel=_text(decl, results, curve.ylabel), logx=True,
                                      hline=_chance(results, curve)))
                continue
            files.append(layer_lines(Path(out_dir) / f"{file}.png", series, title=title, xlabel=curve.xlabel,
                                     ylabel=_text(decl, results, curve.ylabel), hline=_chance(results, curve),
                                     hline_label=curve.level_label if _chance(results, curve) is not None else None,
                                     bands=bands or None, refs=refs or None, from_zero=curve.from_zero,
                                     band_label=band_name(curve, lines)))
    for name in decl.files:
        if name != "saliency.html":
            raise ValueError(f"no page named {name!r}")
        from layerscope.report.saliency_html import write_saliency_html

        write_saliency_html(Path(out_dir) / name, results)
    return files + declared_grids.plots(decl, results, Path(out_dir), fill)


# -- report.md --------------------------------------------------------------------------------------------------

def markdown(decl, results) -> str:
    from layerscope.report.writer import md_data, md_table

    from layerscope.report import declared_grids

    parts = [fill(decl.preface, _preface_values(decl, results), md_data) + "\n"] if decl.preface else []
    grids = declared_grids.grids(decl, results, fill)
    note = declared_grids.scale_note(grids)
    parts += [note] if note else []
    for model, fig in results.per_model.items():
        mine = [fill(decl.sentence, fig.summary, md_data) + "\n"] if decl.sentence else []
        for table in decl.tables:
            rows = [md_data(_p_shown(table, r)) for r in _table_rows(table, results, model)]
            if rows:
                mine.append(md_table(rows, table.shown(rows), digits=table.digits))
        for listing in decl.listings:
            items = _items(listing, fig)
            if items:
                mine.append(f"{md_data(listing.title)}:\n")
                mine += [f"- {_item(listing, x, md_data)}" for x in items[:listing.limit]]
                mine.append("")
        mine += [t for g in grids if g.model == model and (t := declared_grids.grid_markdown(g, md_data))]
        if mine:
            parts += [f"## {md_data(model)}\n", *mine]
    parts += [t for g in grids if g.model is None and (t := declared_grids.grid_markdown(g, md_data))]
    if "lens tokens" in decl.page:
        from layerscope.report.lens_html import token_markdown

        parts.append(token_markdown(results, md_data))
    return "\n".join(parts)


def final_rows(rows, results, model: str) -> list[dict[str, Any]]:
    """The rows of ``model``'s final layer (its number of layers, as its manifest records it)."""
    final = str(results.num_layers(model))
    return [r for r in rows if str(r.get("layer")) == final]


def _table_rows(table, results, model: str) -> list[dict[str, Any]]:
    rows = list(results.per_model[model].rows(table.name))
    return final_rows(rows, results, model) if table.final_layer else rows


def _p_shown(table, row: dict[str, Any]) -> dict[str, Any]:
    """The row with its p-value columns written as p-values are read (report/numbers.py ``p_value``)."""
    from layerscope.report.numbers import p_value

    return {**row, **{c: p_value(row[c]) for c in table.p_values if c in row}}


def _about(decl, results) -> str:
    return decl.about(results) if decl.about is not None else ""


def _text(decl, results, template: str) -> str:
    """A chart's title or axis label: ``{about}`` filled in, as text (the chart escapes it for its medium)."""
    return fill(template, {"about": _about(decl, results)}, str) if "{" in template else template


def _preface_values(decl, results) -> dict[str, Any]:
    """What the preface template reads: the run's combined figures (``data.origin``, ...) and ``about``."""
    return {**results.combined.extra, "about": _about(decl, results)}


def _items(listing, fig) -> list[dict[str, Any]]:
    """A listing's items: the rows its ``value`` names, those whose ``where`` field holds something."""
    w = listing.where
    return [x for x in fig.rows(listing.value) if w is None or (w(x) if callable(w) else x.get(w))]


def _item(listing, item: dict[str, Any], escape) -> str:
    """One listing line: the item's fields escaped; its sub-items each formatted (and escaped), joined by "; "."""
    values = dict(item)
    if listing.sub:
        subs = [s for s in item.get(listing.sub) or [] if isinstance(s, dict)]
        values[listing.sub] = _Raw("; ".join(fill(listing.each, s, escape) for s in subs))
    return fill(listing.item, values, escape)


# -- report.html --------------------------------------------------------------------------------------------------

def sections(decl, results) -> list:
    from layerscope.report.depth import relative_depths
    from layerscope.report.html_figures import Series, layer_curves, xy_lines
    from layerscope.report.html_figures import Section

    depths = relative_depths(results) is not None
    charts = []
    for curve in decl.curves:
        rel = depths and curve.x == "layer"
        for _, model, lines, refs in _charts(results, curve, curve.joiner):
            series = [Series(label, layers, values, lo, hi, results.num_layers(owner))
                      for label, (layers, values, lo, hi, owner, _) in lines.items()]
            if not series or all(all(v is None for v in s.values) for s in series):
                continue
            title = _text(decl, results, curve.title) + (f" ({model})" if model and results.several else "")
            if curve.logx:
                charts.append(xy_lines({s.label: (s.layers, s.values) for s in series}, title=title,
                                       caption=curve.caption, xlabel=curve.xlabel, logx=True,
                                       ylabel=_text(decl, results, curve.ylabel), hline=_chance(results, curve)))
                continue
            axis = list(dict.fromkeys(x for s in series for x in s.layers))
            series += [Series(label, axis, [level] * len(axis), dash="dash") for label, level in refs.items()]
            caption = curve.caption + (f" Dashed line: {curve.level_label}." if _chance(results, curve) is not None
                                       else "")
            if rel:
                caption += " Models of different depth are overlaid by relative depth (layer / number of layers)."
            charts.append(layer_curves(series, title=title, ylabel=_text(decl, results, curve.ylabel), caption=caption,
                                       relative=rel, hline=_chance(results, curve), xlabel=curve.xlabel,
                                       from_zero=curve.from_zero, band=band_name(curve, lines)))
    from layerscope.report import declared_grids

    charts += declared_grids.charts(decl, results, fill)
    text = [f"<p>{fill(decl.preface, _preface_values(decl, results), html.escape, html.escape)}</p>"] if decl.preface else []
    for model, fig in results.per_model.items():
        if decl.sentence:
            name = f"<b>{html.escape(model)}</b>: " if results.several else ""
            text.append(f"<p>{name}{fill(decl.sentence, fig.summary, html.escape, html.escape)}</p>")
        for listing in decl.listings:
            items = _items(listing, fig)[:listing.html_limit]
            if items:
                rows = [{"item": _Raw(_item(listing, x, html.escape))} for x in items]
                text.append(f"<h3>{html.escape(listing.title)}{' (' + html.escape(model) + ')' if results.several else ''}"
                            f"</h3><ul>{''.join('<li>' + r['item'] + '</li>' for r in rows)}</ul>")
    words = [Section("words", "In words", html="".join(text))] if text else []
    title = "Layer curves" if decl.curves or not decl.heatmaps else "Heat maps"
    return [*words, Section("figures", title, charts), *page_sections(decl, results)]


def page_sections(decl, results) -> list:
    """The page's own sections an analysis names in ``Figures.page`` (a browser, token highlights), after its
    charts; a section with nothing to show (older results) is left out."""
    out = []
    for name in decl.page:
        if name == "neighbours":
            from layerscope.report.html_neighbours import neighbour_section as make
        elif name == "tokens":
            from layerscope.report.saliency_html import token_section as make
        elif name == "lens tokens":
            from layerscope.report.lens_html import token_section as make
        elif name == "attention viewer":
            from layerscope.report.attention_html import viewer_section as make
        elif name == "explain pairs":
            from layerscope.report.explain_figs import pair_section as make
        elif name == "crossmodal pairs":
            from layerscope.report.image_html import crossmodal_section as make
        elif name == "vision lens images":
            from layerscope.report.image_html import vision_lens_section as make
        elif name == "cls maps":
            from layerscope.report.image_html import cls_maps_section as make
        else:
            raise ValueError(f"no report.html section named {name!r}")
        section = make(results)
        if section is not None:
            out.append(section)
    return out


# -- console ---------------------------------------------------------------------------------------------------

def _pivot(table, rows, title: str):
    """The console's table of ``rows`` with a row per key (layer) and a column per value of ``table.pivot``
    (pooling), each cell ``table.cell`` over its row ("-" where that key has no such row)."""
    from rich.table import Table

    from layerscope.report.console import esc

    keys = list(dict.fromkeys(str(r.get(table.key)) for r in rows))
    across = list(dict.fromkeys(str(r.get(table.pivot)) for r in rows))
    cells = {(str(r.get(table.key)), str(r.get(table.pivot))): r for r in rows}
    t = Table(title=title)
    t.add_column(esc(table.key), justify="right")
    for v in across:
        t.add_column(f"{esc(v)} {esc(table.cell_label)}", justify="right")
    for k in keys:
        t.add_row(esc(k), *(fill(table.cell, cells[k, v], esc, esc) if (k, v) in cells else "-" for v in across))
    return t


def console_summary(decl, results, console) -> None:
    from rich.table import Table

    from layerscope.report.console import esc
    from layerscope.report.writer import fmt

    if decl.console_preface and decl.preface:
        console.print(fill(decl.preface, _preface_values(decl, results), esc, esc), soft_wrap=True)
    for model, fig in results.per_model.items():
        if decl.sentence:
            console.print(f"{esc(model)}: {fill(decl.sentence, fig.summary, esc, esc)}", soft_wrap=True)
        for table in [t for i, t in enumerate(decl.tables) if i == 0 or t.console is not None]:
            rows = _table_rows(table, results, model)
            if not rows:
                continue
            if table.pivot is not None:
                console.print(_pivot(table, rows, f"{esc(results.analysis)} - {esc(model)}"))
                continue
            t = Table(title=f"{esc(results.analysis)} - {esc(model)}")
            columns = list(table.console) if table.console is not None else table.shown(rows)
            for c in columns:
                t.add_column(esc(c), justify="right")
            for r in rows:
                r = _p_shown(table, r)
                t.add_row(*(esc(fmt(r.get(c), table.digits)) for c in columns))
            console.print(t)
    from layerscope.report import declared_grids

    declared_grids.console_summary(decl, results, console, fill)
