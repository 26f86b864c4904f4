"""Exporting a vision tower (ViT, DINOv2, CLIP's and SigLIP's, alone or from a two-tower checkpoint).

The tower (model/vision.py) is traced with plain ``torch.onnx.export`` at one image size (the checkpoint's,
or ``--image-size``: position embeddings resized as transformers resizes them) with a dynamic batch: every
hidden state is an output (``hidden_states.0`` .. ``hidden_states.L``, as for text models), the joint
image-text embedding too (``image_embeds``: CLIP's projection, SigLIP's head), and the in-graph
``pooled.cls`` / ``pooled.mean`` stack every layer and pool it over the patches (CLS and register tokens
left out of ``mean``; vocab/image_pooling.py).  Every output is then held to PyTorch on a few
synthetic images put through the checkpoint's own image processor (set to that size), saved into the export.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError, InputError
from layerscope.progress import still
from layerscope.model.manifest import MANIFEST, ONNX_FILE
from layerscope.model.manifest_type import Manifest
from layerscope.export.vision_inputs import eager_positions, fixed_size_positions, validation_images
from layerscope.vocab.outputs import hidden_output, hidden_outputs, pooled_output

JOINT_OUTPUT = "image_embeds"


def _trace(tower, path: Path, *, num_layers: int, joint: bool, height: int, width: int, channels: int,
           opset: int, half: bool = False) -> None:
    """Trace ``tower``; ``half``: a copy of it in fp16, the graph still reading float32 pixels (cast inside)."""
    import copy

    import torch

    net = copy.deepcopy(tower).half() if half else tower

    class Outputs(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, pixel_values):
            hidden, embeds = self.net(pixel_values.half() if half else pixel_values)
            return (*hidden, embeds) if joint else tuple(hidden)

    names = hidden_outputs(num_layers) + ([JOINT_OUTPUT] if joint else [])
    axes = {"pixel_values": {0: "batch_size"}, **{n: {0: "batch_size"} for n in names}}
    dummy = torch.randn(2, channels, height, width, generator=torch.Generator().manual_seed(0))
    positions = eager_positions(tower, dummy)  # by the fp32 tower, at the traced size
    try:
        with warnings.catch_warnings(), torch.no_grad(), fixed_size_positions(net, positions):
            warnings.simplefilter("ignore")
            torch.onnx.export(Outputs(net).eval(), (dummy,), str(path), input_names=["pixel_values"],
                              output_names=names, dynamic_axes=axes, opset_version=opset,
                              do_constant_folding=True, dynamo=False)
    except Exception as exc:  # torch.onnx raises many untyped errors
        raise ExportError(f"torch.onnx could not export this vision tower: {str(exc).splitlines()[0][:300]}") from exc


def _add_pooling(path: Path, num_layers: int, hidden: int, tokens: int, prefix: int,
                 modes: list[str], half: bool = False) -> dict[str, Any]:
    import onnx
    from onnx import helper

    from layerscope.export import external
    from layerscope.export.graph import opset_of
    from layerscope.vocab.image_pooling import OnnxImagePooling
    from layerscope.vocab.pooling import OnnxBuilder

    model = onnx.load(str(path))
    graph = model.graph
    kept_fp32 = 0
    if half:  # norms, softmax and reductions computed in fp32; every output float32, as an fp32 export's
        from layerscope.export.half import FP16_BLOCK_LIST, cast_outputs_fp32, keep_sensitive_ops_fp32

        kept_fp32 = keep_sensitive_ops_fp32(model, FP16_BLOCK_LIST)
        cast_outputs_fp32(model, [o.name for o in graph.output])
    layers = hidden_outputs(num_layers)
    for out in graph.output:  # the tracer names the fixed token and hidden dims after nodes: say what they are
        if out.name in layers:
            dims = out.type.tensor_type.shape.dim
            dims[0].dim_param = "batch_size"
            dims[1].dim_value, dims[2].dim_value = tokens, hidden
        elif out.name == JOINT_OUTPUT:
            out.type.tensor_type.shape.dim[0].dim_param = "batch_size"
    b = OnnxBuilder(graph, "layerscope/pool")
    axes0 = b.const([0], "axes0")
    # [L, B, T, H], built as the text exports' (model/manifest_check.py reads the pooled layers off this Concat)
    stacked = b.node("Concat", [b.node("Unsqueeze", [t, axes0]) for t in layers], "stack", axis=0)
    rendering = OnnxImagePooling(b, stacked, prefix=prefix, opset=opset_of(model))
    for mode in modes:
        name = pooled_output(mode)
        graph.node.append(helper.make_node("Identity", [rendering.render(mode)], [name], name=f"layerscope/{name}"))
        graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                          [len(layers), "batch_size", hidden]))
    external.save_graph(model, path, external=False)
    external.check_graph(path)
    outputs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}
    return {"outputs": outputs, "pooled_layers": [str(i) for i in range(num_layers + 1)],
            "external_data": False, "inputs": [i.name for i in graph.input], "fp16_nodes_kept_fp32": kept_fp32}


def compare_vision(tower, onnx_path: Path, processor, image: dict[str, Any], modes: list[str]) -> dict[str, Any]:
    """ONNX Runtime against the torch tower on the validation images (a batch of four, one alone): per
    output the largest |difference|, the smallest cosine and the reference's scale."""
    import torch

    from layerscope.engines.ort import make_session
    from layerscope.export.validate import _max_abs_and_min_cos
    from layerscope.model.vision import check_image_size, pixel_values
    from layerscope.vocab.image_pooling import pool_image

    pixels = pixel_values(processor, validation_images(image["height"], image["width"]))
    check_image_size(pixels, (image["height"], image["width"]), "the export's validation images")
    session = make_session(onnx_path, "CPUExecutionProvider")
    names = [o.name for o in session.get_outputs()]
    stats: dict[str, dict[str, float]] = {}
    for batch in (pixels, pixels[2:3]):
        got = dict(zip(names, session.run(names, {"pixel_values": batch})))
        with torch.inference_mode():
            hidden, embeds = tower(torch.from_numpy(batch))
        ref = {hidden_output(i): h.float().numpy() for i, h in enumerate(hidden)}
        if embeds is not None:
            ref[JOINT_OUTPUT] = embeds.float().numpy()
        stacked = np.stack([ref[hidden_output(i)] for i in range(len(hidden))])
        for mode in modes:
            ref[pooled_output(mode)] = pool_image(stacked, mode, image["prefix_tokens"])
        for name in names:
            max_abs, min_cos = _max_abs_and_min_cos(ref[name], got[name], None)
            prev = stats.get(name, {"max_abs": 0.0, "min_cos": 1.0, "ref_max_abs": 0.0})
            stats[name] = {"max_abs": max(prev["max_abs"], max_abs) if not np.isnan(max_abs) else float("nan"),
                           "min_cos": min(prev["min_cos"], min_cos),
                           "ref_max_abs": max(prev["ref_max_abs"], float(np.abs(ref[name]).max(initial=0.0)))}
    return {"images": len(pixels), "batches": 2, "image_size": [image["height"], image["width"]], "outputs": stats}


