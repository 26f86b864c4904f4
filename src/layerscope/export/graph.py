"""Edits to the exported ONNX graph: expose the raw word embeddings, add in-graph pooling.

``raw_embeddings`` is the existing word-embedding ``Gather`` marked as a graph
output (no second lookup).  ``pooled.<mode>`` outputs stack the chosen layers
and pool them inside the graph, mask-aware, so an engine copies
``[layers, batch, hidden]`` back to the host instead of every token of every
layer.  The arithmetic mirrors ``runtime/pooling.py`` exactly.
"""

from __future__ import annotations

import numpy as np

from layerscope.errors import ExportError

RAW = "raw_embeddings"
PREFIX = "pooled."
GRAPH_POOLINGS = ("mean", "cls", "last", "max", "eos", "mean-nobos")


def hidden_output_names(model) -> list[str]:
    names = [o.name for o in model.graph.output if o.name.startswith("hidden_states.")]
    return sorted(names, key=lambda n: int(n.split(".")[1]))


def _initializer_shapes(graph) -> dict[str, tuple[int, ...]]:
    return {init.name: tuple(init.dims) for init in graph.initializer}


def add_raw_embeddings_output(model, vocab_size: int, hidden_size: int | None = None) -> str:
    """Mark the word-embedding lookup as the ``raw_embeddings`` output; return the source tensor name."""
    import onnx
    from onnx import helper

    graph = model.graph
    shapes = _initializer_shapes(graph)
    candidates = []
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        shape = shapes.get(node.input[0])
        if shape and len(shape) == 2 and shape[0] == vocab_size:
            candidates.append(node)
    if len(candidates) > 1:  # prefer the lookup fed by input_ids directly
        direct = [n for n in candidates if n.input[1] == "input_ids"]
        candidates = direct or candidates
    if len(candidates) != 1:
        raise ExportError(
            f"found {len(candidates)} word-embedding lookups (vocab x dim tables) in the exported graph "
            "(expected exactly one); this architecture needs its raw-embedding output mapped by hand"
        )
    source = candidates[0].output[0]
    dims = shapes[candidates[0].input[0]][1]
    table_type = next(i.data_type for i in graph.initializer if i.name == candidates[0].input[0])
    if table_type == onnx.TensorProto.FLOAT:
        graph.node.append(helper.make_node("Identity", [source], [RAW], name="layerscope/raw_embeddings"))
    else:  # a half-precision export: the output is float32 like every other
        graph.node.append(helper.make_node("Cast", [source], [RAW], name="layerscope/raw_embeddings",
                                           to=onnx.TensorProto.FLOAT))
    graph.output.append(helper.make_tensor_value_info(
        RAW, onnx.TensorProto.FLOAT, ["batch_size", "sequence_length", dims]))
    return source


class _Builder:
    """Small helper to append nodes with unique names under one prefix."""

    def __init__(self, graph, prefix: str):
        self.graph = graph
        self.prefix = prefix
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}/{hint}_{self.count}"

    def node(self, op: str, inputs: list[str], hint: str | None = None, **attrs) -> str:
        from onnx import helper

        out = self.name(hint or op)
        self.graph.node.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(self, value, hint: str, dtype=np.int64) -> str:
        from onnx import numpy_helper

        name = self.name(hint)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name


