"""The rewrite behind engines/blocked.py: each attention layer of a decoder's graph as an ONNX ``Loop`` over
blocks of query rows (what it computes and why: engines/blocked.py).

Each layer is found by pattern, not by name: every ``Softmax`` of the graph must read ``Add(scores, mask)``,
the scores a ``Mul``/``Div`` by a constant of ``MatMul(q, Transpose(k))``, and feed (through a ``Cast``
where the model softmaxes in fp32: casts to fp32 only) one ``MatMul`` with the values; ``k`` and ``v`` are read before
``repeat_kv``'s ``Unsqueeze``/``Expand``/``Reshape``. Only causal decoders whose every layer attends to the
whole past are rewritten (a sliding window is refused from the config); a graph that differs in any layer
is not written (``CannotBlock`` says where).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BLOCK_ROWS = 64  # query rows per block: one block's scores are heads x 64 x T floats
P = "layerscope/blocked/"  # prefix of every name the rewrite adds


class CannotBlock(Exception):
    """The graph or the model is not one this rewrite knows; the message says why."""


@dataclass(frozen=True)
class AttentionConfig:
    heads: int
    kv_heads: int
    head_dim: int


def attention_config(config_path: Path) -> AttentionConfig:
    """The heads of a causal decoder whose every layer sees the whole past, from its config.json."""
    from layerscope.errors import InputError
    from layerscope.jsonfile import read_json

    try:
        cfg = read_json(config_path)  # bounded; a FIFO or a device is refused, never waited on
    except (OSError, InputError) as exc:
        raise CannotBlock(f"cannot read {Path(config_path).name}: {exc}") from None
    if not isinstance(cfg, dict):
        raise CannotBlock(f"{Path(config_path).name} holds a JSON {type(cfg).__name__}, not an object")
    cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    if cfg.get("is_encoder_decoder"):
        raise CannotBlock("an encoder-decoder model")
    # the blocks mask the future and padded keys, nothing else: a mask that changes with the distance between
    # tokens beyond the few hundred the check reads (a sliding window, chunks) is refused here
    layer_types = cfg.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types) or cfg.get("use_sliding_window") \
            or (cfg.get("sliding_window") and "use_sliding_window" not in cfg) or cfg.get("attention_chunk_size"):
        raise CannotBlock("its layers attend within a sliding window or chunks, which the blocks do not mask")
    try:
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        raise CannotBlock(f"{config_path.name} does not say its attention heads") from None
    if heads % kv_heads:
        raise CannotBlock(f"{heads} query heads are not groups of its {kv_heads} key/value heads")
    return AttentionConfig(heads, kv_heads, head_dim)


@dataclass(frozen=True)
class _Core:
    """One layer's attention in the source graph."""

    q: str  # [B, heads, T, D], rotary applied
    k: str  # [B, kv_heads, T, D], before repeat_kv
    v: str
    scale_op: str  # "Mul" or "Div", as the model scales its scores
    scale: object  # the float32 scalar it scales by (numpy)
    out: str  # the values' MatMul output [B, heads, T, D]
    at: int  # the index of that MatMul node in the graph


