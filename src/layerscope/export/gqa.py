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

The kernel reads positions as 0..n-1 within each row and the valid length of each row from the
attention mask (``seqlens_k``), i.e. right-padded batches; layerscope's tokenizers always pad on the
right, and this file records that assumption.

Anchors are the module scopes torch.onnx writes into node names (``/layers.N/self_attn/q_proj/...``),
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

GQA_FAMILIES = ("qwen2", "qwen3", "llama", "mistral", "olmo2", "granite")
_ROTARY_CLASS = {"qwen2": "Qwen2RotaryEmbedding", "qwen3": "Qwen3RotaryEmbedding", "llama": "LlamaRotaryEmbedding",
                 "mistral": "MistralRotaryEmbedding", "olmo2": "Olmo2RotaryEmbedding",
                 "granite": "GraniteRotaryEmbedding"}


@dataclass(frozen=True)
class AttentionShape:
    """What the fused node needs to know of the model."""

    num_heads: int
    kv_heads: int
    head_dim: int
    qk_norm: bool  # Qwen3: an RMS norm per head on q and k
    qk_norm_flat: bool = False  # OLMo-2: an RMS norm over all heads on q and k
    scale: float | None = None  # the softmax's scale where it is not 1/sqrt(head_dim) (Granite)
    window: int | None = None  # Mistral's sliding window: the keys a query sees, itself included


def check_gqa(export_dir: Path, manifest: Manifest):
    """``(config, AttentionShape)`` for the fused node; one line (InputError) where the kernel cannot run it."""
    if manifest.family not in GQA_FAMILIES:
        raise InputError(f"variant 'gqa' fuses the attention of rotary decoders ({', '.join(GQA_FAMILIES)}); "
                         f"this export is a {manifest.family} model: use 'opt' for its fusions")
    config = _config(Path(export_dir))
    _rotary_kind(config)
    return config, attention_shape(config, manifest.family)


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


def attention_shape(config, family: str) -> AttentionShape:
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise InputError("variant 'gqa': this checkpoint uses sliding-window attention in some layers; the fused "
                         "graph would need a window per layer, which is not written yet: use the fp32 export")
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    if head_dim % 16:
        raise InputError(f"variant 'gqa': this model's attention heads are {head_dim} wide; ONNX Runtime's "
                         "GroupQueryAttention kernel takes a multiple of 16: use the fp32 export")
    window = getattr(config, "sliding_window", None) if family == "mistral" else None  # every layer's, when set
    scale = float(config.attention_multiplier) if family == "granite" else None
    return AttentionShape(num_heads=heads, kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
                          head_dim=head_dim, qk_norm=family == "qwen3", qk_norm_flat=family == "olmo2",
                          scale=scale, window=int(window) if window else None)


def rotary_tables(config, family: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[rows, head_dim / 2]`` as the checkpoint's own rotary module computes them (float32,
    its attention scaling included), for a config ``check_gqa`` accepted."""
    import importlib

    import torch

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    rotary = getattr(module, _ROTARY_CLASS[family])(config=config)
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(rows)[None, :])
    cos, sin = cos[0].float().numpy(), sin[0].float().numpy()
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


def _find_layers(graph, num_layers: int, shape: AttentionShape) -> list[_Layer]:
    by_name = {n.name: n for n in graph.node}
    consumers: dict[str, list[str]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.name)
    # torch.onnx names nodes by module path: "/layers.N/..." for a base model, "/model/layers.N/..." under a head
    prefixes = {n.name[: -len("layers.0/self_attn/o_proj/MatMul")] for n in graph.node
                if n.name.endswith("layers.0/self_attn/o_proj/MatMul")}
    if len(prefixes) != 1:
        raise ExportError("variant 'gqa': no single layers.0/self_attn/o_proj/MatMul node in the graph; the export's "
                          "naming is not the one this transform knows (made by another torch or transformers?): "
                          "nothing was written")
    prefix = prefixes.pop()
    layers = []
    for i in range(num_layers):
        scope = f"{prefix}layers.{i}/self_attn"
        out = by_name.get(f"{scope}/o_proj/MatMul")
        if out is None:
            raise ExportError(f"variant 'gqa': layer {i} has no {scope}/o_proj/MatMul; nothing was written")
        q, k, v = (_module_output(graph, consumers, f"{scope}/{p}_proj") for p in "qkv")
        layer = _Layer(q, k, v, out_node=out)
        if shape.qk_norm:  # ONNX Runtime's CPU kernel has no q/k norm prologue: the norms stay, the kernel reads theirs
            layer.q = _module_output(graph, consumers, f"{scope}/q_norm")
            layer.k = _module_output(graph, consumers, f"{scope}/k_norm")
            layer.per_head = True
        if shape.qk_norm_flat:  # read after the norms, already [batch, seq, heads * head_dim]
            layer.q = _module_output(graph, consumers, f"{scope}/q_norm")
            layer.k = _module_output(graph, consumers, f"{scope}/k_norm")
        layers.append(layer)
    return layers


def fuse_gqa(src: Path, dst: Path, manifest: Manifest, *, external: bool = False) -> dict[str, Any]:
    """Write ``dst``: ``src`` with every layer's attention one GroupQueryAttention node."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    config, shape = check_gqa(src.parent, manifest)
    rows = int(manifest.length_limit)  # every position a --max-length up to the model's limit reads
    cos, sin = rotary_tables(config, manifest.family, rows)
    model = onnx.load(str(src))
    graph = model.graph
    layers = _find_layers(graph, manifest.num_layers, shape)
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
                                          name=f"{p}attention{i}", num_heads=shape.num_heads,
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
    return {"fused_attention_nodes": len(layers), "nodes_dropped": dropped, "num_heads": shape.num_heads,
            "kv_heads": shape.kv_heads, "head_dim": shape.head_dim, "rotary_rows": rows,
            "qk_norm": "kept as graph nodes (the CPU kernel has none)" if shape.qk_norm or shape.qk_norm_flat else None,
            "scale": shape.scale, "local_window_size": shape.window,
            "padding": "right (positions 0..n-1 per row, lengths from the mask)"}

