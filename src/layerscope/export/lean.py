"""Exports whose weights never exist twice: trace without them, then write each from the model's tensors.

``torch.onnx.export`` with its weights builds a proto holding a copy of every parameter (and its
constant folding makes transposed copies of the linear weights) while the model itself is still
in memory: an fp32 export then needs about twice the weights (~25 GB for a 3B model).  Here:

1. the model is traced with ``export_params=False, do_constant_folding=False``: the graph takes
   every parameter as an input named like the parameter (``encoder.layer.0.output.dense.weight``);
2. ``attach_weights`` turns each such input into an initializer whose bytes are written straight
   from the model's tensor into the page-aligned ``model.onnx_data``, one tensor at a time; nodes
   that compute only from weights and constants (the transposes of linear weights, casts,
   unsqueezes) are evaluated here, one at a time, and written the same way, as torch's folding
   would have stored them.

Peak memory is the model plus its largest tensor.  ``tests/export/test_lean_export.py`` checks that
every output is bit-identical to the ordinary path on tiny models (threshold lowered).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import ExportError
from layerscope.export import external

# Only data movement is folded (exact by construction); arithmetic on weights (a LayerNorm of
# DeBERTa's relative embeddings) stays in the graph, as torch's own folding leaves it.
FOLDED_OPS = frozenset({"Transpose", "Identity", "Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Shape",
                        "Slice", "Gather", "Concat", "Expand"})
ENABLED = True  # False: the ordinary path even above the threshold (benchmarks/models/lean_export_rss.py)
# Weights (bytes in memory) from which an export streams them and traces in a child process, far below the
# 2 GiB that forces external data: the ordinary path peaks at ~6.5x the weights (torch.onnx's copy and its
# folded transposes, then torch reloaded for validation in a process that kept its freed memory), streamed
# in a child ~2x (benchmarks/models/README.md); from 300 MB on that gap (over 1.3 GB) outweighs a child's start.
STREAM_BYTES = 300_000_000


def weight_bytes(model) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


class _WithoutWeights:
    """``torch.onnx.export`` as optimum calls it, but tracing parameters as graph inputs.

    Optimum's ``fix_dynamic_axes`` runs the graph, which cannot run without its weights: it is
    skipped here and run by the exporter once the weights are attached and the torch model freed.
    """

    def __init__(self, onnx_cfg):
        self.cfg = onnx_cfg

    def __enter__(self):
        import torch

        self._real = torch.onnx.export

        def export(*args, **kwargs):
            kwargs["export_params"] = False
            kwargs["do_constant_folding"] = False
            return self._real(*args, **kwargs)

        torch.onnx.export = export
        self.cfg.fix_dynamic_axes = lambda *a, **k: None  # an instance attribute: the class keeps its own
        return self

    def __exit__(self, *exc):
        import torch

        torch.onnx.export = self._real
        del self.cfg.fix_dynamic_axes
        return False


def without_weights(onnx_cfg):
    return _WithoutWeights(onnx_cfg)


def _tensors_by_name(model) -> dict[str, Any]:
    out = dict(model.named_buffers(remove_duplicate=False))
    out.update(dict(model.named_parameters(remove_duplicate=False)))
    return out


def _eval_node(node, values: list[np.ndarray], opset: int) -> list[np.ndarray]:
    """One node on numpy inputs, by onnx's reference implementation."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if n else "" for i, n in enumerate(node.input)]
    clone = helper.make_node(node.op_type, names, [f"out{i}" for i in range(len(node.output))],
                             domain=node.domain or None)
    clone.attribute.extend(node.attribute)
    feeds = {n: v for n, v in zip(names, values) if n}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in feeds.items()]
    outputs = [helper.make_empty_tensor_value_info(o) for o in clone.output]
    graph = helper.make_graph([clone], "fold", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain or "", opset)])
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def attach_weights(onnx_path: str | Path, model, *, opset: int) -> dict[str, int]:
    """Give the weight-less graph at ``onnx_path`` its weights, streamed into ``<name>_data``."""
    import onnx
    from onnx import helper, numpy_helper

    onnx_path = Path(onnx_path)
    graph_model = onnx.load(str(onnx_path), load_external_data=False)
    graph = graph_model.graph
    if graph.initializer:
        raise ExportError(f"{onnx_path.name} was traced with weights; expected none")
    tensors = _tensors_by_name(model)
    weights = {i.name for i in graph.input if i.name in tensors}
    unknown = [i.name for i in graph.input if "." in i.name and i.name not in tensors]
    if unknown:
        raise ExportError(f"the traced graph takes inputs {unknown[:3]} that are neither model inputs nor weights")
    small: dict[str, np.ndarray] = {}  # Constant node outputs
    derived: dict[str, Any] = {}  # weight-only node outputs: name -> node (evaluated when written)
    # constant-only nodes turned into Constants, as torch's folding does; the node is held so its id stays its own
    replaced: dict[int, tuple[Any, Any]] = {}
    for node in graph.node:
        if node.op_type == "Constant" and not node.input:
            small[node.output[0]] = numpy_helper.to_array(node.attribute[0].t) \
                if node.attribute[0].name == "value" else _eval_node(node, [], opset)[0]
            continue
        ins = [n for n in node.input if n]
        if node.op_type in FOLDED_OPS and node.domain in ("", "ai.onnx") and ins and len(node.output) == 1 \
                and all(n in small for n in ins):
            value = _eval_node(node, [small[n] if n else None for n in node.input], opset)[0]
            small[node.output[0]] = value
            replaced[id(node)] = (node, helper.make_node("Constant", [], [node.output[0]], name=node.name,
                                                         value=numpy_helper.from_array(value, node.output[0])))
            continue
        if node.op_type in FOLDED_OPS and node.domain in ("", "ai.onnx") and ins and \
                any(n in weights or n in derived for n in ins) and \
                all(n in weights or n in derived or n in small for n in ins):
            for out in node.output:
                derived[out] = node
    _merge_duplicates(graph, derived)
    needed = _needed_values(graph, weights, derived)
    target = external.data_file(onnx_path.name)
    tmp_data = onnx_path.parent / (target + ".tmp")
    offset = 0
    inits = []

    def value(name: str) -> np.ndarray:
        if name in small:
            return small[name]
        if name in weights:
            return tensors[name].detach().cpu().numpy()  # a view of the model's tensor: no copy
        node = derived[name]  # evaluated on demand, one at a time (a transpose of one weight, say)
        outs = _eval_node(node, [value(n) if n else None for n in node.input], opset)
        return dict(zip(node.output, outs))[name]

    with open(tmp_data, "wb") as out:
        for name in needed:
            arr = np.ascontiguousarray(value(name))
            tensor = onnx.TensorProto()
            tensor.name = name
            tensor.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
            tensor.dims.extend(arr.shape)
            pad = (-offset) % external.ALIGN
            out.write(b"\0" * pad)
            offset += pad
            if arr.nbytes:
                out.write(memoryview(arr.reshape(-1)).cast("B"))
            external._set_info(tensor, target, offset, arr.nbytes)
            offset += arr.nbytes
            inits.append(tensor)
            del arr
    folded = {id(n) for n in derived.values()}
    keep_nodes = [replaced[id(n)][1] if id(n) in replaced else n for n in graph.node if id(n) not in folded]
    read = {name for n in keep_nodes for name in _reads(n)} | {o.name for o in graph.output}
    keep_nodes = [n for n in keep_nodes if n.op_type != "Constant" or any(o in read for o in n.output)]
    del graph.node[:]
    graph.node.extend(keep_nodes)
    kept_inputs = [i for i in graph.input if i.name not in weights]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    graph.initializer.extend(inits)
    tmp_graph = onnx_path.with_name(onnx_path.name + ".tmp")
    onnx.save(graph_model, str(tmp_graph))
    os.replace(tmp_data, onnx_path.parent / target)
    os.replace(tmp_graph, onnx_path)
    return {"initializers": len(inits), "folded_nodes": len(folded), "data_bytes": offset}


