"""The ``gqa`` variant: each attention block of a rotary decoder (Qwen2, Qwen2.5, Qwen3, Llama, Mistral, OLMo-2,
Granite) as one ONNX Runtime ``GroupQueryAttention`` node.

The exported graph computes attention the way the checkpoint's eager code does: rotary embedding on
q and k, ``repeat_kv`` copying each key/value head to every query head of its group (``Expand``: 7x for
Qwen2.5-0.5B's 14/2 heads), a masked softmax over the full score matrix, and the value product. Neither
ONNX Runtime's session optimizer nor its transformer optimizer fuses that pattern (see
``benchmarks/models/README.md``), so this transform rewrites it directly: for every layer the
projections' outputs (q, k, v after their biases) go into one ``com.microsoft.GroupQueryAttention``
node with the rotary embedding fused (``do_rotary``, cos/sin tables computed by the checkpoint's own
rotary module), grouped key/value heads read in place, and the causal and padding masks applied by the kernel; its output
replaces the input of the output projection, and the nodes that computed attention before are dropped.
Qwen3's per-head q/k RMS norms stay graph nodes: the kernel's own norm prologue (``q_norm_weight``) runs on
CUDA and WebGPU only (onnxruntime 1.32 refuses it on the CPU); OLMo-2's q/k RMS norms, over all heads at
once, stay graph nodes the same way. Mistral's sliding window is the kernel's ``local_window_size`` (the query
and the keys before it, as transformers counts them; a window one less drifts at once), Granite's ``attention_multiplier`` its ``scale``.
Every hidden-state and pooled output is kept, and the variant is held to fp32 parity like any other.
What the node needs of the model (heads, key/value heads, head size, the q/k norms' flavour, the scale, the
window, the blocks' and the attention's paths and the rotary module) is the export's anatomy
(``manifest.anatomy``, model/anatomy.py), never a table of families: any rotary decoder whose blocks keep
``q_proj``/``k_proj``/``v_proj``/``o_proj`` is fused.

The kernel reads positions as 0..n-1 within each row and the valid length of each row from the
attention mask (``seqlens_k``), i.e. right-padded batches; layerscope's tokenizers always pad on the
right, and this file records that assumption.

Anchors are the module scopes torch.onnx writes into node names (``/layers.N/self_attn/q_proj/...``, from the
anatomy's blocks and attention paths),
not the shape of the eager attention subgraph, so a change in how transformers writes attention does not
silently mis-fuse: a layer whose anchors are missing is an error and nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError, InputError
from layerscope.model.manifest_type import Manifest


def check_gqa(export_dir: Path, manifest: Manifest):
    """``(config, AttentionAnatomy)`` for the fused node, from the export's anatomy (model/anatomy.py); one line
    (InputError) where the kernel cannot run it."""
    anatomy = manifest.anatomy
    att = anatomy.attention if anatomy is not None else None
    positions = att.positions if att is not None else "unknown"
    if manifest.kind != "decoder" or att is None or att.positions != "rotary" or att.rotary is None \
            or anatomy.blocks is None:
        raise InputError(f"variant 'gqa' fuses the attention of rotary decoders (a rotary module, each block's "
                         f"q, k, v and o projections); this export is an {manifest.kind} with {positions} "
                         "positions: use 'opt' for its fusions")
    if att.layer_windows is not None:
        raise InputError("variant 'gqa': this checkpoint uses sliding-window attention in some layers; the fused "
                         "graph would need a window per layer, which is not written yet: use the fp32 export")
    if att.head_dim % 16:
        raise InputError(f"variant 'gqa': this model's attention heads are {att.head_dim} wide; ONNX Runtime's "
                         "GroupQueryAttention kernel takes a multiple of 16: use the fp32 export")
    config = _config(Path(export_dir))
    _rotary_kind(config)
    return config, att


def _rotary_kind(config) -> None:
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if kind in ("dynamic", "longrope"):
        raise InputError(f"variant 'gqa': '{kind}' rotary scaling changes its tables with the sequence length; "
                         "the fused kernel takes one table: use the fp32 export")


def _config(export_dir: Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(export_dir))
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {export_dir / 'config.json'} for the attention shape: {exc}") from None


def rotary_tables(config, manifest: Manifest, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[rows, head_dim / 2]`` as the checkpoint's own rotary module (the anatomy's ``rotary``)
    computes them (float32, its attention scaling included), for a config ``check_gqa`` accepted."""
    import torch

    from layerscope.model.anatomy import meta_base
    from layerscope.model.families import family_of

    att = manifest.anatomy.attention
    with torch.device("meta"):
        base, _ = meta_base(config, family_of(manifest))
    meta = base.get_submodule(att.rotary)
    rotary = type(meta)(config=getattr(meta, "config", config))  # built again on the CPU: its tables are real
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(rows)[None, :])
    cos, sin = cos[0].float().numpy(), sin[0].float().numpy()
    if cos.shape[-1] != att.head_dim:
        raise InputError(f"variant 'gqa': this model rotates {cos.shape[-1]} of each head's {att.head_dim} "
                         "dimensions; the fused kernel rotates them all: use the fp32 export")
    half = cos.shape[-1] // 2
    if not (np.array_equal(cos[:, :half], cos[:, half:]) and np.array_equal(sin[:, :half], sin[:, half:])):
        raise ExportError("variant 'gqa': this rotary embedding is not the rotate-half layout the fused kernel "
                          "computes")
    return np.ascontiguousarray(cos[:, :half]), np.ascontiguousarray(sin[:, :half])


