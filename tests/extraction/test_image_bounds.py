"""Images are untrusted input: an image whose header says it is a decompression bomb, holds a text-chunk bomb or
reaches too many pixels inside the model's image processor (a thin strip a shortest-edge resize scales up) is one
line naming the file before any store is made; one that only decoding shows to be bad (a truncated JPEG) is one
line naming it, and no incomplete store is left. The analyses that read images and report thumbnails alike."""

from __future__ import annotations

import io
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_vision import build_tiny_vision  # noqa: E402

from layerscope.cli import main  # noqa: E402
from layerscope.errors import InputError  # noqa: E402


def _png(width: int = 8, height: int = 8) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def bomb_png(width: int = 30_000, height: int = 30_000) -> bytes:
    """An 8x8 PNG whose header says ``width`` x ``height`` pixels (900 million): a few hundred bytes."""
    raw = _png()
    ihdr = bytearray(raw[16:29])
    ihdr[0:8] = struct.pack(">II", width, height)
    return raw[:8] + _chunk(b"IHDR", bytes(ihdr)) + raw[33:]


def ztxt_bomb_png() -> bytes:
    """A PNG with a compressed text chunk that inflates to 8 MB, before its pixels."""
    raw = _png()
    text = _chunk(b"zTXt", b"comment\x00\x00" + zlib.compress(b"\x00" * (8 << 20), 9))
    return raw[:33] + text + raw[33:]


def strip_png(length: int) -> bytes:
    """A 1 x ``length`` PNG: tiny on disk, scaled up by a shortest-edge resize."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, length), (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


def truncated_jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()[: len(buf.getvalue()) // 2]


@pytest.fixture(scope="module")
def clip_export(tmp_path_factory):
    """A tiny CLIP vision tower whose processor resizes the shortest side to 16 pixels, then crops."""
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("bounds")
    ckpt = build_tiny_vision("clip-vision", root / "ckpt")
    export_model(resolve_source(str(ckpt)), root / "export")
    return root / "export"


def _folder(tmp_path, bad_name: str, bad: bytes) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        (folder / f"good_{i}.png").write_bytes(_png())
    (folder / bad_name).write_bytes(bad)
    return folder


@pytest.mark.parametrize("name,make,says", [
    ("bomb.png", bomb_png, "larger than 89,478,485 pixels (Image size (900000000 pixels) exceeds"),
    ("ztxt.png", ztxt_bomb_png, "is not an image PIL can read whole (ValueError: Decompressed"),
    ("strip.png", lambda: strip_png(40_000), "1x40,000 pixels (aspect ratio 40,000:1) becomes 16x640,000"),
])
def test_an_image_the_header_tells_is_bad_is_one_line_before_the_store(name, make, says, clip_export, tmp_path,
                                                                       capsys, monkeypatch):
    """Catches: a decompression bomb or a zTXt bomb as an internal error; a 1 x 40,000 strip (a few hundred bytes)
    decoded and scaled up to 16 x 640,000 pixels by the processor (at a real model's 224 pixels, a 1 x 20,000 strip
    needs over 13 GB) instead of refused from its header before the store is made."""
    from layerscope.data import images

    monkeypatch.setattr(images, "MAX_PROCESSOR_PIXELS", 2**20, raising=False)  # the strip passes it at 16 pixels
    folder = _folder(tmp_path, name, make())
    with pytest.raises(SystemExit) as exc:
        main(["extract-images", str(clip_export), str(folder), "--out", str(tmp_path / "s"), "--workers", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert str(folder / name) in err[0] and says in err[0], err
    assert not (tmp_path / "s").exists()


def test_a_truncated_jpeg_found_while_decoding_is_one_line_and_leaves_no_store(clip_export, tmp_path, capsys):
    """A JPEG cut in half has a sound header; only decoding it (on a worker process) tells, after a first batch was
    stored. Catches: an OSError traceback from the worker and an incomplete store left at --out (resuming it would
    meet the same image again)."""
    folder = _folder(tmp_path, "zz_cut.jpg", truncated_jpeg())
    with pytest.raises(SystemExit) as exc:
        main(["extract-images", str(clip_export), str(folder), "--out", str(tmp_path / "s"), "--workers", "1",
              "--batch-size", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert str(folder / "zz_cut.jpg") in err[0] and "truncated" in err[0], err
    assert not (tmp_path / "s").exists()
    (folder / "zz_cut.jpg").unlink()  # the same folder without it: a store is made
    main(["extract-images", str(clip_export), str(folder), "--out", str(tmp_path / "s"), "--workers", "0"])
    assert json.loads((tmp_path / "s" / "store.json").read_text())["complete"]


def test_an_analysis_and_a_thumbnail_of_a_bad_image_are_one_line(tmp_path):
    """``run crossmodal`` and ``vision_lens`` read their images with the same checks, and so does a report's
    thumbnail. Catches: a zTXt bomb in --data failing later as an internal error, and a thumbnail decoding a bomb."""
    from layerscope.analyses.crossmodal import read_pairs
    from layerscope.analyses.vision_lens import labelled_images
    from layerscope.data.images import decode, thumbnail_png

    (tmp_path / "img").mkdir()
    rows = []
    for i in range(4):
        (tmp_path / "img" / f"{i}.png").write_bytes(_png() if i else ztxt_bomb_png())
        rows.append(json.dumps({"image": f"img/{i}.png", "caption": f"a photo {i}", "label": f"c{i % 2}"}))
    (tmp_path / "pairs.jsonl").write_text("\n".join(rows) + "\n")
    for read in (lambda: read_pairs(str(tmp_path / "pairs.jsonl"), "image", "caption"),
                 lambda: labelled_images(str(tmp_path / "pairs.jsonl"), 4)):
        with pytest.raises(InputError, match=r"pairs.jsonl line 1: .*img/0.png is not an image PIL can read whole"):
            read()
    for payload in (bomb_png(), bomb_png(10_000, 9_000), truncated_jpeg()):  # past Pillow's bound, past ours, cut
        with pytest.raises(InputError, match="an image given as bytes"):
            thumbnail_png(payload)
        with pytest.raises(InputError, match="an image given as bytes"):
            decode(payload)
