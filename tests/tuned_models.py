"""Tiny random models whose output distribution is peaked, for the tuned lens tests.

A tiny random checkpoint decodes every layer to nearly the uniform distribution (its head's weights are ~0.02),
so KL to the final layer is ~1e-4 nats everywhere and a translator has nothing to learn. ``sharpened`` scales the
final norm's weight (decoders) or the masked-LM head's norm (encoders) by ``SCALE``, which multiplies every logit,
and the blocks' output projections by ``BLOCKS``, so the layers differ: the final distribution is peaked and the
earlier layers' decoded ones are far from it.
"""

from __future__ import annotations

import contextlib
import shutil
import types
from pathlib import Path

SCALE = 25.0
BLOCKS = 6.0
_NORMS = ("transformer.ln_f.weight", "model.norm.weight", "cls.predictions.transform.LayerNorm.weight")
_OUTPUTS = ("mlp.c_proj.weight", "mlp.down_proj.weight", "output.dense.weight")


def sharpened(src: Path, out: Path, kind: str) -> Path:
    """A copy of the checkpoint at ``src`` (``kind``: "decoder" or "encoder") with a peaked output, in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    loader = AutoModelForCausalLM if kind == "decoder" else AutoModelForMaskedLM
    net = loader.from_pretrained(str(src))
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name in _NORMS:
                p.mul_(SCALE)
            elif name.endswith(_OUTPUTS) and "attention" not in name:
                p.mul_(BLOCKS)
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")):
            shutil.copy2(f, out / f.name)
    net.save_pretrained(str(out), safe_serialization=True)
    return out


@contextlib.contextmanager
def tuned_lens_scripts():
    """tuned-lens 0.2's scripts (its ``Optimizer`` recipe, its ``Eval`` step) import torchdata's ``dataloader2``,
    which torchdata 0.11 no longer ships; what the tests call of them never touches it, so an empty stand-in lets
    them import while this context is open."""
    import torchdata

    stub = types.ModuleType("torchdata.dataloader2")
    stub.DataLoader2 = object
    had = {name: getattr(torchdata, name, None) for name in ("dataloader2", "datapipes")}
    torchdata.dataloader2, torchdata.datapipes = stub, types.ModuleType("torchdata.datapipes")
    try:
        yield
    finally:
        for name, value in had.items():
            if value is None:
                delattr(torchdata, name)
            else:
                setattr(torchdata, name, value)
