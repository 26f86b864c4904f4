"""Declared heat maps and grouped bars (report/figures.py ``HeatMap``, ``Bars``) drawn from typed results: PNG,
report.md, report.html and the console, from the one declaration (report/declared.py calls these).

Titles and captions are templates (``declared.fill``) filled with the text as it is: matplotlib draws it as text
and the page escapes every title, label and caption; report.md and the console escape what they put in.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from layerscope.report.results_fields import combined_block
from layerscope.report.templates import fill, lookup


def _plain(text: str) -> str:
    return text


def _about(decl, results) -> str:
    return decl.about(results) if decl.about is not None else ""


# -- heat maps -----------------------------------------------------------------------------------------------

class Grid:
    """One heat map to draw: the matrix, its labels, its filled title and caption and its PNG name."""

    def __init__(self, spec, file: str, title: str, caption: str, matrix, rows, cols, xlabel: str, ylabel: str,
                 model: str | None = None):
        self.spec, self.file, self.title, self.caption, self.model = spec, file, title, caption, model
        self.matrix = [[_number(v) for v in row] for row in matrix]
        self.rows, self.cols = [str(r) for r in rows], [str(c) for c in cols]
        self.xlabel, self.ylabel = xlabel, ylabel


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _matrix(value: Any, rows: Any, cols: Any):
    """A matrix and its labels as read, or None where they are not a list of lists matching the labels."""
    if not isinstance(value, list) or not isinstance(rows, list) or not isinstance(cols, list):
        return None
    if len(value) != len(rows) or any(not isinstance(r, list) or len(r) != len(cols) for r in value):
        return None
    return value, rows, cols


def _labels(spec, matrix: Any, named) -> tuple[Any, Any]:
    """A heat map's row and column labels: the lists ``named(rows)``/``named(cols)`` names, or counted from the
    number the declaration gives (layers from 1, heads from 0) over the matrix as read."""
    first = matrix[0] if isinstance(matrix, list) and matrix and isinstance(matrix[0], list) else []

    def one(key: Any, size: int) -> Any:
        return [str(key + i) for i in range(size)] if isinstance(key, int) else named(key)

    cols = spec.rows if spec.cols is None else spec.cols
    return one(spec.rows, len(matrix) if isinstance(matrix, list) else 0), one(cols, len(first))


def grids(decl, results, fill) -> list[Grid]:
    """Every declared heat map of ``results``: one per model (``FILE_<i>`` where several), or one per block."""
    about = _about(decl, results)
    out = []
    for spec in decl.heatmaps:
        if spec.block is not None:
            block = combined_block(results, spec)
            if not isinstance(block, dict):
                continue
            matrix = lookup(block, spec.value, None)
            got = _matrix(matrix, *_labels(spec, matrix, block.get))
            values = {**{k: v for k, v in block.items() if isinstance(v, (str, int, float))}, "about": about}
            if got is not None:
                out.append(Grid(spec, spec.file, fill(spec.title, values, _plain), fill(spec.caption, values, _plain),
                                *got, fill(spec.xlabel, values, _plain), fill(spec.ylabel, values, _plain)))
            continue
        for i, (model, fig) in enumerate(results.per_model.items()):
            got = _matrix(fig.at(spec.value), *_labels(spec, fig.at(spec.value), fig.value))
            if got is None:
                continue
            values = {**fig.summary, "model": model, "about": about}
            out.append(Grid(spec, spec.file + (f"_{i}" if results.several else ""), fill(spec.title, values, _plain),
                            fill(spec.caption, values, _plain), *got, spec.xlabel, spec.ylabel, model))
    return out


def scale(all_grids: list[Grid]) -> tuple[float, float] | None:
    """The one colour scale of the heat maps that declare one: their least range widened to every value."""
    scaled = [g for g in all_grids if g.spec.scale is not None]
    if not scaled:
        return None
    values = [v for g in scaled for row in g.matrix for v in row if v is not None]
    return (min([*(g.spec.scale[0] for g in scaled), *values]), max([*(g.spec.scale[1] for g in scaled), *values]))


def _range(grid: Grid, shared) -> tuple[float | None, float | None]:
    return shared if grid.spec.scale is not None and shared is not None else (None, None)


# -- grouped bars ----------------------------------------------------------------------------------------------

def bar_groups(spec, results) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, tuple[Any, Any]]]]:
    """``(groups, errors)`` of one ``Bars`` declaration: {group: {bar: value}} and {group: {bar: (low, high)}}."""
    groups: dict[str, dict[str, Any]] = {}
    errors: dict[str, dict[str, tuple[Any, Any]]] = {}
    for model, fig in results.per_model.items():
        final = str(results.num_layers(model))
        for r in fig.rows(spec.rows):
            if (spec.where is not None and not spec.where(r)) or (spec.final_layer and str(r.get("layer")) != final):
                continue
            for line in spec.values:
                value = _number(r.get(line.column))
                if value is None:
                    continue
                named = fill(spec.group, r, str) if "{" in spec.group else str(r.get(spec.group))
                parts = [model] if results.several and not spec.by_model else []
                parts += [named] if spec.by_model else []
                parts += [str(r.get(spec.split))] if spec.split else []
                parts += [line.label] if len(spec.values) > 1 or not parts else []
                bar = " ".join(parts)
                group = model if spec.by_model else named
                groups.setdefault(group, {})[bar] = value
                low, high = (r.get(line.ci[0]), r.get(line.ci[1])) if line.ci else \
                    (r.get(f"{line.column}_ci_low"), r.get(f"{line.column}_ci_high"))
                if _number(low) is not None and _number(high) is not None:
                    errors.setdefault(group, {})[bar] = (low, high)
    return groups, errors


# -- the media --------------------------------------------------------------------------------------------------

def run_line(results) -> str:
    """The models and the data a run's figures show, for a PNG's title: a figure alone in a folder of several
    runs' (or in a paper) says what it is of. ``$`` is kept from matplotlib's math mode."""
    from pathlib import PurePath

    models = ", ".join(str(m) for m in (results.models or results.per_model))
    data = results.settings.data
    name = (PurePath(str(data).replace(chr(92), "/")).name if data else results.data_origin
            or results.default_data or f"{results.analysis}'s built-in data")
    return f"{models} · {name}".replace("$", r"\$")


def png_title(title: str, results, model: str | None = None) -> str:
    """A PNG's title: the declared one, with the run's models and data below it (``run_line``) unless it names them
    already (an ``{about}``, or a ``{model} on {data_name}`` of the one ``model`` a heat map shows), so no title
    says it twice."""
    if ", ".join(str(m) for m in ([model] if model else results.per_model)) in title:
        return title
    return f"{title}\n{run_line(results)}"


def plots(decl, results, out_dir: Path, fill) -> list[str]:
    from layerscope.report.plots import bars, heatmap

    files = []
    made = grids(decl, results, fill)
    shared = scale(made)
    for g in made:
        if not g.spec.png:
            continue
        low, high = _range(g, shared)
        files.append(heatmap(Path(out_dir) / f"{g.file}.png", [[math.nan if v is None else v for v in row]
                                                                 for row in g.matrix], g.rows, g.cols,
                             title=png_title(g.title, results, g.model), xlabel=g.xlabel, ylabel=g.ylabel,
                             vmin=low, vmax=high,
                             rotate=max(map(len, g.cols), default=0) > 4))  # words (tokens), not numbers
    about = _about(decl, results)
    for spec in decl.bars:
        groups, errors = bar_groups(spec, results)
        if groups:
            files.append(bars(Path(out_dir) / f"{spec.file}.png", groups, errors=errors or None,
                              band_label=spec.band or "95% interval", hline=spec.level,
                              title=png_title(fill(spec.title, {'about': about}, _plain), results),
                              ylabel=fill(spec.ylabel, {"about": about}, _plain)))
    return files


def scale_note(made: list[Grid]) -> str:
    """report.md's line on the one colour scale ("" where no heat map declares one)."""
    shared = scale(made)
    return "" if shared is None else (f"Every heat map uses one colour scale, {shared[0]:.3g} to {shared[1]:.3g}, "
                                      "so equal colours are equal values across figures.\n")


