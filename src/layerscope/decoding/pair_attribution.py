"""Which token pairs make two texts similar: integrated Jacobians (Möller, Nikolaev and Padó 2023).

Let ``g(x)`` be a text's embedding as a function of its states ``x = (x_1..x_S)`` at an attribution point
(the input word embeddings, or the hidden states entering block ``l``), run through the rest of the model
and pooled; for ``cosine`` ``g`` is L2-normalized, for ``dot`` it is the pooled vector itself. Then the
similarity is bilinear in the two embeddings: ``s(a, b) = g(a) . g(b)``.

With a reference ``r`` per text (the same token positions, each content token's embedding replaced by the
baseline's; special tokens kept) and the straight path ``x(alpha) = r + alpha (x - r)``, the fundamental
theorem of calculus gives ``g(x) - g(r) = sum_i U[:, i]`` with

    U[:, i] = integral_0^1 J_i(x(alpha)) (x_i - r_i) d alpha     (J_i: the Jacobian of g w.r.t. token i)

one column per token, each a vector in embedding space. Multiplying the two texts' sums:

    A[i, j] = U_a[:, i] . U_b[:, j]
    sum_ij A = (g(a) - g(r_a)) . (g(b) - g(r_b)) = s(a, b) - [s(r_a, b) + s(a, r_b) - s(r_a, r_b)]

so the matrix sums to the similarity minus the reference terms in brackets (``reference_similarity``):
exact in the limit, and a Riemann midpoint sum over ``steps`` points here (the gap is the completeness
error). ``U`` is computed in forward mode: one Jacobian-vector product per token and step (the tangent
is ``x_i - r_i`` at token ``i``, zero elsewhere), so the cost grows with the tokens, not the embedding size.

At a hidden layer ``l`` the reference's states are the reference input's own states at ``l``; the states
are swapped in by a forward pre-hook on block ``l``, so every later block runs as in the model. ``l = L``
(the last layer) attributes at the pooled states themselves.

The one-sided sums ``A.sum(1)`` equal integrated gradients of ``a -> g(a) . V_b`` (``V_b = sum_j U_b[:, j]``,
which is ``g(b) - g(r_b)`` up to the b side's completeness error) with the same baseline and points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from layerscope.errors import InputError

BASELINES = {
    "pad": "every content token's input embedding replaced by the pad token's (special tokens kept)",
    "zero": "every content token's input embedding set to zero (special tokens kept; positions still added)",
    "mask": "every content token's input embedding replaced by the mask token's (else unk; special tokens kept)",
}
SIMILARITIES = ("cosine", "dot")
RAW = "raw"  # the attribution point at the input word embeddings


def baseline_token(tokenizer, baseline: str) -> int | None:
    """The token id whose embedding replaces content tokens (None for ``zero``); one line when there is none."""
    if baseline == "zero":
        return None
    names = ("pad_token",) if baseline == "pad" else ("mask_token", "unk_token")
    for name in names:
        tok = getattr(tokenizer, name, None)
        if tok is not None:
            return int(tokenizer.convert_tokens_to_ids(tok))
    raise InputError(f"--baseline {baseline}: this tokenizer has no {' or '.join(n[:-6] for n in names)} token; "
                     "use --baseline zero")


def find_blocks(base, num_layers: int):
    """The model's block list: the outermost ``ModuleList`` of ``num_layers`` modules."""
    import torch

    lists = [(name, m) for name, m in base.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) == num_layers]
    if not lists:
        raise InputError(f"found no list of {num_layers} blocks in {type(base).__name__} to attribute at a layer; "
                         "use --layers raw")
    return min(lists, key=lambda item: item[0].count("."))[1]


