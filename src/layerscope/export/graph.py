"""Edits to the exported ONNX graph: expose the raw word embeddings, add in-graph pooling.

``raw_embeddings`` is the existing word-embedding ``Gather`` marked as a graph
output (no second lookup).  ``pooled.<mode>`` outputs stack the chosen layers
and pool them inside the graph, mask-aware, so an engine copies
``[layers, batch, hidden]`` back to the host instead of every token of every
layer.  Each pooling's nodes come from its in-graph rendering in ``vocab/pooling.py``.
"""

from __future__ import annotations

from layerscope.errors import ExportError
from layerscope.vocab.outputs import RAW_OUTPUT, pooled_output, sorted_hidden_outputs
from layerscope.vocab.pooling import GRAPH_POOLINGS, OnnxBuilder, OnnxPooling


def hidden_output_names(model) -> list[str]:
    return sorted_hidden_outputs(o.name for o in model.graph.output)


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
        graph.node.append(helper.make_node("Identity", [source], [RAW_OUTPUT], name="layerscope/" + RAW_OUTPUT))
    else:  # a half-precision export: the output is float32 like every other
        graph.node.append(helper.make_node("Cast", [source], [RAW_OUTPUT], name="layerscope/" + RAW_OUTPUT,
                                           to=onnx.TensorProto.FLOAT))
    graph.output.append(helper.make_tensor_value_info(
        RAW_OUTPUT, onnx.TensorProto.FLOAT, ["batch_size", "sequence_length", dims]))
    return source


def opset_of(model) -> int:
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def add_pooled_outputs(model, modes: list[str], layer_tensors: list[str], hidden_size: int,
                       eos_token_id: int | None = None) -> None:
    """Append ``pooled.<mode>`` outputs, each ``[len(layer_tensors), batch, hidden]`` float32
    (the in-graph rendering of each pooling is in layerscope/vocab/pooling.py)."""
    import onnx
    from onnx import helper

    for mode in modes:
        if mode not in GRAPH_POOLINGS:
            raise ExportError(f"unknown in-graph pooling '{mode}'; choose from {', '.join(GRAPH_POOLINGS)}")
    graph = model.graph
    opset = opset_of(model)
    if opset < 13:
        raise ExportError(f"in-graph pooling needs ONNX opset 13 or later (this export has {opset}); pass --opset 17")
    b = OnnxBuilder(graph, "layerscope/pool")
    axes0 = b.const([0], "axes0")
    # [L, B, S, H]: the layer outputs stacked (manifest_check reads the pooled layers back from this Concat)
    stacked = b.node("Concat", [b.node("Unsqueeze", [t, axes0]) for t in layer_tensors], "stack", axis=0)
    rendering = OnnxPooling(b, stacked, opset=opset, eos_token_id=eos_token_id)
    for mode in modes:
        out = rendering.render(mode)
        name = pooled_output(mode)
        graph.node.append(helper.make_node("Identity", [out], [name], name=f"layerscope/{name}"))
        graph.output.append(helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT, [len(layer_tensors), "batch_size", hidden_size]))