def _check_half(spec: str, manifest: dict[str, Any], parity: dict[str, Any], num_layers: int,
                onnx_info: dict[str, Any]) -> None:
    """An fp16 export's parity: each output's cosine against the fp32 tower, at least its depth's budget
    (export/half.py); the absolute differences are recorded, not limits."""
    from layerscope.export.half import fp16_failures, fp16_tolerance

    tolerance = fp16_tolerance(list(parity["outputs"]), num_layers)
    manifest.update(precision="fp16", fp16_nodes_kept_fp32=onnx_info["fp16_nodes_kept_fp32"])
    manifest["parity"].update(tolerance_abs=None, tolerance_fp16=tolerance)
    bad = fp16_failures(parity["outputs"], tolerance)
    if bad:
        raise ExportError(f"fp16 export of {spec} drifts from PyTorch fp32: {bad[0]}; nothing was written. "
                          "Export it in fp32")


def tower_anatomy(tower, family, num_layers: int, image: dict[str, Any]):
    """The anatomy of a ``VisionTower`` (model/vision.py) at the export's image size, its head the way into the
    joint space; checked by forward passes (model/anatomy.py)."""
    import torch

    from layerscope.model.anatomy import resolve_anatomy, vision_head

    gen = torch.Generator().manual_seed(0)
    pixels = {"pixel_values": torch.rand(1, int(image["channels"]), int(image["height"]), int(image["width"]),
                                         generator=gen)}
    from layerscope.model.vision import resize_positions

    inner = dict(pixels, **resize_positions(tower.tower, pixels["pixel_values"]))
    return vision_head(tower, resolve_anatomy(tower.tower, family, num_layers, inputs=inner), pixels)


