"""What an analysis shows, declared once: its curves, tables, prose and listings.

An analysis sets ``AnalysisMetadata.figures`` to a ``Figures`` declaration; ``report/declared.py``
renders that one declaration to PNG (and SVG), report.md, report.html and the console summary (heat maps and
grouped bars by ``report/declared_grids.py``), and
``analyses/results.py`` checks the declared summary fields and table columns when a results.json
is read back. An analysis that declares nothing keeps its own ``plots``/``report``/``console_summary``.

Templates (``Figures.sentence``, ``Listing.item``) are ``str.format`` strings over a model's summary
(or a listing's item); every value from results.json is escaped for the medium before it is put in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Line:
    """One line of a curve: ``column`` of the table's rows, shown as ``label``; ``column_ci_low`` and
    ``column_ci_high`` in the rows, where present, are drawn as its band."""

    column: str
    label: str
    ci: tuple[str, str] | None = None  # the interval's columns where not ``column_ci_low``/``column_ci_high``


@dataclass(frozen=True)
class Curve:
    """Lines over the layers of one table (each row one layer, in ``Table.key``): one chart per model, or
    every model's lines in one chart (``per_model=False``, one line per model). ``file``: the PNG's name, with
    ``_<model>`` added per model where several; a ``{slug}`` in it names the model always."""

    table: str
    lines: tuple[Line, ...]
    file: str  # the PNG's name, without .png
    title: str
    ylabel: str
    caption: str = ""
    chance: str | Callable[[dict[str, Any]], Any] | None = None  # a summary field (or dotted path: chance.acc@1,
    # or a function of the summary) drawn as a dashed line (chance)
    level: float | None = None  # a fixed dashed line where ``chance`` names none (z = 0, say)
    level_label: str = "chance"  # what the dashed line is, as its legend and caption name it
    png: bool = True  # False: drawn on report.html only
    per_model: bool = True
    layers_only: bool = False  # leave out rows whose key is not a layer (raw, 0..L): e.g. "last4"
    group: tuple[str, ...] = ()  # columns whose values split the rows into lines (e.g. task and pooling)
    joiner: str = " "  # between the parts of a line's name on report.html (model, line, group values; PNG: " ")
    x: str = "layer"  # the rows' column along the x axis (layers, or e.g. k); only "layer" overlays by depth
    xlabel: str = "layer"
    where: Callable[[dict[str, Any]], bool] | None = None  # keep only the rows it says yes to
    refs: str | None = None  # rows without an x value: a flat dashed reference each, named by this column
    from_zero: bool = False  # the y axis starts at 0
    logx: bool = False  # x is a number (dimensions kept, say), on a log axis
    label: str = ""  # a template over a group's first row naming its line ("pair {pair} at {layer}")
    most: int | None = None  # at most this many lines of each model (the first ones)
    band: str = ""  # report.html's name of the band (default: the 95% interval's usual name)


@dataclass(frozen=True)
class Table:
    """A table of each model's figures (``name``: a table, or a dotted path to a list of rows beside them): ``columns`` shown in report.md and the console (the CSV and
    report.html hold every column); columns whose name starts with one of ``prefixes`` follow them, as the
    rows hold them (where some row holds a value); ``numbers``: the columns that hold a number or nothing (checked on load; default:
    every shown column but ``key``)."""

    name: str
    columns: tuple[str, ...]
    key: str = "layer"
    prefixes: tuple[str, ...] = ()
    digits: int = 3
    numbers: tuple[str, ...] | None = None
    console: tuple[str, ...] | None = None  # the columns the console shows (default: the shown ones)
    final_layer: bool = False  # report.md and the console show each model's final layer's rows only
    pivot: str | None = None  # the console: a row per key, a column per value of this column ("pooling")
    cell: str = ""  # ... each cell this template over its row, e.g. "{win_rate:.3f} ({mean_diff:+.4f})"
    cell_label: str = ""  # ... each column headed "<value> <cell_label>"
    p_values: tuple[str, ...] = ()  # columns of p-values: shown as 1.2e-05 (below the smallest double: < 1e-300)

    def shown(self, rows) -> list[str]:
        extra = [c for row in rows[:1] for c in row if c not in self.columns and c.startswith(self.prefixes)
                 and any(r.get(c) is not None for r in rows)] if self.prefixes else []
        return [*self.columns, *extra]

    def number_columns(self, row) -> list[str]:
        if self.numbers is not None:
            return list(self.numbers)
        return [c for c in self.shown([row]) if c != self.key]


@dataclass(frozen=True)
class Listing:
    """A list kept beside the tables (``Figures.extra[value]``; a table, a dotted path or one dict of them: see
    ``ModelFigures.rows``): one line per item, at most ``limit``;
    ``item`` formats the item, ``each`` its sub-items (under ``sub``), joined with "; " into ``{sub}``."""

    value: str
    title: str
    item: str
    sub: str | None = None
    each: str = ""
    limit: int = 5
    html_limit: int = 50
    where: str | Callable[[dict[str, Any]], bool] | None = None  # only items whose field holds something (or it says yes)


@dataclass(frozen=True)
class HeatMap:
    """A matrix as coloured cells: each model's ``value`` (rows of numbers, None for an undefined cell, kept
    beside the tables), its rows labelled by the list ``rows`` and its columns by ``cols`` (default: ``rows``);
    with ``block``, one matrix of the run's combined figures, read from that dict of them (``""``: the combined
    figures themselves), the labels' lists named in the same dict.

    ``rows`` or ``cols`` a number: the rows (columns) are counted from it instead (layers from 1, heads from 0);
    ``value`` may be a dotted path (``grids.entropy``).

    ``title`` and ``caption`` are templates over the model's summary (or the block's fields) with ``model`` and
    ``about`` (``Figures.about``); ``scale``: the colour scale's least range, widened to hold every value of every
    heat map of the run that declares one, so equal colours are equal values across them; ``markdown``: the
    matrix is also a table in report.md and on the console; ``png=False``: drawn on report.html only. Several
    models: one PNG each, ``FILE_<i>.png``."""

    value: str
    file: str
    title: str
    zlabel: str
    rows: str | int = "layers"
    cols: str | int | None = None
    xlabel: str = "layer"
    ylabel: str = "layer"
    caption: str = ""
    block: str | None = None
    scale: tuple[float, float] | None = None
    markdown: bool = False
    png: bool = True


@dataclass(frozen=True)
class Bars:
    """Grouped bars from each model's rows (a table, or a list of rows kept beside the tables at the dotted
    path ``rows``, e.g. ``probe.rows``): one group per value of the ``group`` column (or per row, where
    ``group`` is a template over the row: ``{method_a} - {method_b}``), in each group one bar per
    model (where several), per value of the ``split`` column and per ``Line`` (its ``_ci_low``/``_ci_high``
    columns, where present, drawn as whiskers). Rows whose bars are all empty are left out."""

    rows: str
    group: str
    values: tuple[Line, ...]
    file: str
    title: str
    ylabel: str
    caption: str = ""
    split: str | None = None
    where: Callable[[dict[str, Any]], bool] | None = None  # keep only the rows it says yes to
    final_layer: bool = False  # keep only each model's final layer's rows (its "layer" column)
    by_model: bool = False  # one group per model instead, its bars named by the ``group`` column
    band: str = ""  # the whiskers' interval, as the legend and caption name it (default: "95% interval")
    level: float | None = None  # a dashed chance line (0.5 for a win rate)


@dataclass(frozen=True)
class Records:
    """A list each model keeps beside its tables (``value``: the viewer's texts, the pairs shown), each item a
    typed record: ``read(item, where)`` (a frozen type's reader) returns it or raises ``results_fields.Bad``
    naming the bad field. Checked when results.json is read; page sections get the records typed
    (``ModelFigures.records``). ``combined``: the list is kept in the run's combined figures instead."""

    value: str
    read: Callable[[Any, str], Any]
    combined: bool = False


@dataclass(frozen=True)
class Figures:
    """An analysis's figures as reports show them (see the module's docstring)."""

    sentence: str = ""  # report.md's and report.html's line per model, over its summary
    summary_numbers: tuple[str, ...] = ()  # summary fields that hold a number or nothing (checked on load)
    curves: tuple[Curve, ...] = ()
    tables: tuple[Table, ...] = ()
    listings: tuple[Listing, ...] = ()
    heatmaps: tuple[HeatMap, ...] = ()
    bars: tuple[Bars, ...] = ()
    about: Callable[[Any], str] | None = None  # typed results -> the line titles carry as {about} (data, vectors)
    preface: str = ""  # report.md's and report.html's words before the models': the combined figures and {about}
    console_preface: bool = False  # the console shows the preface too (where it holds the run's headline)
    page: tuple[str, ...] = ()  # report.html's own sections after the charts, by name ("neighbours": alignment's)
    files: tuple[str, ...] = ()  # pages of its own beside the report, by name ("saliency.html": token highlights)
    records: tuple[Records, ...] = ()  # lists of typed records kept beside the tables (checked on load)
