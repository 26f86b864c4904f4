"""Pooling: every pooling name, and each pooling defined once, rendered in numpy, torch and ONNX.

A pooling turns token states ``[..., batch, seq, hidden]`` (any leading layer axes) and the
attention mask ``[batch, seq]`` (1 for real tokens, right or left padding) into one vector per
text, ``[..., batch, hidden]``.  Every pooling but ``max`` is a weighted sum over positions;
``_define`` below says, once per pooling, how its weights are made from a few operations
(the mask, the first / last / EOS position, a one-hot row, a normalization).  Three renderings
provide those operations side by side:

* ``pool``: numpy, float64 arithmetic, float32 out: the reference the engines pool with;
* ``pool_torch``: torch, differentiable (saliency objectives, the bench's plain Hugging Face loop);
* ``OnnxPooling``: nodes appended to an exported graph (``pooled.<mode>`` outputs, export/graph.py).

``tests/test_vocab_pooling_parity.py`` runs every pooling through all three on the same inputs.
``st`` is not a rendering of its own: it is the checkpoint's sentence-transformers recipe (one of
the poolings above, L2-normalized or not), applied by ``with_st``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

from layerscope.errors import InputError, unknown_name

ST = "st"  # the model's own sentence-transformers embedding (the recipe is read by layerscope/model/stconfig.py)
EOS = "eos"  # the position the model's own pooler reads (CLIP): needs the input ids
POOLINGS = ("mean", "cls", "last", "max", EOS, "mean-nobos", ST)  # every pooling name, the only list
GRAPH_POOLINGS = tuple(p for p in POOLINGS if p != ST)  # those with a rendering (in the graph too)
MASK_POOLINGS = tuple(p for p in GRAPH_POOLINGS if p != EOS)  # those that need only the states and mask


def check_poolings(poolings, *, available=POOLINGS) -> list[str]:
    out = []
    for p in poolings:
        p = p.strip()
        if p not in available:
            raise unknown_name("pooling", p, available)
        if p not in out:
            out.append(p)
    if not out:
        raise InputError("no pooling given; choose from " + ", ".join(available))
    return out


def require_pooled_output(poolings, has_pooled_output, family: str) -> None:
    """One line when ``poolings`` asks for 'eos' of a model without its own pooled output (only CLIP has one)."""
    if EOS in poolings and not has_pooled_output:
        raise InputError(f"pooling 'eos' needs a model with its own pooled output (CLIP); {family} has none: "
                         "use 'last' or 'mean'")


# ---------------------------------------------------------------- each pooling, once

def _define(mode: str, ops):
    """The pooled vector of ``mode`` in the operations of one rendering (``ops``)."""
    if mode == "max":  # per feature, the largest value over the real tokens
        return ops.masked_max()
    if mode == "mean":  # every real token, equally
        weights = ops.normalized(ops.mask())
    elif mode == "cls":  # the first real token, whichever side the padding is on
        weights = ops.onehot(ops.first())
    elif mode == "last":  # the last real token
        weights = ops.onehot(ops.last())
    elif mode == "mean-nobos":  # every real token after the first, equally; a one-token text: zeros
        weights = ops.normalized(ops.without(ops.mask(), ops.onehot(ops.first())))
    elif mode == EOS:  # the model's own pooling position: the first EOS token, or the highest id (old CLIP)
        weights = ops.onehot(ops.eos())
    else:
        raise InputError(f"pooling '{mode}' has no rendering; choose from {', '.join(GRAPH_POOLINGS)}")
    return ops.weighted(weights)


def _eos_by_argmax(eos_token_id: int | None) -> bool:
    # Old CLIP configs say eos_token_id=2 and pool at the highest token id (the EOS of its vocab).
    return eos_token_id is None or eos_token_id == 2


def _need_ids(input_ids):
    if input_ids is None:
        raise InputError("pooling 'eos' needs the input ids")
    return input_ids


# ---------------------------------------------------------------- numpy

class _Numpy:
    def __init__(self, states, mask, input_ids, eos_token_id):
        import numpy as np

        self.np, self.states, self.input_ids, self.eos_token_id = np, np.asarray(states), input_ids, eos_token_id
        self.valid = np.asarray(mask) > 0

    def mask(self):
        return self.valid.astype(self.np.float64)

    def first(self):
        return self.np.argmax(self.valid, axis=1)

    def last(self):
        return self.valid.shape[1] - 1 - self.np.argmax(self.valid[:, ::-1], axis=1)

    def eos(self):
        ids = self.np.asarray(_need_ids(self.input_ids))
        return self.np.argmax(ids if _eos_by_argmax(self.eos_token_id) else ids == self.eos_token_id, axis=1)

    def onehot(self, index):
        return (self.np.arange(self.valid.shape[1])[None, :] == index[:, None]).astype(self.np.float64)

    def without(self, weights, onehot):
        return weights * (1.0 - onehot)

    def normalized(self, weights):
        return weights / self.np.maximum(weights.sum(1, keepdims=True), 1.0)

    def weighted(self, weights):
        return self.np.einsum("...bsh,bs->...bh", self.states.astype(self.np.float64), weights).astype(self.np.float32)

    def masked_max(self):
        filled = self.np.where(self.valid[..., None], self.states, -self.np.inf)
        return filled.max(axis=-2).astype(self.np.float32)


def pool(states, mask, mode: str, *, input_ids=None, eos_token_id: int | None = None):
    """numpy: pool ``[..., batch, seq, hidden]`` into ``[..., batch, hidden]`` (float32)."""
    return _define(mode, _Numpy(states, mask, input_ids, eos_token_id))


# ---------------------------------------------------------------- torch

class _Torch:
    def __init__(self, states, mask, input_ids, eos_token_id):
        import torch

        self.torch, self.states, self.input_ids, self.eos_token_id = torch, states, input_ids, eos_token_id
        self.valid = mask.to(states.device) > 0
        self.positions = torch.arange(mask.shape[1], device=states.device)

    def mask(self):
        return self.valid.to(self.states.dtype)

    def first(self):
        return self.valid.float().argmax(1)

    def last(self):  # the highest position whose mask is 1: argmax of mask * (position + 1)
        return (self.valid.float() * (self.positions + 1)[None, :]).argmax(1)

    def eos(self):
        ids = _need_ids(self.input_ids).to(self.states.device)
        return (ids if _eos_by_argmax(self.eos_token_id) else (ids == self.eos_token_id).int()).argmax(1)

    def onehot(self, index):
        return (self.positions[None, :] == index[:, None]).to(self.states.dtype)

    def without(self, weights, onehot):
        return weights * (1.0 - onehot)

    def normalized(self, weights):
        return weights / weights.sum(1, keepdim=True).clamp(min=1.0)

    def weighted(self, weights):
        return self.torch.einsum("...bsh,bs->...bh", self.states, weights)

    def masked_max(self):
        return self.states.masked_fill(~self.valid[..., None], float("-inf")).max(-2).values


def pool_torch(states, mask, mode: str, *, input_ids=None, eos_token_id: int | None = None):
    """torch: pool ``[..., batch, seq, hidden]`` into ``[..., batch, hidden]``, differentiable in ``states``."""
    return _define(mode, _Torch(states, mask, input_ids, eos_token_id))


# ---------------------------------------------------------------- ONNX (in the graph)

class OnnxBuilder:
    """Appends nodes and constants to an ONNX graph under one name prefix, each name unique."""

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

    def const(self, value, hint: str, dtype: str = "int64") -> str:
        import numpy as np
        from onnx import numpy_helper

        name = self.name(hint)
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name


class OnnxPooling:
    """The in-graph rendering over ``stacked`` (a ``[layers, batch, seq, hidden]`` float tensor of the
    graph): ``render(mode)`` appends the nodes of one pooling and returns its ``[layers, batch, hidden]``
    tensor.  Reads the graph inputs ``attention_mask`` (and ``input_ids`` for eos)."""

    def __init__(self, builder: OnnxBuilder, stacked: str, *, opset: int, eos_token_id: int | None = None,
                 mask: str = "attention_mask", input_ids: str = "input_ids"):
        self.b, self.stacked, self.opset, self.eos_token_id = builder, stacked, opset, eos_token_id
        self.mask_input, self.ids_input = mask, input_ids
        self.hint = "pool"
        self._shared: dict[str, str] = {}

    def render(self, mode: str) -> str:
        self.hint = mode.replace("-", "_")
        return _define(mode, self)

    def _once(self, key: str, make: Callable[[], str]) -> str:
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def _axes(self, axis: int) -> str:
        return self._once(f"axes{axis}", lambda: self.b.const([axis], f"axes{axis}"))

    def _const(self, key: str, value, dtype: str) -> str:
        return self._once(key, lambda: self.b.const(value, key, dtype))

    def _positions_row(self) -> str:  # [1, S]: 0..S-1
        def make():
            one_i = self._const("one_i", 1, "int64")
            seq_len = self.b.node("Gather", [self.b.node("Shape", [self.mask_input]), one_i], "seq_len", axis=0)
            positions = self.b.node("Range", [self._const("zero_i", 0, "int64"), seq_len, one_i], "positions")
            return self.b.node("Unsqueeze", [positions, self._axes(0)], "positions_row")
        return self._once("positions_row", make)

    def _float(self, tensor: str, hint: str) -> str:
        import onnx

        return self.b.node("Cast", [tensor], hint, to=onnx.TensorProto.FLOAT)

    def mask(self):  # [B, S] float
        return self._once("maskf", lambda: self._float(self.mask_input, "maskf"))

    def first(self):
        return self.b.node("ArgMax", [self.mask()], f"{self.hint}_first_idx", axis=1, keepdims=0)

    def last(self):  # the highest position whose mask is 1: argmax of mask * (position + 1)
        # in integers: a runtime computing float ops in bf16 (OpenVINO on AVX512_BF16) rounds positions above
        # 256, so a float argmax picks an earlier token of a long text
        import onnx

        pos1 = self.b.node("Add", [self._positions_row(), self._const("one_i", 1, "int64")], "pos1")
        weighted = self.b.node("Mul", [self.mask_input, pos1], f"{self.hint}_last_pos")
        return self.b.node("ArgMax", [self.b.node("Cast", [weighted], f"{self.hint}_last_pos32",
                                                  to=onnx.TensorProto.INT32)],
                           f"{self.hint}_last_idx", axis=1, keepdims=0)

    def eos(self):
        import onnx

        if _eos_by_argmax(self.eos_token_id):
            return self.b.node("ArgMax", [self.ids_input], "eos_idx", axis=1, keepdims=0)
        hit = self.b.node("Equal", [self.ids_input, self.b.const(self.eos_token_id, "eos_id")], "eos_hit")
        return self.b.node("ArgMax", [self.b.node("Cast", [hit], "eos_hit_i", to=onnx.TensorProto.INT32)],
                           "eos_idx", axis=1, keepdims=0)

    def onehot(self, index):  # index [B] -> float [B, S]
        eq = self.b.node("Equal", [self._positions_row(), self.b.node("Unsqueeze", [index, self._axes(1)])],
                         f"{self.hint}_onehot")
        return self._float(eq, f"{self.hint}_onehot_f")

    def without(self, weights, onehot):
        rest = self.b.node("Sub", [self._const("one", 1.0, "float32"), onehot], f"{self.hint}_not")
        return self.b.node("Mul", [weights, rest], f"{self.hint}_keep")

    def normalized(self, weights):
        total = self.b.node("ReduceSum", [weights, self._axes(1)], f"{self.hint}_sum", keepdims=1)
        return self.b.node("Div", [weights, self.b.node("Max", [total, self._const("one", 1.0, "float32")])],
                           f"{self.hint}_w")

    def weighted(self, weights):  # weights [B, S] -> [L, B, H]
        w = self.b.node("Unsqueeze", [weights, self._axes(1)], f"{self.hint}_w3")  # [B, 1, S]
        w = self.b.node("Unsqueeze", [w, self._axes(0)], f"{self.hint}_w4")  # [1, B, 1, S]
        pooled = self.b.node("MatMul", [w, self.stacked], f"{self.hint}_matmul")  # [L, B, 1, H]
        return self.b.node("Squeeze", [pooled, self._axes(2)], f"{self.hint}_out")

    def masked_max(self):
        import onnx

        valid = self.b.node("Cast", [self.b.node("Unsqueeze", [self.b.node("Unsqueeze", [self.mask_input, self._axes(0)]),
                                                                self._axes(3)])],
                            "max_valid", to=onnx.TensorProto.BOOL)  # [1, B, S, 1]
        filled = self.b.node("Where", [valid, self.stacked, self._const("neg_inf", -float("inf"), "float32")],
                             "max_filled")
        if self.opset >= 18:
            return self.b.node("ReduceMax", [filled, self._axes(2)], "max_out", keepdims=0)
        return self.b.node("ReduceMax", [filled], "max_out", axes=[2], keepdims=0)


# ---------------------------------------------------------------- st and defaults

def with_st(poolings: list[str], compute: Callable[[list[str]], Mapping[str, Any]],
            recipe: Mapping[str, Any] | None = None, *, own_row: int | None = None) -> dict[str, Any]:
    """Run ``compute(poolings)`` with ``st`` replaced by ``recipe["pooling"]`` (L2-normalized when
    ``recipe["normalize"]``, as sentence-transformers' Normalize module does); other poolings pass
    through.  ``recipe`` is the checkpoint's sentence-transformers recipe (layerscope/model/stconfig.py).

    ``own_row``: ``compute`` runs one layer more than asked, last, the model's own last hidden state
    (``stconfig.st_layers``): ``st``'s row ``own_row`` (layer L) is read from it, as sentence-transformers
    reads it, and that extra row is dropped from every pooling."""
    if ST not in poolings:
        return dict(compute(poolings))
    if not recipe:
        raise InputError("pooling 'st' needs the checkpoint's sentence-transformers recipe")
    import numpy as np

    base = recipe["pooling"]
    needed = [p for p in poolings if p != ST]
    if base not in needed:
        needed.append(base)
    got = dict(compute(needed))
    own = None
    if own_row is not None:
        own = got[base][-1]
        got = {p: v[:-1] for p, v in got.items()}
    vec = got[base].copy()
    if own is not None:
        vec[own_row] = own
    if recipe["normalize"]:
        norm = np.linalg.norm(vec.astype(np.float64), axis=-1, keepdims=True)
        vec = (vec / np.maximum(norm, 1e-12)).astype(np.float32)
    got[ST] = vec
    return {p: got[p] for p in poolings}


class PoolingFacts(Protocol):
    """What :func:`family_poolings` reads of a model (a ``Manifest`` has it; this floor cannot import one)."""

    default_pooling: str
    kind: str
    pooled_output: str | None


def family_poolings(manifest: PoolingFacts, analysis_defaults) -> list[str]:
    """The poolings an analysis compares when none are asked for, from the model's family: a decoder's
    first token is just the first word, so decoders get ``last`` (their own) and ``mean``; CLIP gets ``eos``
    (its own pooled output); every other family the analysis's defaults (``mean``, ``cls``)."""
    own = manifest.default_pooling
    if manifest.kind == "decoder" or own == "last":
        return [own, "mean"] if own != "mean" else ["mean", "last"]
    if own == EOS and manifest.pooled_output:
        return [EOS]
    return list(analysis_defaults)


def default_poolings(manifest: Any) -> list[str]:
    """``st`` for a sentence-transformers checkpoint layerscope can reproduce, else the family default
    (``manifest``: the typed Manifest of model/manifest_type.py, read by its attributes)."""
    st = manifest.sentence_transformers or {}
    return [ST] if st.get("supported") else [manifest.default_pooling]