def _reads(node) -> list[str]:
    """Every name ``node`` reads: its inputs and, for If/Loop/Scan, what its subgraphs take from outside."""
    names = list(node.input)
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in sub.node:
                names.extend(_reads(inner))
    return names


def _rename_reads(node, rename: dict[str, str]) -> None:
    for i, name in enumerate(node.input):
        if name in rename:
            node.input[i] = rename[name]
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in sub.node:
                _rename_reads(inner, rename)


def _merge_duplicates(graph, derived: dict[str, Any]) -> None:
    """Identical folded nodes (DeBERTa transposes one projection weight for two uses) are written once,
    as torch's folding stores one constant for both."""
    first: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    for node in graph.node:
        _rename_reads(node, rename)
        if node.output and node.output[0] in derived and len(node.output) == 1:
            key = (node.op_type, tuple(node.input), tuple(a.SerializeToString() for a in node.attribute))
            if key in first:
                rename[node.output[0]] = first[key]
            else:
                first[key] = node.output[0]
    for out in graph.output:
        if out.name in rename:
            raise ExportError(f"graph output {out.name} is a duplicate of a folded weight")  # pragma: no cover


def _needed_values(graph, weights: set[str], derived: dict[str, Any]) -> list[str]:
    """Weights and folded values that nodes outside the folded set (or graph outputs) read, in order."""
    folded = {id(n) for n in derived.values()}
    needed: list[str] = []
    seen: set[str] = set()
    for node in graph.node:
        if id(node) in folded:
            continue
        for name in _reads(node):
            if name and (name in weights or name in derived) and name not in seen:
                seen.add(name)
                needed.append(name)
    for out in graph.output:
        if (out.name in weights or out.name in derived) and out.name not in seen:
            seen.add(out.name)
            needed.append(out.name)
    return needed
