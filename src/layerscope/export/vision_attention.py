"""The attention variant of a vision tower's export: every layer's attention over the image's tokens.

The graph is export/attention.py's (patterns ``attentions.1`` .. ``attentions.L``, ``[B, H, T, T]``, and
their summaries), traced from the tower loaded with eager attention, reading ``pixel_values`` at the
export's image size with a dynamic batch (every image has the same tokens: no mask, no special ids).
It is checked like the text graph: every pattern and summary against transformers' own
``output_attentions`` on the export's validation images, put through the export's image processor.

An fp16 export gets an fp16 attention graph: traced from an fp16 copy of the tower (float32 pixels in, cast
inside), its norms, softmax and reductions put back in fp32 as the export's are (export/half.py), its
probabilities and summaries float32 out, held to the fp32 eager model within :data:`ATOL_FP16`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError
from layerscope.export import attention as att

INPUT = "pixel_values"
# fp16 weights and activations carry ~3 significant digits; a probability is a softmax of fp16 scores, so it
# moves by about its own size times the scores' rounding (1e-3 of scores reaching ~10): 1e-2 of a probability
ATOL_FP16 = 1e-2


def vision_attention_net(manifest):
    """The tower's transformer (the module that returns its attentions), loaded with eager attention."""
    from layerscope.model.families import FAMILIES
    from layerscope.model.source import load_torch_model
    from layerscope.model.vision import _recording_tower, resize_positions

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
            return self.inner(pixel_values=pixel_values, output_attentions=output_attentions,
                              **resize_positions(self.inner, pixel_values))

    return Tower(_recording_tower(model)).eval()


def trace_vision_attention(net, path: Path, manifest, opset: int, *, half: bool = False) -> int:
    """Trace ``net`` (``half``: an fp16 copy of it) into ``path``; returns the count of nodes an fp16 graph
    keeps in fp32."""
    import copy

    import torch

    from layerscope.export.vision_inputs import eager_positions, fixed_size_positions

    image = manifest.image
    traced = copy.deepcopy(net).half() if half else net
    wrapper = att.attention_module(traced, [INPUT], [], decoder=False)
    outs = att.output_names(manifest.num_layers)
    axes = {name: {0: "batch_size"} for name in [INPUT, *outs]}
    dummy = torch.randn(2, image.channels, image.height, image.width, generator=torch.Generator().manual_seed(0))
    positions = eager_positions(net, dummy)  # by the fp32 tower, at the export's size
    try:
        with warnings.catch_warnings(), torch.no_grad(), fixed_size_positions(traced, positions):
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapper, (dummy,), str(path), input_names=[INPUT], output_names=outs, dynamic_axes=axes,
                              opset_version=opset, do_constant_folding=True, dynamo=False)
    except ExportError:
        raise
    except Exception as exc:  # torch.onnx raises many untyped errors
        raise ExportError(f"torch.onnx could not trace the vision attention graph: {str(exc).splitlines()[0][:300]}") from exc
    return _keep_fp32(path) if half else 0


def _keep_fp32(path: Path) -> int:
    """The fp16 graph's sensitive ops back in fp32 and every output float32, as an fp16 export's."""
    import onnx

    from layerscope.export import external
    from layerscope.export.half import FP16_BLOCK_LIST, cast_outputs_fp32, keep_sensitive_ops_fp32

    model = onnx.load(str(path))
    kept = keep_sensitive_ops_fp32(model, FP16_BLOCK_LIST)
    cast_outputs_fp32(model, [o.name for o in model.graph.output])
    external.save_graph(model, path, external=False)
    external.check_graph(path)
    return kept


def vision_attention_parity(net, onnx_path: Path, manifest, export_dir: Path, *, half: bool = False) -> dict[str, Any]:
    """Worst difference per output between the graph (ONNX Runtime, CPU) and transformers' eager attention
    (``net``, fp32) on the validation images (a batch of four, then one alone); ``half``: the graph is fp16,
    held within :data:`ATOL_FP16` instead of the fp32 graph's ``attention.ATOL``."""
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
        s["tolerance"] = (ATOL_FP16 if half else att.ATOL) * max(1.0, s["ref_max_abs"])
    return {"heads": heads, "images": len(pixels), "batches": 2, "outputs": stats}
