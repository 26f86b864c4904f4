"""report.html's image thumbnails: only a PNG re-encoded here reaches the page, small, its caption escaped."""

from __future__ import annotations

import base64
import io

import numpy as np


def _png(array: np.ndarray, fmt: str = "PNG") -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _decoded(uri: str) -> np.ndarray:
    from PIL import Image

    assert uri.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))))


def test_only_a_png_is_drawn_and_never_bigger_than_a_thumbnail():
    """Catches: a results file's string put into src as it was (a quote or a javascript: URI would run), a
    GIF or HTML passed as an image, a large image embedded at full size."""
    from layerscope.report.image_html import MAX_PIXELS, png_data_uri

    small = np.random.default_rng(0).integers(0, 256, (20, 30, 3)).astype(np.uint8)
    np.testing.assert_array_equal(_decoded(png_data_uri(_png(small))), small)  # lossless at its own size
    big = np.zeros((300, 500, 3), np.uint8)
    assert max(_decoded(png_data_uri(_png(big))).shape[:2]) == MAX_PIXELS
    for bad in ("x' onerror='alert(1)", "javascript:alert(1)", base64.b64encode(b"<svg onload=alert(1)>").decode(),
                _png(small, "GIF"), None, 12):
        assert png_data_uri(bad) is None, bad


def test_captions_and_ids_are_escaped():
    """Catches: a caption or id from the data written into the page as markup, a thumbnail that is not a PNG
    put into src."""
    from layerscope.report.image_html import crossmodal_section
    from layerscope.report.results import as_results

    pairs = [{"id": "a'><script>x()</script>", "caption": "<b>bold</b> & \"quoted\"",
              "thumbnail": _png(np.zeros((8, 8, 3), np.uint8))},
             {"id": "b", "caption": "fake", "thumbnail": "' onerror='alert(1)"}]
    page = crossmodal_section(as_results({"analysis": "crossmodal", "combined": {"pairs": pairs}})).html
    assert "<script>" not in page and "<b>bold" not in page and "onerror" not in page
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;" in page
    assert page.count("<img ") == 1 and "not a PNG: left out" in page
