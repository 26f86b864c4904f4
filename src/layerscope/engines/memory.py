"""What one long text costs an engine in memory, checked against what the machine has before a run starts.

A text longer than the batch's token budget runs in a batch of its own (extraction/batching.py), so a run's
peak is set by its longest text. For that text of ``T`` tokens (batch of one, fp32) an engine holds at
least:

- the attention scores and their softmax of one layer, ``2 * heads * T * T`` floats, where attention is
  computed whole (the exported graphs and the fp32 PyTorch reference, both eager attention); an engine
  that computes attention in slices (PyTorch's scaled-dot-product attention in ``torch-fp16`` /
  ``torch-bf16``, and in ``torch`` with ``attention=sdpa`` or a max_seq above ``engines/torch.SLICE_FROM``)
  sets ``Engine.attention_scores`` False and is charged nothing for it; an engine that computes it over
  blocks of query rows (``ort``/``ov`` with ``attention=blocked``, engines/blocked.py) says how many rows in
  ``attention_rows`` and is charged ``2 * heads * T * rows`` floats, linear in ``T``;
- the hidden states, ``(depth + 2) * T * hidden`` floats (raw embeddings and layers ``0..depth``) where they
  are all alive at once (token states fetched, or a graph handing every hidden state back); or one layer's,
  ``T * hidden``, in a pooled run that pools each layer as the model makes it: the PyTorch engines' hooks
  (``EngineSpec.pools_as_made``, engines/torch_pooled.py) and the ONNX engines' pooled-only graphs, whose
  pooling nodes run right after each layer (engines/layer_pooling.py), a run fetching no token states;
- one block's feed-forward activations, ``4 * T * hidden`` floats.

This is a floor, not a forecast: an engine's own buffers come on top. A run whose floor is above the memory
available now is refused in one line naming the longest text's tokens and the ``--max-length`` that fits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layerscope.engines.registry import EngineChoice

FLOAT = 4  # bytes: activations are fp32 in every engine that materializes them


@dataclass(frozen=True)
class TextCost:
    """The floor of one text's activations in an engine (``bytes``), and what it is made of."""

    tokens: int
    attention: int
    states: int
    feed_forward: int

    @property
    def bytes(self) -> int:
        return self.attention + self.states + self.feed_forward