def grid_markdown(g: Grid, md_data) -> str:
    """A heat map declared ``markdown=True`` as a report.md table (two decimals); "" for the others."""
    if not g.spec.markdown:
        return ""
    head = [md_data(g.ylabel), *(md_data(c) for c in g.cols)]
    lines = [f"{md_data(g.title)}:\n", "| " + " | ".join(head) + " |", "|---|" + "---|" * len(g.cols)]
    lines += [f"| {md_data(r)} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in row) + " |"
              for r, row in zip(g.rows, g.matrix)]
    return "\n".join(lines) + "\n"


def charts(decl, results, fill) -> list:
    from layerscope.report.html_figures import bars, heatmap

    out = []
    made = grids(decl, results, fill)
    shared = scale(made)
    for g in made:
        low, high = _range(g, shared)
        note = f" Colour scale {low:g} to {high:g} for every heat map here." if low is not None else ""
        out.append(heatmap(g.matrix, g.rows, g.cols, title=g.title, caption=g.caption + note, xlabel=g.xlabel,
                           ylabel=g.ylabel, zlabel=g.spec.zlabel, zmin=low, zmax=high))
    about = _about(decl, results)
    for spec in decl.bars:
        groups, errors = bar_groups(spec, results)
        if groups:
            out.append(bars(groups, errors=errors or None, band=spec.band or "95% interval", hline=spec.level,
                            title=fill(spec.title, {"about": about}, _plain),
                            ylabel=fill(spec.ylabel, {"about": about}, _plain),
                            caption=fill(spec.caption, {"about": about}, _plain)))
    return out


def console_summary(decl, results, console, fill) -> None:
    from rich.table import Table

    from layerscope.report.console import esc
    from layerscope.report.writer import num

    for g in grids(decl, results, fill):
        if not g.spec.markdown:
            continue
        t = Table(title=esc(g.title))
        t.add_column(esc(g.ylabel))
        for c in g.cols:
            t.add_column(esc(c), justify="right")
        for r, row in zip(g.rows, g.matrix):
            t.add_row(esc(r), *("-" if v is None else num(v, 2) for v in row))
        console.print(t)