def export_vision(source, output: Path, info: dict[str, Any], *, pooled: list[str] | None, opset: int,
                  atol: float, rtol: float, trust_remote_code: bool, force: bool, progress=None,
                  cache_entry: dict[str, Any] | None = None, dtype: str = "fp32", config=None,
                  family=None) -> Manifest:
    """Export the vision tower ``info`` describes (model/vision.py ``describe_vision``) into ``output``
    (``config`` and ``family``: as export_model read and derived them);
    ``dtype="fp16"`` traces an fp16 copy of the tower and holds every output to a depth-scaled cosine
    against the fp32 tower (export/half.py), the figures recorded in the manifest's parity."""
    from layerscope.atomic import staged_dir
    from layerscope.export.manifest_write import build_manifest, fp32_worst, opset_of_file
    from layerscope.model.families import FAMILIES
    from layerscope.model.manifest_check import file_records
    from layerscope.model.source import load_config
    from layerscope.model.vision import (check_image_size, load_image_processor, load_vision_tower, pixel_values,
                                         processor_at_size, serves_other_sizes)
    from layerscope.ownership import claim
    from layerscope.vocab.image_pooling import check_image_poolings, image_poolings

    if dtype not in ("fp32", "fp16"):
        raise ExportError(f"vision towers are exported in fp32 or fp16, not {dtype}")
    half = dtype == "fp16"
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    family = family if family is not None else FAMILIES[info["family"]]
    image = info["image"]
    modes = check_image_poolings(pooled if pooled is not None else image_poolings(image["prefix_tokens"]),
                                 image["prefix_tokens"], family.name)
    spec = source.spec
    processor = load_image_processor(source.path_or_id, trust_remote_code=trust_remote_code) if source.is_local \
        else load_image_processor(spec, trust_remote_code=trust_remote_code)
    resized = tuple(image["checkpoint_size"]) != (image["height"], image["width"])
    if resized:  # the export's processor gives the export's size (checked on one image before any tracing)
        processor = processor_at_size(processor, image["height"], image["width"], spec)
        check_image_size(pixel_values(processor, validation_images(image["height"], image["width"])[:1]),
                         (image["height"], image["width"]), f"{spec} at --image-size")
    model = Manifest.from_dict(info, where=f"the description of {spec}")
    claim(output, "export", force=force, inputs=[spec])
    with staged_dir(output, kind="export") as work:
        at = f", position embeddings resized from {image['checkpoint_size'][0]}x{image['checkpoint_size'][1]}" \
            if resized else ""
        say(f"loading {model.source.path_or_id} ({family.name}, {model.num_layers} layers, "
            f"{image['height']}x{image['width']} pixels{at})")
        with still(say, "loading the tower"):
            tower = load_vision_tower(source, family, trust_remote_code=trust_remote_code, config=config)
        if resized and not serves_other_sizes(tower):
            raise InputError(f"{spec}: its {family.name} tower cannot resize its position embeddings to "
                             f"{image['height']}x{image['width']} pixels; leave out --image-size")
        joint = tower.joint is not None
        say("exporting with torch.onnx: every hidden state" + (", the joint embedding" if joint else ""))
        with still(say, "exporting with torch.onnx"):
            _trace(tower, work / ONNX_FILE, num_layers=model.num_layers, joint=joint, height=image["height"],
                   width=image["width"], channels=image["channels"], opset=opset, half=half)
        say("adding in-graph pooling over the patches")
        with still(say, "adding in-graph pooling"):
            onnx_info = _add_pooling(work / ONNX_FILE, model.num_layers, model.hidden_size, image["tokens"],
                                     image["prefix_tokens"], modes, half=half)
        processor.save_pretrained(str(work))
        (config if config is not None else load_config(source, trust_remote_code=trust_remote_code)).save_pretrained(
            str(work))
        say("checking every output against PyTorch (fp32)")
        with still(say, "checking every output against PyTorch"):
            parity = compare_vision(tower, work / ONNX_FILE, processor, image, modes)
        worst_name, worst = fp32_worst(parity, atol, rtol)
        manifest = build_manifest(model, onnx_info, modes, parity, opset_of_file(work / ONNX_FILE), atol,
                                  time.perf_counter() - t0, work)
        if half:  # held to cosines by depth, not to fp32's absolute tolerance
            _check_half(spec, manifest, parity, model.num_layers, onnx_info)
        anatomy = tower_anatomy(tower, family, model.num_layers, image)
        manifest.update(export_path="torch", pooled_output=JOINT_OUTPUT if joint else None,
                        joint_output=JOINT_OUTPUT if joint else None, tokenizer=None, anatomy=anatomy.to_dict(),
                        final_norm_in_last_layer=anatomy.final_norm_in_hidden_states,
                        last_layer_note=anatomy.last_layer_note())
        if cache_entry is not None:  # the export cache's key (export/cache.py), checked before reuse
            manifest.update(export_cache=cache_entry)
        if not half and not worst["max_abs"] <= worst["tolerance"]:  # also catches NaN
            raise ExportError(
                f"export of {spec} does not match PyTorch: worst output {worst_name} differs by "
                f"{worst['max_abs']:.3g} (tolerance {worst['tolerance']:.3g}; min cosine {worst['min_cos']:.6f}); "
                "nothing was written. Try --opset 17, or report the model")
        manifest.update(files=file_records(work))
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return Manifest.from_dict(manifest, where=str(output / MANIFEST))
