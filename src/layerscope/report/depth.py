"""The one depth axis of a run's layer figures, for the PNGs and report.html alike.

Models of the same depth (or one model) share the layer axis: ``raw``, ``0`` ... ``L``. Models of different
depths are overlaid by relative depth, layer / number of layers (0 = the embedding output, 1 = the last
block), where ``raw`` has no place. ``relative_depths(results)`` decides, from results alone.
"""

from __future__ import annotations

from typing import Any

RELATIVE_LABEL = "relative depth (layer / number of layers)"


def model_depths(results: dict[str, Any]) -> dict[str, int]:
    """Each model's number of layers (blocks), by its name in ``per_model``."""
    out = {}
    for model in results.get("per_model") or {}:
        man = ((results.get("models") or {}).get(model) or {}).get("manifest") or {}
        value = man.get("num_layers")
        if isinstance(value, int) and value > 0:
            out[str(model)] = value
    return out


def relative_depths(results: dict[str, Any]) -> dict[str, int] | None:
    """``{model: number of layers}`` when the run's models differ in depth (the relative-depth axis), else
    None (the layer axis)."""
    depths = model_depths(results)
    return depths if len(depths) > 1 and len(set(depths.values())) > 1 else None


def depth_of(label: str, depths: dict[str, int]) -> int | None:
    """The depth of the model a series label names: the label is the model's name, or starts with it and a
    space (``"<model> <pooling>"``); the longest such name wins."""
    found = [m for m in depths if label == m or label.startswith(m + " ")]
    return depths[max(found, key=len)] if found else None