def attention_heads(model_dir: Path | None, hidden_size: int) -> int:
    """The text model's attention heads from its config.json (``hidden_size // 64`` where none is stated)."""
    cfg: dict = {}
    if model_dir is not None:
        try:
            cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = {}
    for part in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for key in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads"):
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return max(1, hidden_size // 64)


def text_cost(tokens: int, *, hidden_size: int, heads: int, depth: int, layer_at_a_time: bool,
              attention_scores: bool = True, attention_rows: int | None = None) -> TextCost:
    """The activation floor of one text of ``tokens`` tokens (see the module's docstring; ``layer_at_a_time``:
    one layer's states alive at once, else every layer's up to ``depth`` and the raw embeddings)."""
    t = int(tokens)
    rows = t if attention_rows is None else min(t, int(attention_rows))
    attention = 2 * heads * t * rows * FLOAT if attention_scores else 0
    states = (1 if layer_at_a_time else depth + 2) * t * hidden_size * FLOAT
    return TextCost(t, attention, states, 4 * t * hidden_size * FLOAT)


def available_bytes() -> int | None:
    """Memory this process can still take: MemAvailable, or the cgroup's limit less its use where lower."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def longest_that_fits(budget: int, **cost_args) -> int:
    """The most tokens whose ``text_cost`` stays within ``budget`` bytes (0 if not even one does)."""
    lo, hi = 0, 1
    while text_cost(hi, **cost_args).bytes <= budget and hi < 1 << 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if text_cost(mid, **cost_args).bytes <= budget:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class CostShape:
    """What a text's activation floor depends on in one engine: the model's width and heads, the depth run,
    whether one layer's states are alive at a time, whether attention is computed whole."""

    engine: str
    hidden_size: int
    heads: int
    depth: int
    layer_at_a_time: bool
    attention_scores: bool
    attention_rows: int | None = None  # query rows whose scores are held at once (None: every row)

    def args(self) -> dict:
        return dict(hidden_size=self.hidden_size, heads=self.heads, depth=self.depth,
                    layer_at_a_time=self.layer_at_a_time, attention_scores=self.attention_scores,
                    attention_rows=self.attention_rows)

    def cost(self, tokens: int) -> TextCost:
        return text_cost(max(1, int(tokens)), **self.args())


def shape_of(eng, *, tokens: bool = False) -> CostShape:
    """The cost shape of a started engine (what it pruned, pools as made and slices, as it says) in a run that
    fetches token states (``tokens``) or pooled vectors alone."""
    manifest = eng.manifest
    depth = eng.depth if getattr(eng, "depth", None) is not None else manifest.num_layers
    return CostShape(eng.name, int(manifest.hidden_size), attention_heads(_model_dir(eng.model), manifest.hidden_size),
                     int(depth), not tokens and bool(getattr(eng, "pools_as_made", False) or
                                                     getattr(eng, "pooled_only", False)),
                     bool(getattr(eng, "attention_scores", True)), getattr(eng, "attention_rows", None))


def shape_planned(handle, choice: EngineChoice, *, depth: int, tokens: bool, max_seq: int | None) -> CostShape:
    """The cost shape of the engine ``choice`` (its declaration and the options the run passes) on ``handle``
    before it starts (an executor whose engines start later or elsewhere), in a run that fetches token states
    (``tokens``) or pooled vectors alone: the depth hint and the declared ``pools_as_made`` taken as granted,
    attention charged unless an engine that declares its own precision (the PyTorch engines) slices it by its
    rule (engines/torch.py ``pick_attention``, with the run's ``attention`` option); ``auto`` is charged as the
    ONNX engines it picks first. A floor, like ``text_cost``."""
    manifest = handle.manifest
    scores = True
    precision = choice.spec.precision
    if precision is not None:
        from layerscope.engines.torch import pick_attention

        scores = pick_attention(dict(choice.options).get("attention"), precision, max_seq, lambda: True) == "eager"
    depth = manifest.num_layers if depth is None else min(int(depth), int(manifest.num_layers))
    return CostShape(choice.name, int(manifest.hidden_size), attention_heads(_model_dir(handle), manifest.hidden_size),
                     depth, not tokens and choice.spec.pools_as_made, scores)


def fits(shape: CostShape, tokens: int, *, available: int | None = None, workers: int = 1) -> bool:
    """Whether ``workers`` engines of ``shape``, each on a text of ``tokens`` tokens, fit in ``available``
    bytes (default: the memory available now; unknown memory fits)."""
    free = available_bytes() if available is None else available
    return free is None or workers * shape.cost(tokens).bytes <= free


def check_fits(shape: CostShape, longest: int, *, available: int | None = None, workers: int = 1) -> TextCost:
    """Refuse, in one line and before any batch runs, a run whose longest text (``longest`` tokens, already
    capped by the max length) cannot fit in the memory available, shared by ``workers`` engines each running
    one such text at once; returns the text's cost floor."""
    from layerscope.errors import InputError

    cost = shape.cost(longest)
    free = available_bytes() if available is None else available
    workers = max(1, int(workers))
    if free is not None and workers * cost.bytes > free:
        each = free // workers
        fitting = longest_that_fits(each, **shape.args())
        share = f" for each of {workers} workers" if workers > 1 else ""
        raise InputError(
            f"the longest text has {cost.tokens:,} tokens, and one text that long needs at least "
            f"{_gib(cost.bytes)} of activations in engine '{shape.engine}' (attention {_gib(cost.attention)}, "
            f"hidden states {_gib(cost.states)}) while {_gib(each)} of memory is available{share}: cut texts "
            f"with --max-length {max(1, fitting):,} or less, or free memory")
    return cost


def check_longest_text(eng, longest: int, *, tokens: bool = False, available: int | None = None) -> TextCost:
    """``check_fits`` for a started engine (the in-process extraction and ``iter_pooled``; ``tokens``: the run
    fetches token states)."""
    return check_fits(shape_of(eng, tokens=tokens), longest, available=available)


def _model_dir(handle) -> Path | None:
    return getattr(handle, "export_dir", None) if handle.is_export else _source_dir(handle)


def _source_dir(handle) -> Path | None:
    try:
        source = handle.source()
    except Exception:  # a handle without a local source: the heads are estimated
        return None
    path = Path(source.path_or_id)
    return path if source.is_local and path.is_dir() else None


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:,.2f} GiB" if n >= 2 ** 27 else f"{n / 2 ** 20:,.0f} MiB"

