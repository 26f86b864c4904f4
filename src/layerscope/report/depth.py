"""The one depth axis of a run's layer figures, for the PNGs and report.html alike.

Models of the same depth (or one model) share the layer axis: ``raw``, ``0`` ... ``L``. Models of different
depths are overlaid by relative depth, layer / number of layers (0 = the embedding output, 1 = the last
block), where ``raw`` has no place. ``relative_depths(results)`` decides, from results alone.
"""

from __future__ import annotations

RELATIVE_LABEL = "relative depth (layer / number of layers)"


def relative_depths(results) -> dict[str, int] | None:
    """``{model: number of layers}`` when the run's models (``results``: typed, or a results document) differ
    in depth (the relative-depth axis), else None (the layer axis)."""
    from layerscope.report.results import as_results

    depths = as_results(results).depths
    return depths if len(depths) > 1 and len(set(depths.values())) > 1 else None


def depth_of(label: str, depths: dict[str, int]) -> int | None:
    """The depth of the model a series label names: the label is the model's name, or starts with it and a
    space (``"<model> <pooling>"``); the longest such name wins."""
    found = [m for m in depths if label == m or label.startswith(m + " ")]
    return depths[max(found, key=len)] if found else None