@dataclass
class _Layer:
    q: str  # [batch, seq, heads * head_dim], what the kernel reads (after Qwen3's q/k norms, before rotary)
    k: str
    v: str
    out_node: Any  # the output projection's MatMul: its input 0 becomes the fused node's output
    per_head: bool = False  # q and k are [batch, seq, heads, head_dim] (read after a per-head norm)


def _module_output(graph, consumers: dict, scope: str) -> str:
    """The one output of the nodes under ``scope`` that a node outside it reads."""
    inside = [n for n in graph.node if n.name.startswith(scope + "/")]
    names = {n.name for n in inside}
    outs = [o for n in inside for o in n.output if any(c not in names for c in consumers.get(o, ()))]
    if len(outs) != 1:
        raise ExportError(f"variant 'gqa': found {len(outs)} outputs of {scope} where one was expected; the export's "
                          "naming is not the one this transform knows (made by another torch or transformers?): "
                          "nothing was written")
    return outs[0]


def scope(anatomy, index: int) -> str:
    """The attention of block ``index`` as torch.onnx names its nodes' scope: the module path with ``/`` between
    its parts and a list's index kept with its name (``layers.0/self_attn``, ``encoder/layer.0/attention/self``)."""
    return f"{anatomy.blocks.replace('.', '/')}.{index}/{anatomy.attention.module.replace('.', '/')}"


