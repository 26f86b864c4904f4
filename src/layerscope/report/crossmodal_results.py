"""crossmodal's combined figures read back from results.json, typed: what its heat map PNG draws
(analyses/crossmodal.py writes them and declares what report.md and report.html show; report/crossmodal_plot.py
draws the PNG), each figure the ``Figure`` metrics/crossmodal.py computes.

``CrossmodalResult.read(results.combined.extra, where)`` checks the shape once (every figure a grid of image layers by
text layers, the best pair one of those layers) and says in one line what is wrong with a file that was edited
or written by another version; the readers then use fields, never string keys.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np

from layerscope.errors import InputError
from layerscope.metrics.crossmodal import Figure
from layerscope.report.results_fields import number_or_nan as _number

# One figure over every (image layer, text layer) pair as metrics/crossmodal.py computes it and results.json keeps
# it: each array ``[image layers, text layers]`` (NaN: undefined, saved as null).
FIGURE_FIELDS = tuple(f.name for f in fields(Figure))


@dataclass(frozen=True)
class BestPair:
    """The best layer pair by ``figure``, with the interval of the maximum over every pair."""

    figure: str
    image_layer: str
    text_layer: str
    value: float
    ci_low: float
    ci_high: float
    chosen_share: float
    p: float


@dataclass(frozen=True)
class CrossmodalResult:
    image_model: str
    text_model: str
    image_layers: tuple[str, ...]
    text_layers: tuple[str, ...]
    n: int
    figures: Mapping[str, Figure]
    best: BestPair | None

    @property
    def best_cell(self) -> tuple[int, int] | None:
        """(row, column) of the best pair in the grids."""
        if self.best is None:
            return None
        return self.image_layers.index(self.best.image_layer), self.text_layers.index(self.best.text_layer)

    @classmethod
    def read(cls, combined: Any, where: str = "results.json") -> CrossmodalResult | None:
        """The combined figures of a crossmodal run, or None where the run wrote none (one line if garbled)."""
        if not isinstance(combined, Mapping) or "figures" not in combined:
            return None
        try:
            return cls._read(combined)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: crossmodal's combined figures are garbled ({type(exc).__name__}: {exc}); "
                             "it was edited or written by another version: re-run layerscope run") from None

    @classmethod
    def _read(cls, c: Mapping[str, Any]) -> CrossmodalResult:
        rows, cols = _names(c["image_layers"]), _names(c["text_layers"])
        figures = {}
        for name, fig in _mapping(c["figures"]).items():
            grids = [_grid(_mapping(fig)[f], (len(rows), len(cols)), f"{name}.{f}") for f in FIGURE_FIELDS]
            figures[str(name)] = Figure(*grids)
        best = None
        if c.get("best") is not None:
            b = _mapping(c["best"])
            best = BestPair(str(b["figure"]), str(b["image_layer"]), str(b["text_layer"]),
                            *(_number(b[f], f) for f in ("value", "ci_low", "ci_high", "chosen_share", "p")))
            if best.figure not in figures or best.image_layer not in rows or best.text_layer not in cols:
                raise ValueError(f"the best pair ({best.figure}, image layer {best.image_layer}, text layer "
                                 f"{best.text_layer}) is not among the figures and layers")
        n = c["n"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise TypeError(f"n is {n!r}, not a count")
        return cls(str(c["image_model"]), str(c["text_model"]), rows, cols, n, figures, best)


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{type(value).__name__} where an object belongs")
    return value


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise TypeError("the layers are not a list of names")
    return tuple(str(x) for x in value)


def _grid(value: Any, shape: tuple[int, int], name: str) -> np.ndarray:
    """A grid of numbers (null: NaN) of ``shape``."""
    if not isinstance(value, list) or any(not isinstance(row, list) for row in value):
        raise TypeError(f"{name} is not a grid of numbers")
    grid = np.array([[_number(x, name) for x in row] for row in value], dtype=float).reshape(len(value), -1)
    if grid.shape != shape:
        raise ValueError(f"{name} is {grid.shape[0]}x{grid.shape[1]}, not image layers x text layers "
                         f"({shape[0]}x{shape[1]})")
    return grid
