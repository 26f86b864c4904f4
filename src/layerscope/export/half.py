"""``layerscope export --dtype fp16``: a half-precision export made from a half-precision torch model.

Why from torch fp16 and not by converting the fp32 export: the converter (the ``fp16`` variant's
``convert_float_to_float16``) needs the whole fp32 graph in memory, i.e. the fp32 torch model
(4 bytes/parameter) plus the fp32 graph (4) plus the fp16 copy (2): ~10 bytes per parameter,
31 GB for a 3B model.  Tracing a torch model loaded in fp16 holds the fp16 weights (2) and the
exporter's copy (2): ~4 bytes per parameter, about 2x the weights on disk.

Numerically sensitive ops are then put back in fp32 exactly as the fp16 variant keeps them
(``FP16_BLOCK_LIST``: LayerNorm, Softmax, reductions, Pow/Sqrt/Erf): each such node that
sees fp16 gets Casts to fp32 around it.  The graph's inputs are integer ids; every hidden-state
output is cast to fp32, so the raw-embedding output, the in-graph pooling and every engine see
float32 tensors, as with an fp32 export.
"""

from __future__ import annotations

import math
from typing import Any

from layerscope.errors import InputError
from layerscope.vocab.outputs import RAW_OUTPUT, hidden_index

DTYPES = ("fp32", "fp16", "bf16")

# fp16: ops kept in fp32 (numerically sensitive: DeBERTa and T5 overflow otherwise); the fp16 variant and
# every fp16 export (text, vision, a vision tower's attention graph) keep the same ones
FP16_BLOCK_LIST = ["LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                   "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "Softmax", "ReduceMean",
                   "Pow", "Sqrt", "Erf"]

# Allowed (1 - cosine) against torch fp32 grows with depth: rounding errors of fp16 compound
# through the residual stream, about 1e-3 per 12 layers on the deep decoders we measured.
FP16_COS_BUDGET = 1e-3
FP16_COS_LAYERS = 12


def check_dtype(dtype: str) -> str:
    dtype = (dtype or "fp32").lower()
    aliases = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
    dtype = aliases.get(dtype, dtype)
    if dtype == "bf16":
        from layerscope.model.variants import check_kind

        check_kind("bf16")  # raises the one-line reason (no bf16 MatMul in ONNX Runtime's CPU provider)
    if dtype not in DTYPES:
        raise InputError(f"unknown --dtype '{dtype}'; choose fp32 or fp16")
    return dtype


def fp16_min_cos(output: str, num_layers: int) -> float:
    """The cosine an fp16 output must keep against torch fp32, scaled by its depth."""
    depth = hidden_index(output)
    if depth is None:  # raw embeddings: depth 0; pooled outputs stack every layer: the deepest one counts
        depth = 0 if output == RAW_OUTPUT else num_layers
    return 1.0 - FP16_COS_BUDGET * max(1.0, depth / FP16_COS_LAYERS)


def fp16_tolerance(outputs: list[str], num_layers: int) -> dict[str, Any]:
    return {"rule": f"min_cos >= 1 - {FP16_COS_BUDGET:g} * max(1, depth / {FP16_COS_LAYERS}); max_abs recorded, "
                    "not a limit (hidden-state magnitudes differ by layer)",
            "min_cos": {name: round(fp16_min_cos(name, num_layers), 6) for name in outputs}}


def fp16_failures(stats: dict[str, dict[str, float]], tolerance: dict[str, Any]) -> list[str]:
    bad = []
    for name, want in tolerance["min_cos"].items():
        got = stats.get(name, {}).get("min_cos", float("nan"))
        if math.isnan(got) or got < want:
            bad.append(f"{name} min cosine {got:.6f} < {want:.6f}")
    return bad


def _elem_types(model) -> dict[str, int]:
    """Element type of every tensor in the graph, from shape inference on the structure alone."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def keep_sensitive_ops_fp32(model, op_types: list[str]) -> int:
    """Wrap every ``op_types`` node that runs in fp16 with Casts so it computes in fp32; returns the count."""
    from onnx import TensorProto, helper

    types = _elem_types(model)
    graph = model.graph
    new_nodes = []
    wrapped = 0
    for node in list(graph.node):
        half_in = {i for i in node.input if i and types.get(i) == TensorProto.FLOAT16}
        if node.op_type not in op_types or not half_in:
            new_nodes.append(node)
            continue
        wrapped += 1
        base = f"layerscope/fp32/{node.name or node.op_type}_{wrapped}"
        after = []
        for k, name in enumerate(node.input):  # input casts go right before the node: order stays valid
            if name in half_in:
                cast = f"{base}/in{k}"
                new_nodes.append(helper.make_node("Cast", [name], [cast], name=cast, to=TensorProto.FLOAT))
                node.input[k] = cast
        for k, name in enumerate(node.output):
            if name and types.get(name) == TensorProto.FLOAT16:
                inner = f"{base}/out{k}"
                node.output[k] = inner
                after.append(helper.make_node("Cast", [inner], [name], name=inner + "/cast", to=TensorProto.FLOAT16))
        new_nodes.append(node)
        new_nodes.extend(after)
    del graph.node[:]
    graph.node.extend(new_nodes)
    return wrapped


def cast_outputs_fp32(model, names: list[str]) -> int:
    """Make each fp16 graph output in ``names`` a float32 one through a Cast; returns the count."""
    from onnx import TensorProto, helper

    graph = model.graph
    count = 0
    for out in graph.output:
        if out.name not in names or out.type.tensor_type.elem_type != TensorProto.FLOAT16:
            continue
        half = out.name + "/fp16"
        for node in graph.node:
            for k, name in enumerate(node.output):
                if name == out.name:
                    node.output[k] = half
            for k, name in enumerate(node.input):
                if name == out.name:
                    node.input[k] = half
        graph.node.append(helper.make_node("Cast", [half], [out.name], name=f"layerscope/fp32/{out.name}",
                                           to=TensorProto.FLOAT))
        out.type.tensor_type.elem_type = TensorProto.FLOAT
        count += 1
    return count
