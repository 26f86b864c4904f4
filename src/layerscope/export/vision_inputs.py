"""What every graph of a vision tower is traced and checked with: the validation images, and the position
embeddings held at the export's image size while traced (export/vision_export.py, export/vision_attention.py)."""

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


def _resizing_modules(net) -> dict:
    """The modules of ``net`` that resize position embeddings to an image (their class defines
    transformers' ``interpolate_pos_encoding``), by name."""
    return {name: m for name, m in net.named_modules()
            if callable(getattr(type(m), "interpolate_pos_encoding", None))}


def eager_positions(net, pixel_values) -> dict:
    """What each position-resizing module of ``net`` adds to the tokens of ``pixel_values`` (their size is
    what counts), as the eager model computes it in one forward pass: module name -> tensor.  A module the
    pass never asks (CLIP and SigLIP at their own size add their table as it is) is left out."""
    import torch

    found = {}
    modules = _resizing_modules(net)
    for name, m in modules.items():
        def record(embeddings, height, width, name=name, original=m.interpolate_pos_encoding):
            found[name] = out = original(embeddings, height, width)
            return out

        m.interpolate_pos_encoding = record
    try:
        with torch.no_grad():
            net(pixel_values)
    finally:
        for m in modules.values():
            del m.interpolate_pos_encoding
    return {name: t.detach().clone() for name, t in found.items()}


@contextmanager
def fixed_size_positions(net, positions: dict):
    """While inside, each module named in ``positions`` (``eager_positions``, of this net or of the fp32
    tower it was copied from) adds those position embeddings as they are, in its own weights' dtype.
    Traced, transformers would resize them in the graph (DINOv2 on every call, the others at another size
    than the checkpoint's), DINOv2's with an antialiased bicubic resize ONNX cannot express; a graph traced at
    one image size needs only the eager model's result, a constant (the parity check holds the graph to the
    eager model)."""
    modules = dict(net.named_modules())
    patched = []
    for name, value in positions.items():
        m = modules[name]
        dtype = next(m.parameters()).dtype
        m.interpolate_pos_encoding = lambda embeddings, height, width, v=value.to(dtype): v
        patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m.interpolate_pos_encoding