def _find_layers(graph, anatomy) -> list[_Layer]:
    by_name = {n.name: n for n in graph.node}
    consumers: dict[str, list[str]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    shape = anatomy.attention
    # torch.onnx names nodes by module path: "/layers.N/..." for a base model, "/model/layers.N/..." under a head
    anchor = f"{scope(anatomy, 0)}/o_proj/MatMul"
    prefixes = {n.name[: -len(anchor)] for n in graph.node if n.name.endswith(anchor)}
    if len(prefixes) != 1:
        raise ExportError(f"variant 'gqa': no single {anchor} node in the graph; the export's naming is not the one "
                          "this transform knows (made by another torch or transformers?): nothing was written")
    prefix = prefixes.pop()
    layers = []
    for i in range(anatomy.num_blocks):
        scope_i = f"{prefix}{scope(anatomy, i)}"
        out = by_name.get(f"{scope_i}/o_proj/MatMul")
        if out is None:
            raise ExportError(f"variant 'gqa': layer {i} has no {scope_i}/o_proj/MatMul; nothing was written")
        q, k, v = (_module_output(graph, consumers, f"{scope_i}/{p}_proj") for p in "qkv")
        layer = _Layer(q, k, v, out_node=out)
        if shape.qk_norm != "none":  # the CPU kernel has no q/k norm prologue: the norms stay, the kernel reads theirs
            layer.q = _module_output(graph, consumers, f"{scope_i}/q_norm")
            layer.k = _module_output(graph, consumers, f"{scope_i}/k_norm")
            layer.per_head = shape.qk_norm == "per_head"  # a flat norm's output is [batch, seq, heads * head_dim]
        layers.append(layer)
    return layers


def fuse_gqa(src: Path, dst: Path, manifest: Manifest, *, external: bool = False) -> dict[str, Any]:
    """Write ``dst``: ``src`` with every layer's attention one GroupQueryAttention node."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    config, shape = check_gqa(src.parent, manifest)
    rows = int(manifest.length_limit)  # every position a --max-length up to the model's limit reads
    cos, sin = rotary_tables(config, manifest, rows)
    model = onnx.load(str(src))
    graph = model.graph
    layers = _find_layers(graph, manifest.anatomy)
    inputs = {i.name for i in graph.input}
    if "attention_mask" not in inputs or "input_ids" not in inputs:
        raise ExportError("variant 'gqa' needs the export's input_ids and attention_mask inputs")

    p = "layerscope/gqa/"
    new_nodes = [
        # seqlens_k: each row's valid length - 1 (right padding); total_sequence_length: the padded length
        helper.make_node("ReduceSum", ["attention_mask", p + "axis1"], [p + "lengths"], keepdims=0, name=p + "lengths"),
        helper.make_node("Sub", [p + "lengths", p + "one"], [p + "last"], name=p + "last"),
        helper.make_node("Cast", [p + "last"], [p + "seqlens_k"], to=TensorProto.INT32, name=p + "seqlens_k"),
        helper.make_node("Shape", ["input_ids"], [p + "shape"], start=1, end=2, name=p + "shape"),
        helper.make_node("Squeeze", [p + "shape"], [p + "total64"], name=p + "total64"),
        helper.make_node("Cast", [p + "total64"], [p + "total"], to=TensorProto.INT32, name=p + "total"),
    ]
    graph.initializer.extend([
        numpy_helper.from_array(np.array([1], dtype=np.int64), p + "axis1"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), p + "one"),
        numpy_helper.from_array(cos, p + "cos"),
        numpy_helper.from_array(sin, p + "sin"),
    ])
    if any(layer.per_head for layer in layers):
        graph.initializer.append(numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), p + "flat"))

    def flat(name: str, out: str) -> str:  # [batch, seq, heads, head_dim] -> [batch, seq, heads * head_dim]
        new_nodes.append(helper.make_node("Reshape", [name, p + "flat"], [out], name=out))
        return out

    for i, layer in enumerate(layers):
        out = f"{p}layer{i}"
        q, k = (flat(layer.q, f"{out}/q"), flat(layer.k, f"{out}/k")) if layer.per_head else (layer.q, layer.k)
        ins = [q, k, layer.v, "", "", p + "seqlens_k", p + "total", p + "cos", p + "sin"]
        extra = ({"scale": shape.scale} if shape.scale is not None else {}) | \
            ({"local_window_size": shape.window} if shape.window is not None else {})
        new_nodes.append(helper.make_node("GroupQueryAttention", ins, [out], domain="com.microsoft",
                                          name=f"{p}attention{i}", num_heads=shape.heads,
                                          kv_num_heads=shape.kv_heads, do_rotary=1, **extra))
        layer.out_node.input[0] = out
    graph.node.extend(new_nodes)
    from onnxruntime.transformers.onnx_model import OnnxModel

    from layerscope.export.variant_files import quiet

    before = len(graph.node)
    with quiet():
        tools = OnnxModel(model)
        tools.prune_graph(allow_remove_graph_inputs=False)  # the old attention nodes, unused initializers
        tools.topological_sort(is_deterministic=True)  # the fused nodes after what they read
    dropped = before - len(graph.node)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    from layerscope.export.variant_files import save_variant

    save_variant(model, dst, external=external)
    return {"fused_attention_nodes": len(layers), "nodes_dropped": dropped, "num_heads": shape.heads,
            "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "rotary_rows": rows,
            "qk_norm": f"{shape.qk_norm}, kept as graph nodes (the CPU kernel has none)" if shape.qk_norm != "none" else None,
            "scale": shape.scale, "local_window_size": shape.window,
            "padding": "right (positions 0..n-1 per row, lengths from the mask)",
            **({"anatomy": manifest.anatomy.note} if manifest.anatomy.derived_on_load else {})}

