"""The per-model figures of ``run vision_lens`` and ``run cls_attention`` read back from results.json, typed:
what their report.md and report.html draw (analyses/vision_lens.py and analyses/cls_attention.py write them).

``VisionLensFigures.read(fig, where)`` and ``ClsAttentionFigures.read(fig, where)`` check a model's figures once
and say in one line what is wrong with a file that was edited or written by another version; the readers then
use fields, never string keys.  The shown images stay as written: report/image_html.py checks each one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from layerscope.errors import InputError
from layerscope.report.results_fields import number_or_nan as _number


@dataclass(frozen=True)
class LayerFigure:
    """One layer's figure with its 95% interval (NaN where none was computed)."""

    layer: str
    value: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class VisionLensFigures:
    """One model's vision lens: zero-shot accuracy by layer (Wilson intervals), the best and the last layer."""

    n_images: int
    classes: tuple[str, ...]
    chance: float
    best_layer: str
    last_layer: str
    layers: tuple[LayerFigure, ...]
    images: tuple[Mapping[str, Any], ...]

    @classmethod
    def read(cls, fig: Any, where: str) -> VisionLensFigures:
        def read_one():
            s = _mapping(fig["summary"], "summary")
            rows = tuple(LayerFigure(str(r["layer"]), _number(r["accuracy"], "accuracy"),
                                     _number(r.get("accuracy_ci_low"), "accuracy_ci_low"),
                                     _number(r.get("accuracy_ci_high"), "accuracy_ci_high"))
                         for r in _rows(fig, "layers"))
            classes = s["classes"]
            if not isinstance(classes, list) or len(classes) < 2:
                raise ValueError("classes is not a list of at least two labels")
            images = fig.get("images") or []
            if not isinstance(images, list):
                raise TypeError("images is not a list")
            return cls(_count(s["n_images"], "n_images"), tuple(str(c) for c in classes),
                       _number(s["chance"], "chance"), str(s["best_layer"]), str(s["last_layer"]), rows,
                       tuple(i for i in images if isinstance(i, Mapping)))

        return _checked(read_one, where, "vision lens")


@dataclass(frozen=True)
class ClsAttentionFigures:
    """One model's CLS attention: per layer the share on the patches (bootstrap interval) and its entropy."""

    n_images: int
    grid: tuple[int, int]
    layers: tuple[LayerFigure, ...]
    entropy: tuple[float, ...]
    maps: tuple[Mapping[str, Any], ...]

    @classmethod
    def read(cls, fig: Any, where: str) -> ClsAttentionFigures:
        def read_one():
            s = _mapping(fig["summary"], "summary")
            rows = _rows(fig, "layers")
            grid = s["grid"]
            if not isinstance(grid, list) or len(grid) != 2:
                raise TypeError("grid is not [rows, columns]")
            maps = fig.get("maps") or []
            if not isinstance(maps, list):
                raise TypeError("maps is not a list")
            return cls(_count(s["n_images"], "n_images"), (_count(grid[0], "grid"), _count(grid[1], "grid")),
                       tuple(LayerFigure(str(r["layer"]), _number(r["share_on_patches"], "share_on_patches"),
                                         _number(r.get("share_on_patches_ci_low"), "share_on_patches_ci_low"),
                                         _number(r.get("share_on_patches_ci_high"), "share_on_patches_ci_high"))
                             for r in rows),
                       tuple(_number(r["entropy_over_patches"], "entropy_over_patches") for r in rows),
                       tuple(m for m in maps if isinstance(m, Mapping)))

        return _checked(read_one, where, "CLS attention")


def per_model(results: Any, reader) -> dict[str, Any]:
    """``{model: reader.read(figures)}`` over a results document's ``per_model``."""
    models = results.get("per_model") if isinstance(results, Mapping) else None
    if not isinstance(models, Mapping):
        return {}
    return {str(m): reader.read(fig, f"results.json per_model.{m}") for m, fig in models.items()}


def _checked(read_one, where: str, what: str):
    try:
        return read_one()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{where}: the {what} figures are garbled ({type(exc).__name__}: {exc}); it was edited "
                         "or written by another version: re-run layerscope run") from None


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} is {type(value).__name__}, not an object")
    return value


def _rows(fig: Any, table: str) -> list[Mapping[str, Any]]:
    rows = _mapping(_mapping(fig, "the model's figures")["tables"], "tables")[table]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, Mapping) for r in rows):
        raise TypeError(f"table {table} is not a list of rows")
    return rows


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{name} is {value!r}, not a count")
    return value
