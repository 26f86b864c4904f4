"""An analysis's declared figures (analyses/figures.py) drawn from typed results: PNGs, report.md, report.html
and the console, all from the one declaration.

``results`` here is a typed ``Results`` (analyses/results.py): per model ``summary``, ``table(name)`` and
``value(name)``; ``decl`` the analysis's ``Figures`` declaration. Strings from results reach report.md through
``md_data``, report.html through ``html.escape`` (or plotly's escaping) and the console through Rich's escape.
"""

from __future__ import annotations

import html
import re
import string
from pathlib import Path
from typing import Any

_LAYER = re.compile(r"raw|\d+")
_NAME = re.compile(r"[A-Za-z_][\w@]*(\.[\w@]+)*")  # a field, or a dotted path into nested ones: chance.acc@1


def lookup(values: dict[str, Any], name: str, default: Any = "undefined") -> Any:
    """``values[name]``, a dotted ``name`` walking nested dicts; ``default`` where a part is missing."""
    if not _NAME.fullmatch(name):
        return default
    value: Any = values
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def fill(template: str, values: dict[str, Any], escape) -> str:
    """``template`` (ours) over ``values`` (from results, each escaped by ``escape``): names only, formats
    such as ``{x:.3f}`` or ``{n:,}`` applied to numbers; a format a value cannot take shows the value as is."""
    out = []
    for text, name, spec, _ in string.Formatter().parse(template):
        out.append(text)
        if name is None:
            continue
        value = lookup(values, name)
        if isinstance(value, _Raw):
            out.append(value)
            continue
        if isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        elif value is None:
            value = "undefined"
        try:
            shown = format(value, spec or "") if isinstance(value, (int, float)) and not isinstance(value, bool) \
                else str(value)
        except (ValueError, TypeError):
            shown = str(value)
        out.append(escape(shown))
    return "".join(out)


def _rows(results, model: str, curve) -> list[dict[str, Any]]:
    rows = list(results.per_model[model].table(curve.table))
    if curve.layers_only:
        rows = [r for r in rows if _LAYER.fullmatch(str(r.get("layer", "")))]
    return rows


def _chance(results, curve):
    if curve.chance is None:
        return curve.level
    levels = {lookup(fig.summary, curve.chance, None) for fig in results.per_model.values()}
    level = levels.pop() if len(levels) == 1 else None
    return level if isinstance(level, (int, float)) and not isinstance(level, bool) else None


def _charts(results, curve):
    """(file suffix, model or None, {label: (layers, values, low, high, model)}) per chart of a curve: a line
    per declared ``Line``, per model where models share a chart, and per value of the ``group`` columns."""
    several = results.several
    out = []
    for model in results.per_model:
        lines = {}
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for r in _rows(results, model, curve):
            groups.setdefault(tuple(str(r.get(g)) for g in curve.group), []).append(r)
        for key, rows in groups.items():
            for line in curve.lines:
                parts = [model] if several and not curve.per_model else []
                parts += [line.label] if len(curve.lines) > 1 or not (parts or key) else []
                label = curve.joiner.join([*parts, *key])
                has_ci = any(f"{line.column}_ci_low" in r for r in rows)
                lines[label] = ([str(r.get("layer")) for r in rows], [r.get(line.column) for r in rows],
                                [r.get(f"{line.column}_ci_low") for r in rows] if has_ci else None,
                                [r.get(f"{line.column}_ci_high") for r in rows] if has_ci else None, model)
        if curve.per_model:
            out.append(("_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", model) if several else "", model, lines))
        else:
            if not out:
                out.append(("", None, {}))
            out[0][2].update(lines)
    return out


# -- PNG ------------------------------------------------------------------------------------------------------

def plots(decl, results, out_dir: Path) -> list[str]:
    from layerscope.report.plots import layer_lines

    files = []
    for curve in decl.curves:
        if not curve.png:
            continue
        for suffix, model, lines in _charts(results, curve):
            if not lines or all(v is None for _, values, *_rest in lines.values() for v in values):
                continue
            series = {label: (layers, values) for label, (layers, values, *_rest) in lines.items()}
            bands = {label: (lo, hi) for label, (_, _, lo, hi, _) in lines.items() if lo is not None}
            title = _text(decl, results, curve.title) + (f" ({model})" if model and results.several else "")
            files.append(layer_lines(Path(out_dir) / f"{curve.file}{suffix}.png", series, title=title,
                                     ylabel=_text(decl, results, curve.ylabel), hline=_chance(results, curve), bands=bands or None))
    from layerscope.report import declared_grids

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
            rows = [md_data(_p_shown(table, r)) for r in fig.rows(table.name)]
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
    return "\n".join(parts)


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
    return [x for x in fig.rows(listing.value) if listing.where is None or x.get(listing.where)]


def _item(listing, item: dict[str, Any], escape) -> str:
    """One listing line: the item's fields escaped; its sub-items each formatted (and escaped), joined by "; "."""
    values = dict(item)
    if listing.sub:
        subs = [s for s in item.get(listing.sub) or [] if isinstance(s, dict)]
        values[listing.sub] = _Raw("; ".join(fill(listing.each, s, escape) for s in subs))
    return fill(listing.item, values, escape)


class _Raw(str):
    """Text already escaped for its medium (put into a template as it is)."""


# -- report.html --------------------------------------------------------------------------------------------------

def sections(decl, results) -> list:
    from layerscope.report.depth import relative_depths
    from layerscope.report.html_figures import Series, layer_curves
    from layerscope.report.html_figures import Section

    rel = relative_depths(results) is not None
    charts = []
    for curve in decl.curves:
        for _, model, lines in _charts(results, curve):
            series = [Series(label, layers, values, lo, hi, results.num_layers(owner))
                      for label, (layers, values, lo, hi, owner) in lines.items()]
            if not series or all(all(v is None for v in s.values) for s in series):
                continue
            title = _text(decl, results, curve.title) + (f" ({model})" if model and results.several else "")
            caption = curve.caption + (" Dashed line: chance." if _chance(results, curve) is not None else "")
            if rel:
                caption += " Models of different depth are overlaid by relative depth (layer / number of layers)."
            charts.append(layer_curves(series, title=title, ylabel=_text(decl, results, curve.ylabel), caption=caption, relative=rel,
                                       hline=_chance(results, curve)))
    from layerscope.report import declared_grids

    charts += declared_grids.charts(decl, results, fill)
    text = [f"<p>{fill(decl.preface, _preface_values(decl, results), html.escape)}</p>"] if decl.preface else []
    for model, fig in results.per_model.items():
        if decl.sentence:
            name = f"<b>{html.escape(model)}</b>: " if results.several else ""
            text.append(f"<p>{name}{fill(decl.sentence, fig.summary, html.escape)}</p>")
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
        else:
            raise ValueError(f"no report.html section named {name!r}")
        section = make(results)
        if section is not None:
            out.append(section)
    return out


# -- console ---------------------------------------------------------------------------------------------------

def console_summary(decl, results, console) -> None:
    from rich.table import Table

    from layerscope.report.console import esc
    from layerscope.report.writer import fmt

    for model, fig in results.per_model.items():
        if decl.sentence:
            console.print(f"{esc(model)}: {fill(decl.sentence, fig.summary, esc)}", soft_wrap=True)
        for table in [t for i, t in enumerate(decl.tables) if i == 0 or t.console is not None]:
            rows = list(fig.rows(table.name))
            if not rows:
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
