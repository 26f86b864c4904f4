"""report.html's image thumbnails: the images an image analysis read, small, beside their text (the page sections
``crossmodal pairs``, ``vision lens images`` and ``cls maps`` that the image analyses declare, drawn from their
typed records, report/image_records.py).

Results carry each shown image as a base64 PNG of a downscaled copy (data/images.py ``thumbnail_png``).
Nothing of it reaches the page as it was read: the bytes are decoded, opened as a PNG, shrunk again to
at most ``MAX_PIXELS`` a side and re-encoded here, so the page holds only a data URI of an image made
here (base64 characters, no quote or markup can pass), and every caption is escaped.  A thumbnail that
is not a PNG is left out with a note.  Never a path: the page loads nothing from the disk.
"""

from __future__ import annotations

import html
from typing import Any, Callable, Sequence

MAX_PIXELS = 64
MAX_SHOWN = 48

CSS = """
.thumbs { display: flex; flex-wrap: wrap; gap: 8px; margin: 8px 0; }
.thumbs figure { margin: 0; width: 96px; text-align: center; font-size: 11px; color: #333; }
.thumbs img { width: 64px; height: 64px; object-fit: contain; image-rendering: pixelated; border: 1px solid #ddd;
              background: #fafafa; }
.thumbs figcaption { word-break: break-word; white-space: pre-wrap; }
.thumbs .miss { color: #a33; }
"""


def png_data_uri(b64: Any) -> str | None:
    """A ``data:image/png`` URI of the PNG ``b64`` holds, re-encoded here at most ``MAX_PIXELS`` a side;
    None when it is not a readable PNG."""
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    if not isinstance(b64, str) or len(b64) > 400_000:
        return None
    try:
        raw = base64.b64decode(b64, validate=True)
        with Image.open(io.BytesIO(raw), formats=["PNG"]) as im:
            im.load()
            clean = im.convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError, Image.DecompressionBombError):
        return None
    clean.thumbnail((MAX_PIXELS, MAX_PIXELS))
    buf = io.BytesIO()
    clean.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def thumbnail_strip(items: Sequence[Any], lines: Callable[[Any], list[str]]) -> str:
    """HTML of the thumbnails of typed ``items`` (each with ``id`` and ``thumbnail``; those without a thumbnail
    are left out), each captioned by ``lines(item)`` (text, escaped here); at most ``MAX_SHOWN``."""
    with_picture = [item for item in items if item.thumbnail is not None]
    parts = []
    for item in with_picture[:MAX_SHOWN]:
        caption = "<br>".join(html.escape(str(line)) for line in lines(item))
        uri = png_data_uri(item.thumbnail)
        picture = (f"<img src='{uri}' alt='{html.escape(item.id, quote=True)}'>" if uri else
                   "<div class='miss'>(not a PNG: left out)</div>")
        parts.append(f"<figure>{picture}<figcaption>{caption}</figcaption></figure>")
    if not parts:
        return ""
    more = len(with_picture) - len(parts)
    tail = f"<p class='note'>{more:,} more not shown.</p>" if more > 0 else ""
    return f"<div class='thumbs'>{''.join(parts)}</div>{tail}"


def _section(anchor: str, title: str, parts: list[str]):
    from layerscope.report.html_figures import Section

    return Section(anchor, title, html="".join(parts), css=CSS) if parts else None


def crossmodal_section(results):
    """The image-caption pairs a crossmodal run shows (its first ones), each with its caption (None: none kept)."""
    from layerscope.report.image_records import PAIRS

    pairs = results.combined.records(PAIRS)
    strip = thumbnail_strip(pairs, lambda p: [p.caption])
    shown = min(len([p for p in pairs if p.thumbnail is not None]), MAX_SHOWN)
    return _section("pairs", "Image-caption pairs", [f"<h3>Pairs (the first {shown})</h3>{strip}"] if strip else [])


def vision_lens_section(results):
    """Each model's shown images with their label and the class its best and its last layer pick."""
    from layerscope.report.image_records import LENS_IMAGES, LensPicks
    from layerscope.report.results import read_record

    parts = []
    for model, fig in results.per_model.items():
        picks = read_record(LensPicks.read, fig.summary, f"per_model.{model}.summary")

        def lines(item, best=picks.best_layer, last=picks.last_layer):
            return [f"label: {item.label}", f"layer {best}: {item.predicted.get(best, '')}",
                    f"layer {last}: {item.predicted.get(last, '')}"]

        strip = thumbnail_strip(fig.records(LENS_IMAGES), lines)
        if strip:
            parts.append(f"<h3>{html.escape(model)}: images and what the best and the last layer pick</h3>{strip}")
    return _section("images", "Images", parts)


def cls_maps_section(results):
    """Each model's shown images with the last layer's CLS attention drawn over them in red."""
    from layerscope.report.image_records import CLS_MAPS

    parts = []
    for model, fig in results.per_model.items():
        strip = thumbnail_strip(fig.records(CLS_MAPS), lambda m: [f"label: {m.label}", f"layer {m.layer}"])
        if strip:
            parts.append(f"<h3>{html.escape(model)}: where the CLS token looks (red: more attention, from none at "
                         f"each map's minimum to the most at its maximum)</h3>{strip}")
    return _section("maps", "CLS attention maps", parts)