@dataclass
class PairEncoder:
    """A loaded base model seen as ``g``: states at the attribution point -> (normalized) pooled embedding."""

    base: Any
    num_layers: int
    pooling: str
    similarity: str = "cosine"
    special_ids: frozenset = frozenset()
    baseline_id: int | None = None  # None: the zero baseline
    chunk: int = 64  # sequences per forward pass

    def __post_init__(self):
        if self.similarity not in SIMILARITIES:
            raise InputError(f"--similarity must be one of {', '.join(SIMILARITIES)}, not {self.similarity!r}")
        self.word_embeddings = self.base.get_input_embeddings()
        self._blocks = None

    @property
    def blocks(self):
        if self._blocks is None:
            self._blocks = find_blocks(self.base, self.num_layers)
        return self._blocks

    # ---------------------------------------------------------------- the function g
    def _finish(self, states, mask):
        import torch

        from layerscope.decoding.saliency import objective_pooling

        v = objective_pooling(states, mask, self.pooling)
        return torch.nn.functional.normalize(v, dim=-1) if self.similarity == "cosine" else v

    def _feed(self, inputs: dict[str, Any], n: int) -> dict[str, Any]:
        return {k: v.expand(n, -1) for k, v in inputs.items() if k != "input_ids"}

    def embed(self, inputs: dict[str, Any], layer: str, states):
        """``g`` of ``states`` ``[N, S, H]`` placed at ``layer`` (``raw`` or ``0``..``L``) of one text."""
        n = states.shape[0]
        feed = self._feed(inputs, n)
        mask = feed["attention_mask"]
        if layer == RAW:
            out = self.base(inputs_embeds=states, **feed, return_dict=True)
            return self._finish(out.last_hidden_state, mask)
        index = int(layer)
        if index == self.num_layers:
            return self._finish(states, mask)

        def swap(module, args, kwargs):
            if args:
                return (states, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": states}

        hook = self.blocks[index].register_forward_pre_hook(swap, with_kwargs=True)
        try:
            ids = inputs["input_ids"].expand(n, -1)
            out = self.base(input_ids=ids, **feed, return_dict=True)
        finally:
            hook.remove()
        return self._finish(out.last_hidden_state, mask)

    # ---------------------------------------------------------------- the two ends of the path
    def reference_embeddings(self, input_ids):
        """The baseline input: special tokens as they are, content tokens replaced (``[1, S, H]``)."""
        import torch

        e = self.word_embeddings(input_ids).detach()
        content = torch.tensor([int(t) not in self.special_ids for t in input_ids[0].tolist()])
        if self.baseline_id is None:
            fill = torch.zeros_like(e[0, 0])
        else:
            fill = self.word_embeddings(torch.tensor([self.baseline_id]))[0].detach()
        r = e.clone()
        r[0, content] = fill
        return r

    def ends(self, inputs: dict[str, Any], layer: str):
        """The text's states ``x`` and its reference's ``r`` at ``layer`` (``[S, H]`` each), no grad."""
        import torch

        ids = inputs["input_ids"]
        with torch.no_grad():
            x_raw = self.word_embeddings(ids).detach()
            r_raw = self.reference_embeddings(ids)
            if layer == RAW:
                return x_raw[0], r_raw[0]
            both = self.base(inputs_embeds=torch.cat([x_raw, r_raw]), **self._feed(inputs, 2),
                             output_hidden_states=True, return_dict=True)
            h = both.hidden_states[int(layer)]
            return h[0].clone(), h[1].clone()


def midpoints(steps: int):
    """The Riemann midpoint rule's points on [0, 1] (captum's ``riemann_middle``), each weighted 1/steps."""
    if steps < 1:
        raise InputError(f"--steps must be at least 1, not {steps}")
    return (np.arange(steps, dtype=np.float64) + 0.5) / steps


def _jvp(enc: PairEncoder, inputs, layer: str, primal, tangent):
    """``J_g(primal) tangent`` per row, in forward mode (``[N, D]``)."""
    import torch
    import torch.autograd.forward_ad as fwad

    with torch.no_grad(), fwad.dual_level():
        dual = fwad.make_dual(primal, tangent)
        out = enc.embed(inputs, layer, dual)
        tan = fwad.unpack_dual(out).tangent
    if tan is None:  # g does not depend on these states at all
        return torch.zeros(primal.shape[0], out.shape[-1], dtype=primal.dtype)
    return tan


def integrated_jacobian(enc: PairEncoder, inputs: dict[str, Any], layer: str, x, r, steps: int):
    """``U`` ``[D, S]`` (float64): column ``i`` is the path integral of ``J_i (x_i - r_i)`` (midpoint rule).
    Tokens whose states equal the reference's get a zero column without a pass."""
    import torch

    alphas = torch.tensor(midpoints(steps), dtype=x.dtype)
    delta = x - r
    moved = [i for i in range(x.shape[0]) if bool(delta[i].abs().max() > 0)]
    rows = [(a, i) for a in range(steps) for i in moved]
    total: dict[int, Any] = {}
    for start in range(0, len(rows), enc.chunk):
        part = rows[start:start + enc.chunk]
        al = alphas[[a for a, _ in part]].view(-1, 1, 1)
        primal = r.unsqueeze(0) + al * delta.unsqueeze(0)
        tangent = torch.zeros_like(primal)
        for k, (_, i) in enumerate(part):
            tangent[k, i] = delta[i]
        tan = _jvp(enc, inputs, layer, primal, tangent).double()
        for k, (_, i) in enumerate(part):
            total[i] = total.get(i, 0) + tan[k]
    dim = int(enc.embed(inputs, layer, x.unsqueeze(0)).shape[-1]) if not total else int(next(iter(total.values())).shape[0])
    u = np.zeros((dim, x.shape[0]), dtype=np.float64)
    for i, vec in total.items():
        u[:, i] = vec.numpy() / steps
    return u


def path_integral(enc: PairEncoder, inputs: dict[str, Any], layer: str, x, r, steps: int) -> np.ndarray:
    """``sum_i U[:, i]`` at ``steps`` points with one JVP per point (the whole difference as the tangent):
    what the matrix's sum is built from, at a fraction of its cost (the completeness curve)."""
    import torch

    alphas = torch.tensor(midpoints(steps), dtype=x.dtype)
    delta = x - r
    total = None
    for start in range(0, steps, enc.chunk):
        al = alphas[start:start + enc.chunk].view(-1, 1, 1)
        primal = r.unsqueeze(0) + al * delta.unsqueeze(0)
        tan = _jvp(enc, inputs, layer, primal, delta.unsqueeze(0).expand_as(primal).clone()).double().sum(0)
        total = tan if total is None else total + tan
    return (total / steps).numpy()


@dataclass(frozen=True)
class PairResult:
    """One pair's token x token attribution and its completeness check."""

    matrix: np.ndarray  # [S_a, S_b] float64
    similarity: float  # s(a, b)
    reference_similarity: float  # s(r_a, b) + s(a, r_b) - s(r_a, r_b)
    layer: str
    steps: int

    @property
    def target(self) -> float:
        """What the matrix should sum to: the similarity minus the reference terms."""
        return self.similarity - self.reference_similarity

    @property
    def total(self) -> float:
        return float(self.matrix.sum())

    @property
    def error(self) -> float:
        return abs(self.total - self.target)

    @property
    def relative_error(self) -> float | None:
        return None if self.target == 0 else self.error / abs(self.target)

    @property
    def rows(self) -> np.ndarray:
        """Text a's one-sided token attributions (each token's pairs summed over text b)."""
        return self.matrix.sum(1)

    @property
    def cols(self) -> np.ndarray:
        return self.matrix.sum(0)


def similarities(enc: PairEncoder, a: dict[str, Any], b: dict[str, Any], layer: str, ends_a, ends_b) -> tuple[float, float]:
    """``s(a, b)`` and the reference terms ``s(r_a, b) + s(a, r_b) - s(r_a, r_b)``, run at ``layer``."""
    import torch

    with torch.no_grad():
        ga = enc.embed(a, layer, torch.stack(ends_a)).double()  # rows: x, r
        gb = enc.embed(b, layer, torch.stack(ends_b)).double()
    s = ga @ gb.t()
    return float(s[0, 0]), float(s[1, 0] + s[0, 1] - s[1, 1])


def attribute_pair(enc: PairEncoder, a: dict[str, Any], b: dict[str, Any], layer: str, steps: int) -> PairResult:
    """The attribution matrix of one pair (``a``, ``b``: tokenized batches of one, no padding)."""
    ends_a, ends_b = enc.ends(a, layer), enc.ends(b, layer)
    u_a = integrated_jacobian(enc, a, layer, *ends_a, steps)
    u_b = integrated_jacobian(enc, b, layer, *ends_b, steps)
    s, ref = similarities(enc, a, b, layer, ends_a, ends_b)
    return PairResult(u_a.T @ u_b, s, ref, layer, steps)


def completeness_curve(enc: PairEncoder, a: dict[str, Any], b: dict[str, Any], layer: str,
                       steps: list[int]) -> list[dict[str, float]]:
    """The completeness error of the matrix at each number of steps (its sum needs one JVP per point)."""
    ends_a, ends_b = enc.ends(a, layer), enc.ends(b, layer)
    s, ref = similarities(enc, a, b, layer, ends_a, ends_b)
    target = s - ref
    rows = []
    for n in steps:
        total = float(path_integral(enc, a, layer, *ends_a, n) @ path_integral(enc, b, layer, *ends_b, n))
        err = abs(total - target)
        rows.append({"steps": int(n), "sum": total, "target": target, "error": err,
                     "relative_error": None if target == 0 else err / abs(target)})
    return rows