def find_cores(graph) -> list[_Core]:
    """Every Softmax's attention, by the pattern in the module's docstring (CannotBlock where one differs)."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    made_by = {o: n for n in graph.node for o in n.output}
    users: dict[str, list] = {}
    for n in graph.node:
        for name in n.input:
            users.setdefault(name, []).append(n)
    inits = {t.name: t for t in graph.initializer}
    index = {id(n): i for i, n in enumerate(graph.node)}

    def const(name: str):
        if name in inits:
            return numpy_helper.to_array(inits[name])
        node = made_by.get(name)
        if node is not None and node.op_type == "Constant":
            return next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), None)
        return None

    def op(name: str, kind: str):
        node = made_by.get(name)
        return node if node is not None and node.op_type == kind else None

    def before_repeat(name: str) -> str:  # repeat_kv: Unsqueeze -> Expand -> Reshape
        reshape = op(name, "Reshape")
        expand = reshape is not None and op(reshape.input[0], "Expand")
        unsqueeze = expand and op(expand.input[0], "Unsqueeze")
        return unsqueeze.input[0] if unsqueeze else name

    cores = []
    for soft in [n for n in graph.node if n.op_type == "Softmax"]:
        where = f"Softmax {soft.name or soft.output[0]}"
        axis = next((a.i for a in soft.attribute if a.name == "axis"), -1)
        add = op(soft.input[0], "Add")
        if add is None or axis not in (-1, 3):
            raise CannotBlock(f"{where} does not softmax the last axis of scores plus a mask")
        scaled = next((made_by[i] for i in add.input if i in made_by and made_by[i].op_type in ("Mul", "Div")), None)
        qk = scaled is not None and next((op(i, "MatMul") for i in scaled.input if op(i, "MatMul")), None)
        if not qk:
            raise CannotBlock(f"{where} reads no scaled MatMul of queries and keys")
        factor = [i for i in scaled.input if i != qk.output[0]]
        value = const(factor[0]) if len(factor) == 1 else None
        if value is None or np.asarray(value).size != 1 or (scaled.op_type == "Div" and scaled.input[1] != factor[0]):
            raise CannotBlock(f"{where}: the scores are not scaled by one constant")
        kt = op(qk.input[1], "Transpose")
        perm = kt is not None and next((list(a.ints) for a in kt.attribute if a.name == "perm"), None)
        if perm != [0, 1, 3, 2]:
            raise CannotBlock(f"{where}: the keys are not transposed [B, heads, D, T]")
        probs = soft.output[0]
        after = users.get(probs, [])
        while len(after) == 1 and after[0].op_type == "Cast" and \
                next((a.i for a in after[0].attribute if a.name == "to"), None) == TensorProto.FLOAT:
            probs, after = after[0].output[0], users.get(after[0].output[0], [])  # fp32 softmax cast to fp32
        if len(after) != 1 or after[0].op_type != "MatMul" or after[0].input[0] != probs:
            raise CannotBlock(f"{where} feeds no single MatMul with the values")
        pv = after[0]
        cores.append(_Core(q=qk.input[0], k=before_repeat(kt.input[0]), v=before_repeat(pv.input[1]),
                           scale_op=scaled.op_type, scale=np.asarray(value, dtype=np.float32).reshape(()),
                           out=pv.output[0], at=index[id(pv)]))
    if not cores:
        raise CannotBlock("the graph computes no attention softmax")
    return cores


def _shared(graph, opset: int) -> list:
    """Nodes every layer's loop reads, made once from ``attention_mask``: the length ``T`` (scalar and
    [1]), the rows of a block (``BLOCK_ROWS``, or ``T`` where the batch is shorter: its queries are not padded
    up to a block), the number of blocks, the padding that makes the queries a whole number of blocks (Pad's
    ``pads`` for a rank-5 tensor, at the end of axis 3), and the padded keys ``[B, 1, 1, 1, T]``."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    if "attention_mask" not in {i.name for i in graph.input}:
        raise CannotBlock("the graph has no attention_mask input")
    if opset < 13:
        raise CannotBlock(f"the graph's opset {opset} is below 13")
    graph.initializer.extend(numpy_helper.from_array(np.asarray(v, dtype=d), P + name) for name, v, d in (
        ("one", 1, np.int64), ("zero", 0, np.int64), ("zero1", [0], np.int64), ("rows", BLOCK_ROWS, np.int64),
        ("ax0", [0], np.int64), ("ax1", [1], np.int64), ("ax3", [3], np.int64), ("ax4", [4], np.int64),
        ("ax2", [2], np.int64), ("ax123", [1, 2, 3], np.int64), ("zeros8", [0] * 8, np.int64),
        ("true", True, np.bool_), ("fmin", np.finfo(np.float32).min, np.float32)))
    n = helper.make_node
    return [
        n("Shape", ["attention_mask"], [P + "mask_shape"], name=P + "mask_shape"),
        n("Gather", [P + "mask_shape", P + "one"], [P + "t"], axis=0, name=P + "t"),
        n("Unsqueeze", [P + "t", P + "ax0"], [P + "t1"], name=P + "t1"),
        n("Min", [P + "rows", P + "t"], [P + "brows"], name=P + "brows"),  # a batch shorter than a block: one of T
        n("Add", [P + "t", P + "brows"], [P + "t_rows"], name=P + "t_rows"),
        n("Sub", [P + "t_rows", P + "one"], [P + "t_rows1"], name=P + "t_rows1"),
        n("Div", [P + "t_rows1", P + "brows"], [P + "blocks"], name=P + "blocks"),
        n("Mul", [P + "blocks", P + "brows"], [P + "padded"], name=P + "padded"),
        n("Sub", [P + "padded", P + "t"], [P + "pad"], name=P + "pad"),
        n("Unsqueeze", [P + "pad", P + "ax0"], [P + "pad1"], name=P + "pad1"),
        n("Concat", [P + "zeros8", P + "pad1", P + "zero1"], [P + "pads"], axis=0, name=P + "pads"),
        n("Cast", ["attention_mask"], [P + "kept"], to=TensorProto.BOOL, name=P + "kept"),
        n("Not", [P + "kept"], [P + "padkey"], name=P + "padkey"),
        n("Unsqueeze", [P + "padkey", P + "ax123"], [P + "padkeys"], name=P + "padkeys"),
    ]


