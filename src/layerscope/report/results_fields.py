"""The checks results.json's reader (report/results.py) makes field by field: each bad field is a ``Bad``
naming it, which the reader turns into one line; and the declared figures' checks (numbers where an analysis
declares numbers, matrices of numbers for its heat maps, its typed records)."""

from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Any

from layerscope.report.templates import lookup


class Bad(Exception):
    """A field of the document that is not what layerscope writes (turned into one InputError line)."""


def need(value: Any, kind, where: str, *, optional: bool = False):
    if value is None and optional:
        return value
    if isinstance(kind, tuple) and bool not in kind and isinstance(value, bool):
        raise Bad(f"{where} is {type(value).__name__}, not {' or '.join(k.__name__ for k in kind)}")
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise Bad(f"{where} is {type(value).__name__}, not {name}")
    return value


def as_dict(value: Any, where: str) -> dict[str, Any]:
    """A JSON object (absent: empty); its keys are strings as JSON makes them."""
    return {} if value is None else dict(need(value, dict, where))


def row_list(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    """A JSON list of objects (table rows)."""
    got = need(value, list, where)
    for i, row in enumerate(got):
        need(row, dict, f"{where}[{i}]")
    return tuple(got)


def tables(value: Any, where: str) -> dict[str, tuple[dict[str, Any], ...]]:
    return {str(name): row_list(got, f"{where}.{name}") for name, got in as_dict(value, where).items()}


def safe_relative(path: str, where: str) -> str:
    """A path named by a results file, checked to stay below the folder it is written into."""
    p = PurePosixPath(need(path, str, where))
    if not path or p.is_absolute() or ".." in p.parts or "\\" in path or any(part.startswith("~") for part in p.parts):
        raise Bad(f"{where} names the path {path!r}, which is not a plain path inside the result folder")
    return path


def check_declared(results, figures) -> None:
    """The declared summary fields and table columns (``figures``, report/figures.py) hold numbers (or nothing)."""
    for model, fig in results.per_model.items():
        for name in figures.summary_numbers:  # a declared figure is there, a number or nothing
            if name not in fig.summary:
                raise Bad(f"per_model.{model}.summary lacks {name}")
            _number(fig.summary.get(name), f"per_model.{model}.summary.{name}")
        for table in figures.tables:
            for i, row in enumerate(fig.rows(table.name)):
                for column in table.number_columns(row):
                    _number(row.get(column), f"per_model.{model}.tables.{table.name}[{i}].{column}")
                need(row.get(table.key, ""), (str, int), f"per_model.{model}.tables.{table.name}[{i}].{table.key}")
        for grid in getattr(figures, "heatmaps", ()):
            if grid.block is None and fig.at(grid.value) is not None:
                _grid(fig.at(grid.value), f"per_model.{model}.{grid.value}")
        for spec in getattr(figures, "records", ()):  # each item read by its typed reader, which names a bad field
            if not spec.combined:
                _records(spec, fig, f"per_model.{model}")
    for spec in getattr(figures, "records", ()):
        if spec.combined:
            _records(spec, results.combined, "combined")
    for grid in getattr(figures, "heatmaps", ()):
        if grid.block is None:
            continue
        block = combined_block(results, grid)
        matrix = lookup(block, grid.value, None) if isinstance(block, dict) else None
        if matrix is not None:
            _grid(matrix, ".".join(p for p in ("combined", grid.block, grid.value) if p))


def combined_block(results, spec) -> Any:
    """The dict of the run's combined figures a heat map's ``block`` names (``""``: the combined figures)."""
    return results.combined.extra if spec.block == "" else results.combined.value(spec.block)


def _records(spec, fig, where: str) -> None:
    items = fig.value(spec.value)
    if items is not None:
        for i, item in enumerate(need(items, list, f"{where}.{spec.value}")):
            spec.read(item, f"{where}.{spec.value}[{i}]")


def _grid(value: Any, where: str) -> None:
    """A declared heat map's matrix: rows of numbers (or nothing, for an undefined cell)."""
    for i, row in enumerate(need(value, list, where)):
        for j, cell in enumerate(need(row, list, f"{where}[{i}]")):
            _number(cell, f"{where}[{i}][{j}]")


def number_or_nan(value: Any, name: str) -> float:
    """A number read back from results.json as a float; null (an undefined figure) is NaN; anything else that
    is not an int or float (a bool included) is a TypeError naming the field."""
    if value is None:
        return float("nan")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} is {type(value).__name__}, not a number")
    return float(value)


def _number(value: Any, where: str) -> None:
    if value is None:
        return
    need(value, (int, float), where)
    if not math.isfinite(value):
        raise Bad(f"{where} is {value}, not a finite number")
