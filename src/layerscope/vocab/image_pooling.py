"""Pooling a vision tower's tokens: ``cls`` and ``mean`` over the patches, in numpy, torch and ONNX.

A vision tower's sequence is ``prefix`` tokens (CLS, then DINOv2's register tokens; none in SigLIP)
followed by the patch grid, and every image has the same number of tokens (no padding, no mask):

* ``cls``: token 0, the CLS token (a tower without one, SigLIP, has no ``cls``);
* ``mean``: the mean over the patch tokens alone: CLS and register tokens are left out.

``pool_image`` (numpy, float64 sums, float32 out) is the reference; ``pool_image_torch`` the same in torch;
``OnnxImagePooling`` appends the nodes of each to an exported graph (``pooled.<mode>`` outputs).
``tests/export/test_vision_export.py`` holds the three equal.
"""

from __future__ import annotations

from layerscope.errors import InputError

IMAGE_POOLINGS = ("cls", "mean")


def image_poolings(prefix: int) -> tuple[str, ...]:
    """The poolings a tower with ``prefix`` tokens before its patches has (no CLS token: ``mean`` only)."""
    return IMAGE_POOLINGS if prefix >= 1 else ("mean",)


def check_image_poolings(poolings, prefix: int, family: str) -> list[str]:
    """``poolings`` without repeats, or one line naming the one this tower does not have."""
    have = image_poolings(prefix)
    out: list[str] = []
    for p in poolings:
        p = p.strip()
        if p not in have:
            why = " (it has no CLS token)" if p == "cls" else ""
            raise InputError(f"pooling '{p}' is not one of an image tower's; {family}{why} has: {', '.join(have)}")
        if p not in out:
            out.append(p)
    if not out:
        raise InputError("no pooling given; choose from " + ", ".join(have))
    return out


def pool_image(states, mode: str, prefix: int):
    """numpy: pool ``[..., batch, tokens, hidden]`` into ``[..., batch, hidden]`` (float32)."""
    import numpy as np

    states = np.asarray(states)
    if mode == "cls":
        return states[..., 0, :].astype(np.float32)
    if mode == "mean":
        return states[..., prefix:, :].astype(np.float64).mean(axis=-2).astype(np.float32)
    raise InputError(f"image pooling '{mode}' has no rendering; choose from {', '.join(IMAGE_POOLINGS)}")


def pool_image_torch(states, mode: str, prefix: int):
    """torch: the same as :func:`pool_image`, differentiable in ``states``."""
    if mode == "cls":
        return states[..., 0, :]
    if mode == "mean":
        return states[..., prefix:, :].mean(dim=-2)
    raise InputError(f"image pooling '{mode}' has no rendering; choose from {', '.join(IMAGE_POOLINGS)}")


class OnnxImagePooling:
    """The in-graph rendering over ``stacked`` (``[layers, batch, tokens, hidden]``): ``render(mode)``
    appends the nodes of one pooling (``builder``: vocab/pooling.py's ``OnnxBuilder``) and returns its
    ``[layers, batch, hidden]`` tensor."""

    def __init__(self, builder, stacked: str, *, prefix: int, opset: int):
        self.b, self.stacked, self.prefix, self.opset = builder, stacked, int(prefix), opset

    def render(self, mode: str) -> str:
        b = self.b
        if mode == "cls":
            return b.node("Gather", [self.stacked, b.const(0, "cls_index")], "cls_out", axis=2)
        if mode == "mean":
            patches = b.node("Slice", [self.stacked, b.const([self.prefix], "patch_start"),
                                       b.const([2**62], "patch_end"), b.const([2], "token_axis")], "patches")
            if self.opset >= 18:
                return b.node("ReduceMean", [patches, b.const([2], "mean_axes")], "mean_out", keepdims=0)
            return b.node("ReduceMean", [patches], "mean_out", axes=[2], keepdims=0)
        raise InputError(f"image pooling '{mode}' has no rendering; choose from {', '.join(IMAGE_POOLINGS)}")