def _loop(i: int, core: _Core, cfg: AttentionConfig) -> tuple[list, list]:
    """(initializers, nodes) that compute layer ``i``'s attention in blocks, the last node writing ``core.out``."""
    from onnx import TensorProto, helper, numpy_helper

    n = helper.make_node
    p = f"{P}{i}/"
    groups = cfg.heads // cfg.kv_heads
    body = helper.make_graph([
        n("Mul", [p + "i", P + "brows"], [p + "start"]),
        n("Add", [p + "start", P + "brows"], [p + "end"]),
        n("Min", [p + "end", P + "t"], [p + "kend"]),
        n("Unsqueeze", [p + "start", P + "ax0"], [p + "start1"]),
        n("Unsqueeze", [p + "end", P + "ax0"], [p + "end1"]),
        n("Unsqueeze", [p + "kend", P + "ax0"], [p + "kend1"]),
        n("Slice", [p + "q5", p + "start1", p + "end1", P + "ax3"], [p + "qb"]),  # [B, kv, G, rows, D]
        n("Slice", [p + "k5", P + "zero1", p + "kend1", P + "ax3"], [p + "kb"]),  # [B, kv, 1, K, D]
        n("Slice", [p + "v5", P + "zero1", p + "kend1", P + "ax3"], [p + "vb"]),
        n("Transpose", [p + "kb"], [p + "kbt"], perm=[0, 1, 2, 4, 3]),
        n("MatMul", [p + "qb", p + "kbt"], [p + "qk"]),  # [B, kv, G, rows, K]: keys broadcast over the group
        n(core.scale_op, [p + "qk", p + "scale"], [p + "scores"]),
        n("Range", [p + "start", p + "end", P + "one"], [p + "row"]),
        n("Range", [P + "zero", p + "kend", P + "one"], [p + "col"]),
        n("Unsqueeze", [p + "row", P + "ax1"], [p + "row2"]),
        n("Unsqueeze", [p + "col", P + "ax0"], [p + "col2"]),
        n("Greater", [p + "col2", p + "row2"], [p + "future"]),  # [rows, K]
        n("Slice", [P + "padkeys", P + "zero1", p + "kend1", P + "ax4"], [p + "padk"]),  # [B, 1, 1, 1, K]
        n("Or", [p + "future", p + "padk"], [p + "hidden"]),
        n("Where", [p + "hidden", P + "fmin", p + "scores"], [p + "masked"]),
        n("Softmax", [p + "masked"], [p + "probs"], axis=-1),
        n("MatMul", [p + "probs", p + "vb"], [p + "yb"]),  # [B, kv, G, rows, D]
        n("Identity", [p + "cond"], [p + "cond_out"]),
    ], f"blocked_attention_{i}",
        [helper.make_tensor_value_info(p + "i", TensorProto.INT64, []),
         helper.make_tensor_value_info(p + "cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(p + "cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info(p + "yb", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(core.scale, p + "scale")])
    import numpy as np

    shapes = [numpy_helper.from_array(np.array(v, dtype=np.int64), p + name) for name, v in (
        ("qshape", [0, cfg.kv_heads, groups, -1, cfg.head_dim]), ("oshape", [0, cfg.heads, -1, cfg.head_dim]))]
    return shapes, [
        n("Reshape", [core.q, p + "qshape"], [p + "q5u"], name=p + "q5u"),  # [B, kv, G, T, D]
        n("Pad", [p + "q5u", P + "pads"], [p + "q5"], name=p + "q5"),  # a whole number of blocks
        n("Unsqueeze", [core.k, P + "ax2"], [p + "k5"], name=p + "k5"),  # [B, kv, 1, T, D]
        n("Unsqueeze", [core.v, P + "ax2"], [p + "v5"], name=p + "v5"),
        n("Loop", [P + "blocks", P + "true"], [p + "stacked"], body=body, name=p + "loop"),  # [n, B, kv, G, rows, D]
        n("Transpose", [p + "stacked"], [p + "ordered"], perm=[1, 2, 3, 0, 4, 5], name=p + "ordered"),
        n("Reshape", [p + "ordered", p + "oshape"], [p + "padded_out"], name=p + "padded_out"),  # [B, H, n*rows, D]
        n("Slice", [p + "padded_out", P + "zero1", P + "t1", P + "ax2"], [core.out], name=p + "out"),
    ]


def _reads(node) -> set[str]:
    """What a node reads, its subgraphs' reads from the outer scope included."""
    names = set(node.input)
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            made = {o for m in sub.node for o in m.output} | {i.name for i in sub.input} | \
                {t.name for t in sub.initializer}
            names |= {name for m in sub.node for name in _reads(m) if name not in made}
    return names - {""}


def _prune(graph) -> int:
    """Drop the nodes no graph output needs and the initializers nothing reads; how many nodes went."""
    made_by = {o: i for i, node in enumerate(graph.node) for o in node.output}
    needed, todo = set(), [o.name for o in graph.output]
    keep = set()
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        at = made_by.get(name)
        if at is not None and at not in keep:
            keep.add(at)
            todo.extend(_reads(graph.node[at]))
    kept = [node for i, node in enumerate(graph.node) if i in keep]
    dropped = len(graph.node) - len(kept)
    del graph.node[:]
    graph.node.extend(kept)
    used = set().union(*(_reads(node) for node in kept)) | {o.name for o in graph.output}
    inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    alive = set(made_by) & needed
    infos = [v for v in graph.value_info if v.name in alive]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return dropped


def rewrite(src: Path, dst: Path, cfg: AttentionConfig) -> tuple[int, int, int]:
    """Write ``dst`` (same folder as ``src``): ``src`` with every attention layer in blocks. Returns (layers
    rewritten, its node count, the source's node count)."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)  # weights stay in the source's data file
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    cores = find_cores(graph)
    full_nodes = len(graph.node)
    nodes = list(graph.node)
    for i, core in sorted(enumerate(cores), key=lambda ic: -ic[1].at):  # from the last, so indices hold
        inits, made = _loop(i, core, cfg)
        graph.initializer.extend(inits)
        nodes[core.at:core.at + 1] = made
    nodes[0:0] = _shared(graph, opset)
    del graph.node[:]
    graph.node.extend(nodes)
    _prune(graph)
    if any(n.op_type == "Softmax" for n in graph.node):
        raise CannotBlock("a softmax outside the blocks is left in the graph")
    from layerscope.engines.truncate import save_derived

    save_derived(model, dst)
    return len(cores), len(graph.node), full_nodes
