"""What every similarity figure shares: one colour scale for the run's heat maps, and a subtitle naming the
data and the vectors (pooling), read from results alone (PNG and report.html alike)."""

from __future__ import annotations

import math
from pathlib import PurePath
from typing import Any

KEYS = ("linear_cka", "unbiased_cka", "mutual_knn")


def _values(results: dict[str, Any]):
    blocks = [fig for fig in (results.get("per_model") or {}).values() if isinstance(fig, dict)]
    cross = (results.get("combined") or {}).get("cross")
    if isinstance(cross, dict):
        blocks.append(cross)
    for block in blocks:
        for key in KEYS:
            for row in block.get(key) or []:
                for v in row:
                    if v is not None and isinstance(v, (int, float)) and math.isfinite(v):
                        yield float(v)


def colour_scale(results: dict[str, Any]) -> tuple[float, float]:
    """``(low, high)`` for every heat map of the run: 0 to 1, widened to the lowest value (unbiased CKA
    can fall below 0) or the highest (above 1 by estimation noise), so equal colours mean equal values."""
    values = list(_values(results))
    return (min([0.0, *values]), max([1.0, *values]))


def data_label(results: dict[str, Any]) -> str:
    """The texts in a few words: a file's name, the generated set, or the store's name."""
    data = (results.get("combined") or {}).get("data") or {}
    if data.get("label"):
        return str(data["label"])
    origin = str(data.get("origin") or "")
    return PurePath(origin).name if origin and not origin.startswith("generated") else origin or "the texts"


def vectors_label(results: dict[str, Any]) -> str:
    data = (results.get("combined") or {}).get("data") or {}
    if data.get("tokens"):
        return "token vectors"
    return f"{data.get('pooling') or 'mean'} pooling"


def subtitle(results: dict[str, Any]) -> str:
    """``"<data>, <pooling> pooling"``: the line every similarity title carries."""
    return f"{data_label(results)}, {vectors_label(results)}"
