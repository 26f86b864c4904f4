"""The items the image analyses keep for report.html, typed: crossmodal's pairs shown (``ShownPair``), the vision
lens's images with each layer's pick (``LensImage``), cls_attention's maps (``ClsMap``), and the vision lens's
best and last layer (``LensPicks``, read from a model's summary).

Each ``read(doc, where)`` checks one item field by field and raises ``results_fields.Bad`` naming the bad field,
which the results reader turns into one line; the analyses declare them as ``Records`` (report/figures.py), so
results.json is checked when read and the page sections (report/image_html.py) get fields, never string keys.
A thumbnail stays the text it was read as: report/image_html.py decodes and re-encodes it before it reaches a
page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from layerscope.report.figures import Records
from layerscope.report.results_fields import Bad, as_dict, need


def _text(doc: Mapping[str, Any], key: str, where: str) -> str:
    """A label-like field: text, or a number written as one (an id or a layer)."""
    value = need(doc.get(key), (str, int), f"{where}.{key}")
    return str(value)


def _thumbnail(doc: Mapping[str, Any], where: str, *, optional: bool = False) -> str | None:
    return need(doc.get("thumbnail"), str, f"{where}.thumbnail", optional=optional)


@dataclass(frozen=True)
class ShownPair:
    """One image-caption pair of a crossmodal run: its id, caption and (for the first ones) a small PNG."""

    id: str
    caption: str
    thumbnail: str | None

    @classmethod
    def read(cls, doc: Any, where: str) -> ShownPair:
        doc = as_dict(doc, where)
        return cls(_text(doc, "id", where), need(doc.get("caption"), str, f"{where}.caption"),
                   _thumbnail(doc, where, optional=True))


@dataclass(frozen=True)
class LensImage:
    """One image the vision lens shows: its id, label, small PNG and the class each layer picks."""

    id: str
    label: str
    thumbnail: str
    predicted: Mapping[str, str]

    @classmethod
    def read(cls, doc: Any, where: str) -> LensImage:
        doc = as_dict(doc, where)
        picks = as_dict(doc.get("predicted"), f"{where}.predicted")
        return cls(_text(doc, "id", where), need(doc.get("label"), str, f"{where}.label"), _thumbnail(doc, where),
                   {str(layer): need(c, str, f"{where}.predicted.{layer}") for layer, c in picks.items()})


@dataclass(frozen=True)
class ClsMap:
    """One image cls_attention shows: its id, label, the layer drawn, the CLS attention on the patch grid
    (rows of numbers) and the image with that map drawn over it (small PNG)."""

    id: str
    label: str
    layer: str
    map: tuple[tuple[float, ...], ...]
    thumbnail: str

    @classmethod
    def read(cls, doc: Any, where: str) -> ClsMap:
        doc = as_dict(doc, where)
        rows = need(doc.get("map"), list, f"{where}.map")
        grid = tuple(tuple(_number(v, f"{where}.map[{i}][{j}]") for j, v in enumerate(need(r, list, f"{where}.map[{i}]")))
                     for i, r in enumerate(rows))
        if len({len(r) for r in grid}) > 1:
            raise Bad(f"{where}.map is not a grid (its rows differ in length)")
        return cls(_text(doc, "id", where), need(doc.get("label"), str, f"{where}.label"),
                   _text(doc, "layer", where), grid, _thumbnail(doc, where))


@dataclass(frozen=True)
class LensPicks:
    """The vision lens's best and last layer, from a model's summary: the layers whose picks the page shows."""

    best_layer: str
    last_layer: str

    @classmethod
    def read(cls, summary: Any, where: str) -> LensPicks:
        summary = as_dict(summary, where)
        return cls(_text(summary, "best_layer", where), _text(summary, "last_layer", where))


def _number(value: Any, where: str) -> float:
    import math

    need(value, (int, float), where)
    if not math.isfinite(value):
        raise Bad(f"{where} is {value}, not a finite number")
    return float(value)


PAIRS = Records("pairs", ShownPair.read, combined=True)  # what run crossmodal declares
LENS_IMAGES = Records("images", LensImage.read)  # run vision_lens
CLS_MAPS = Records("maps", ClsMap.read)  # run cls_attention
