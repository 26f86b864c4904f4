"""A graph that hands back pooled vectors only pools each layer as it is made.

The export pools its layers inside the graph over a stack of them (export/graph.py: a ``Concat`` of each
layer's ``Unsqueeze``, ``[layers, batch, T, hidden]``, then the pooling's nodes over it). The stack holds every
layer's token states at once, and a runtime keeps each layer alive until the stack is made: about twice
``layers x T x hidden`` floats (1.8 GiB for 29 layers 1,024 wide at 8k tokens), which a run that wants no token
states (early exit's ``pooled_only`` graph, engines/truncate.py) has no use for. Here the pooling's nodes
(everything computed from the stack) run once per layer on that layer's ``[1, batch, T, hidden]``, and each
pooled output gathers the layers' ``[1, batch, hidden]`` rows in the stack's order; so each layer's states can go
once the next layer and its own pooling have read them. Nodes that read only the mask and the ids stay shared.
"""

from __future__ import annotations

from layerscope.vocab.outputs import output_layer


def pooling_stack(graph):
    """The pooling's stacking ``Concat`` (every input an ``Unsqueeze`` of a layer output), or None."""
    made_by = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.op_type == "Concat" and node.input and all(
                made_by.get(name) is not None and made_by[name].op_type == "Unsqueeze"
                and output_layer(made_by[name].input[0]) is not None for name in node.input):
            return node
    return None


def pool_each_layer(graph) -> int:
    """Rewrite ``graph`` (in place) so that each layer is pooled on its own; the number of layers so pooled
    (0: the graph has no stack its pooled outputs read, and is left as it was)."""
    import numpy as np
    from onnx import NodeProto, helper, numpy_helper

    stack = pooling_stack(graph)
    if stack is None:
        return 0
    stacked = stack.output[0]
    downstream, pooling = {stacked}, []
    for node in graph.node:  # in topological order: the nodes computed from the stack
        if node is not stack and any(name in downstream for name in node.input):
            pooling.append(node)
            downstream.update(node.output)
    outputs = [o.name for o in graph.output if o.name in downstream]
    if not outputs:
        return 0
    p = "layerscope/pool_each_layer/"
    graph.initializer.append(numpy_helper.from_array(np.array([0], dtype=np.int64), p + "axes0"))
    per_layer = []
    for i, layer in enumerate(stack.input):  # [1, batch, T, hidden]
        renamed, nodes = {stacked: layer}, []
        for node in pooling:
            clone = NodeProto()
            clone.CopyFrom(node)
            del clone.input[:]
            clone.input.extend(renamed.get(name, name) for name in node.input)
            del clone.output[:]
            for name in node.output:
                renamed[name] = f"{name}/layer{i}" if name else ""
                clone.output.append(renamed[name])
            clone.name = f"{node.name or node.output[0]}/layer{i}"
            nodes.append(clone)
        # the layer's pooled rows of every output joined ([1, outputs, batch, hidden]): all its poolings run together
        nodes.append(helper.make_node("Concat", [renamed[name] for name in outputs], [f"{p}rows{i}"], axis=0,
                                      name=f"{p}rows{i}"))
        nodes.append(helper.make_node("Unsqueeze", [f"{p}rows{i}", p + "axes0"], [f"{p}layer{i}"],
                                      name=f"{p}layer{i}"))
        per_layer.append(nodes)
    joins = [helper.make_node("Concat", [f"{p}layer{i}" for i in range(len(stack.input))], [p + "all"], axis=0,
                              name=p + "all")]  # [layers, outputs, batch, hidden]
    for m, name in enumerate(outputs):
        graph.initializer.append(numpy_helper.from_array(np.array(m, dtype=np.int64), f"{p}index{m}"))
        joins.append(helper.make_node("Gather", [p + "all", f"{p}index{m}"], [name], axis=1, name=p + name))
    # written last layer first: ONNX Runtime's default order walks back from the outputs taking the inputs of a
    # node from the last written, so it then meets the first layer's pooling first and runs each layer's pooling
    # right after the layer (tests/test_layer_pooling.py holds it to that)
    clones = [node for nodes in reversed(per_layer) for node in nodes]
    dropped = {id(stack)} | {id(n) for n in pooling}
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept + clones + joins)
    produced = {o for n in graph.node for o in n.output}
    infos = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return len(stack.input)