def opset_of(model) -> int:
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def add_pooled_outputs(model, modes: list[str], layer_tensors: list[str], hidden_size: int,
                       eos_token_id: int | None = None) -> None:
    """Append ``pooled.<mode>`` outputs, each ``[len(layer_tensors), batch, hidden]`` float32."""
    import onnx
    from onnx import helper

    for mode in modes:
        if mode not in GRAPH_POOLINGS:
            raise ExportError(f"unknown in-graph pooling '{mode}'; choose from {', '.join(GRAPH_POOLINGS)}")
    graph = model.graph
    opset = opset_of(model)
    if opset < 13:
        raise ExportError(f"in-graph pooling needs ONNX opset 13 or later (this export has {opset}); pass --opset 17")
    b = _Builder(graph, "layerscope/pool")
    axes0 = b.const([0], "axes0")
    axes1 = b.const([1], "axes1")
    axes2 = b.const([2], "axes2")
    axes3 = b.const([3], "axes3")
    # [L, B, S, H]
    stacked = b.node("Concat", [b.node("Unsqueeze", [t, axes0]) for t in layer_tensors], "stack", axis=0)
    maskf = b.node("Cast", ["attention_mask"], "maskf", to=onnx.TensorProto.FLOAT)  # [B, S]
    one = b.const(1.0, "one", np.float32)
    zero_i = b.const(0, "zero_i")
    one_i = b.const(1, "one_i")
    seq_len = b.node("Gather", [b.node("Shape", ["attention_mask"]), one_i], "seq_len", axis=0)
    positions = b.node("Range", [zero_i, seq_len, one_i], "positions")  # [S]
    positions_row = b.node("Unsqueeze", [positions, axes0], "positions_row")  # [1, S]

    def onehot(index_b: str, hint: str) -> str:  # index [B] -> float [B, S]
        eq = b.node("Equal", [positions_row, b.node("Unsqueeze", [index_b, axes1])], hint)
        return b.node("Cast", [eq], hint + "_f", to=onnx.TensorProto.FLOAT)

    def first_idx() -> str:
        return b.node("ArgMax", [maskf], "first_idx", axis=1, keepdims=0)

    def last_idx() -> str:
        # highest position whose mask is 1: argmax of mask * (position + 1)
        pos1 = b.node("Cast", [b.node("Add", [positions_row, one_i])], "pos1", to=onnx.TensorProto.FLOAT)
        return b.node("ArgMax", [b.node("Mul", [maskf, pos1])], "last_idx", axis=1, keepdims=0)

    def normalized(weights: str, hint: str) -> str:
        total = b.node("ReduceSum", [weights, axes1], hint + "_sum", keepdims=1)
        return b.node("Div", [weights, b.node("Max", [total, one])], hint)

    def weighted(weights: str, mode: str) -> str:  # weights [B, S] -> [L, B, H]
        w = b.node("Unsqueeze", [weights, axes1], mode + "_w")  # [B, 1, S]
        w = b.node("Unsqueeze", [w, axes0], mode + "_w4")  # [1, B, 1, S]
        pooled = b.node("MatMul", [w, stacked], mode + "_matmul")  # [L, B, 1, H]
        return b.node("Squeeze", [pooled, axes2], mode + "_out")

    for mode in modes:
        if mode == "mean":
            out = weighted(normalized(maskf, "mean_w"), mode)
        elif mode == "cls":
            out = weighted(onehot(first_idx(), "cls_onehot"), mode)  # first real token, either padding side
        elif mode == "last":
            out = weighted(onehot(last_idx(), "last_onehot"), mode)
        elif mode == "mean-nobos":
            not_first = b.node("Sub", [one, onehot(first_idx(), "first_onehot")], "not_first")
            keep = b.node("Mul", [maskf, not_first], "nobos_mask")
            out = weighted(normalized(keep, "nobos_w"), "mean_nobos")
        elif mode == "eos":
            ids = "input_ids"
            if eos_token_id is None or eos_token_id == 2:
                idx = b.node("ArgMax", [ids], "eos_idx", axis=1, keepdims=0)
            else:
                hit = b.node("Equal", [ids, b.const(eos_token_id, "eos_id")], "eos_hit")
                idx = b.node("ArgMax", [b.node("Cast", [hit], "eos_hit_i", to=onnx.TensorProto.INT32)],
                             "eos_idx", axis=1, keepdims=0)
            out = weighted(onehot(idx, "eos_onehot"), mode)
        else:  # max
            valid = b.node("Cast", [b.node("Unsqueeze", [b.node("Unsqueeze", ["attention_mask", axes0]), axes3])],
                           "max_valid", to=onnx.TensorProto.BOOL)  # [1, B, S, 1]
            neg = b.const(-np.inf, "neg_inf", np.float32)
            filled = b.node("Where", [valid, stacked, neg], "max_filled")
            if opset >= 18:
                out = b.node("ReduceMax", [filled, axes2], "max_out", keepdims=0)
            else:
                out = b.node("ReduceMax", [filled], "max_out", axes=[2], keepdims=0)
        name = PREFIX + mode
        graph.node.append(helper.make_node("Identity", [out], [name], name=f"layerscope/{name}"))
        graph.output.append(helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT, [len(layer_tensors), "batch_size", hidden_size]))
