"""What every graph of a vision tower is traced and checked with: the validation images, and DINOv2's position
embeddings held at the checkpoint's own size while traced (export/vision_export.py, export/vision_attention.py)."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np


def validation_images(height: int, width: int) -> list:
    """Four deterministic RGB images (gradient, checkerboard, noise, flat grey) at twice the model's size,
    so the processor resizes them as it would a photo."""
    from PIL import Image

    h, w = 2 * height, 2 * width
    yy, xx = np.mgrid[0:h, 0:w]
    gradient = np.stack([xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) * 127 // max(h + w - 2, 1)], -1)
    checker = ((yy // 4 + xx // 4) % 2 * 255)[..., None].repeat(3, -1)
    noise = np.random.default_rng(0).integers(0, 256, (h, w, 3))
    grey = np.full((h, w, 3), 128)
    return [Image.fromarray(a.astype(np.uint8), "RGB") for a in (gradient, checker, noise, grey)]


@contextmanager
def fixed_size_positions(tower):
    """DINOv2 resizes its position embeddings to the image on every call, and always while traced (a bicubic
    resize ONNX cannot express); at the checkpoint's own size that resize gives the embeddings back as they
    are, which is what the eager model adds.  While inside, the traced graph adds them as they are (the
    parity check holds the graph to the eager model)."""
    import torch

    patched = [m for m in tower.modules() if hasattr(m, "interpolate_pos_encoding")
               and isinstance(getattr(m, "position_embeddings", None), torch.nn.Parameter)]
    for m in patched:
        m.interpolate_pos_encoding = lambda embeddings, height, width, m=m: m.position_embeddings
    try:
        yield
    finally:
        for m in patched:
            del m.interpolate_pos_encoding
