"""The several-models part of results.json, typed: ``Comparison`` read from the combined figures that
analyses/compare.py writes (``combined.comparison`` and the tables ``side_by_side`` and ``model_comparison``).

Part of the results reader (report/results.py): the one place these are read by key. A field that is missing or
of another type reads as nothing (older results, or none for one model); report/compare.py draws from this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class SideCell:
    """One model in one row of the side-by-side table: its layer there (None: no such row), score, interval."""

    layer: str | None
    score: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class SideRow:
    group: str  # the row's pooling (or task and pooling)
    at: str  # its layer, or relative depth
    cells: dict[str, SideCell]


@dataclass(frozen=True)
class Side:
    """One model of a model-vs-model test: its name, group (pooling) and layer, the layers tying its best."""

    model: str
    group: str | None
    layer: str | None
    tied: str | None
    score: float | None


@dataclass(frozen=True)
class PairTest:
    comparison: str
    a: Side
    b: Side
    difference: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_holm: float | None


@dataclass(frozen=True)
class Comparison:
    """What analyses/compare.py recorded for several models (see the module's docstring)."""

    models: tuple[str, ...] = ()
    score: str = ""
    score_label: str = ""
    by: str = "layer"
    group_label: str = "pooling"
    n_items: int | None = None
    n_resamples: int | None = None
    seed: int | None = None
    num_layers: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    correction: str | None = None
    skipped: str | None = None
    side_by_side: tuple[SideRow, ...] = ()
    tests: tuple[PairTest, ...] = ()

    @classmethod
    def read(cls, combined) -> Comparison | None:
        """From the run's combined figures (a ``ModelFigures``, or the ``combined`` object of a results
        document); None where there is no comparison."""
        if isinstance(combined, dict):
            from layerscope.report.results import ModelFigures

            combined = ModelFigures.read(combined.get("combined"), "combined")
        meta = combined.value("comparison")
        if not isinstance(meta, dict):
            return None
        if meta.get("skipped"):
            return cls(skipped=str(meta.get("skipped")))
        models = tuple(str(m) for m in meta.get("models") or [])
        score, group, by = str(meta.get("score") or ""), str(meta.get("group_label") or "pooling"), \
            str(meta.get("by") or "layer")
        side = tuple(SideRow(str(r.get(group)), str(r.get(by)),
                             {m: SideCell(_text(r.get(f"{m} layer")), _number(r.get(f"{m} {score}")),
                                          _number(r.get(f"{m} ci_low")), _number(r.get(f"{m} ci_high")))
                              for m in models})
                     for r in combined.table("side_by_side"))

        def one(r, end: str) -> Side:
            return Side(str(r.get(f"model_{end}")), _text(r.get(f"{group}_{end}")), _text(r.get(f"layer_{end}")),
                        _text(r.get(f"tied_{end}")), _number(r.get(f"{score}_{end}")))

        tests = tuple(PairTest(str(r.get("comparison")), one(r, "a"), one(r, "b"), _number(r.get("difference")),
                               _number(r.get("ci_low")), _number(r.get("ci_high")), _number(r.get("p_value")),
                               _number(r.get("p_holm")))
                      for r in combined.table("model_comparison"))
        n_layers = meta.get("num_layers")
        return cls(models=models, score=score, score_label=str(meta.get("score_label") or score), by=by,
                   group_label=group, n_items=_number(meta.get("n_items")), n_resamples=_number(meta.get("n_resamples")),
                   seed=_number(meta.get("seed")), num_layers=dict(n_layers) if isinstance(n_layers, dict) else {},
                   notes=tuple(str(n) for n in meta.get("notes") or []), correction=_text(meta.get("correction")),
                   side_by_side=side, tests=tests)
