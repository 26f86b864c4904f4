"""The attention variant of a vision tower's export: every layer's attention over the image's tokens.

The graph is export/attention.py's (patterns ``attentions.1`` .. ``attentions.L``, ``[B, H, T, T]``, and
their summaries), traced from the tower loaded with eager attention, reading ``pixel_values`` at the
export's image size with a dynamic batch (every image has the same tokens: no mask, no special ids).
It is checked like the text graph: every pattern and summary against transformers' own
``output_attentions`` on the export's validation images, put through the export's image processor.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError
from layerscope.export import attention as att

INPUT = "pixel_values"


def vision_attention_net(manifest):
    """The tower's transformer (the module that returns its attentions), loaded with eager attention."""
    from layerscope.model.families import FAMILIES
    from layerscope.model.source import load_torch_model
    from layerscope.model.vision import _recording_tower

    import torch

    model = load_torch_model(manifest.source.model_source(), FAMILIES[manifest.family], attn_implementation="eager")
    for module in model.modules():  # a two-tower checkpoint loaded as eager may keep its towers' own setting
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            config._attn_implementation = "eager"

    class Tower(torch.nn.Module):  # one call for every tower (CLIP's transformer takes no return_dict)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values, output_attentions=True, return_dict=True):
            return self.inner(pixel_values=pixel_values, output_attentions=output_attentions)

    return Tower(_recording_tower(model)).eval()


def trace_vision_attention(net, path: Path, manifest, opset: int) -> None:
    import torch

    from layerscope.export.vision_inputs import fixed_size_positions

    image = manifest.image
    wrapper = att.attention_module(net, [INPUT], [], decoder=False)
    outs = att.output_names(manifest.num_layers)
    axes = {name: {0: "batch_size"} for name in [INPUT, *outs]}
    dummy = torch.randn(2, image.channels, image.height, image.width, generator=torch.Generator().manual_seed(0))
    try:
        with warnings.catch_warnings(), torch.no_grad(), fixed_size_positions(net):
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapper, (dummy,), str(path), input_names=[INPUT], output_names=outs, dynamic_axes=axes,
                              opset_version=opset, do_constant_folding=True, dynamo=False)
    except ExportError:
        raise
    except Exception as exc:  # torch.onnx raises many untyped errors
        raise ExportError(f"torch.onnx could not trace the vision attention graph: {str(exc).splitlines()[0][:300]}") from exc


def vision_attention_parity(net, onnx_path: Path, manifest, export_dir: Path) -> dict[str, Any]:
    """Worst difference per output between the graph (ONNX Runtime, CPU) and transformers' eager attention on
    the validation images (a batch of four, then one alone)."""
    import torch

    from layerscope.engines.ort import make_session
    from layerscope.export.vision_inputs import validation_images
    from layerscope.model.vision import load_image_processor, pixel_values

    image = manifest.image
    pixels = pixel_values(load_image_processor(export_dir), validation_images(image.height, image.width))
    session = make_session(onnx_path, "CPUExecutionProvider")
    names = [o.name for o in session.get_outputs()]
    stats: dict[str, dict[str, float]] = {}
    heads = 0
    for batch in (pixels, pixels[2:3]):
        got = dict(zip(names, session.run(names, {INPUT: batch})))
        with torch.no_grad():
            probs = [a.float() for a in net(pixel_values=torch.from_numpy(batch), output_attentions=True,
                                            return_dict=True).attentions]
            ref_stats = att.summaries(torch.stack(probs, 1), None, None, torch.tensor([-1]))
        heads = int(probs[0].shape[1])
        ref = {att.pattern_output(i + 1): p.numpy() for i, p in enumerate(probs)}
        ref.update({att.summary_output(s): v.numpy() for s, v in zip(att.SUMMARIES, ref_stats)})
        for name, want in ref.items():
            both = np.isnan(want) & np.isnan(got[name])
            diff = np.where(both, 0.0, np.abs(want.astype(np.float64) - got[name]))
            prev = stats.get(name, {"max_abs": 0.0, "ref_max_abs": 0.0})
            stats[name] = {"max_abs": max(prev["max_abs"], float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0))),
                           "min_cos": None,
                           "ref_max_abs": max(prev["ref_max_abs"], float(np.nanmax(np.abs(want), initial=0.0)))}
    for s in stats.values():
        s["tolerance"] = att.ATOL * max(1.0, s["ref_max_abs"])
    return {"heads": heads, "images": len(pixels), "batches": 2, "outputs": stats}
