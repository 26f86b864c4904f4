"""What one long text costs an engine in memory, checked against what the machine has before a run starts.

A text longer than the batch's token budget runs in a batch of its own (extraction/batching.py), so a run's
peak is set by its longest text. For that text of ``T`` tokens (batch of one, fp32) an engine holds at
least:

- the attention scores and their softmax of one layer, ``2 * heads * T * T`` floats, where attention is
  computed whole (the exported graphs and the fp32 PyTorch reference, both eager attention); an engine
  that computes attention in slices (PyTorch's scaled-dot-product attention in ``torch-fp16`` /
  ``torch-bf16``, and in ``torch`` with ``attention=sdpa`` or a max_seq above ``engines/torch.SLICE_FROM``)
  sets ``Engine.attention_scores`` False and is charged nothing for it; an engine that computes it over
  blocks of query rows (``ort``/``ov``, engines/blocked.py) says how many rows in ``attention_rows`` and is
  charged ``2 * heads * T * rows`` floats, linear in ``T``, for a text longer than its ``blocks_above``
  tokens (0 with ``attention=blocked``; under ``auto`` it moves to blocks at the first batch past
  ``SLICE_FROM`` tokens, so a text up to that length is charged its whole square);
- the hidden states, ``(depth + 2) * T * hidden`` floats (raw embeddings and layers ``0..depth``) where they
  are all alive at once (token states fetched, or a graph handing every hidden state back); or one layer's,
  ``T * hidden``, in a pooled run that pools each layer as the model makes it: the PyTorch engines' hooks
  (``EngineSpec.pools_as_made``, engines/torch_pooled.py) and the ONNX engines' pooled-only graphs, whose
  pooling nodes run right after each layer (engines/layer_pooling.py), a run fetching no token states;
- one block's feed-forward activations, ``4 * T * hidden`` floats.

This is a floor, not a forecast: an engine's own buffers come on top. A run is charged the costliest text it
may hold up to its longest (the longest itself, or where attention runs whole up to a length and in blocks past
it, a text of that length); a run whose charge is above the memory available now is refused in one line naming
the longest text's tokens and the ``--max-length`` that fits.
"""

from __future__ import annotations

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
        from layerscope.jsonfile import read_json_dict

        cfg = read_json_dict(Path(model_dir) / "config.json")  # bounded; {} for a damaged or odd one
    for part in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for key in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads"):
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return max(1, hidden_size // 64)


def text_cost(tokens: int, *, hidden_size: int, heads: int, depth: int, layer_at_a_time: bool,
              attention_scores: bool = True, attention_rows: int | None = None, blocks_above: int = 0) -> TextCost:
    """The activation floor of one text of ``tokens`` tokens (see the module's docstring; ``layer_at_a_time``:
    one layer's states alive at once, else every layer's up to ``depth`` and the raw embeddings;
    ``attention_rows``: rows of scores held at once for a text of more than ``blocks_above`` tokens)."""
    t = int(tokens)
    rows = t if attention_rows is None or t <= int(blocks_above) else min(t, int(attention_rows))
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


def costliest(tokens: int, **cost_args) -> TextCost:
    """The ``text_cost`` of the costliest text of at most ``tokens`` tokens: the longest, or where attention
    runs whole up to ``blocks_above`` tokens and in blocks past them, one of ``blocks_above`` tokens."""
    cost = text_cost(tokens, **cost_args)
    above = int(cost_args.get("blocks_above") or 0)
    if cost_args.get("attention_rows") is None or not 0 < above < int(tokens):
        return cost
    whole = text_cost(above, **cost_args)
    return whole if whole.bytes > cost.bytes else cost


def longest_that_fits(budget: int, **cost_args) -> int:
    """The most tokens ``T`` such that every text of at most ``T`` tokens stays within ``budget`` bytes (0 if not
    even one does)."""
    lo, hi = 0, 1
    while costliest(hi, **cost_args).bytes <= budget and hi < 1 << 24:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if costliest(mid, **cost_args).bytes <= budget:
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
    blocks_above: int = 0  # those rows hold for texts of more tokens than this; shorter ones hold every row

    def args(self) -> dict:
        return dict(hidden_size=self.hidden_size, heads=self.heads, depth=self.depth,
                    layer_at_a_time=self.layer_at_a_time, attention_scores=self.attention_scores,
                    attention_rows=self.attention_rows, blocks_above=self.blocks_above)

    def cost(self, tokens: int) -> TextCost:
        """One text of ``tokens`` tokens."""
        return text_cost(max(1, int(tokens)), **self.args())

    def peak(self, longest: int) -> TextCost:
        """The costliest text of a run whose longest has ``longest`` tokens (``costliest``)."""
        return costliest(max(1, int(longest)), **self.args())


def shape_of(eng, *, tokens: bool = False) -> CostShape:
    """The cost shape of a started engine (what it pruned, pools as made and slices, as it says) in a run that
    fetches token states (``tokens``) or pooled vectors alone."""
    manifest = eng.manifest
    depth = eng.depth if getattr(eng, "depth", None) is not None else manifest.num_layers
    rows = getattr(eng, "attention_rows", None)
    return CostShape(eng.name, int(manifest.hidden_size), attention_heads(_model_dir(eng.model), manifest.hidden_size),
                     int(depth), not tokens and bool(getattr(eng, "pools_as_made", False) or
                                                     getattr(eng, "pooled_only", False)),
                     bool(getattr(eng, "attention_scores", True)), rows,
                     int(getattr(eng, "blocks_above", None) or 0) if rows is not None else 0)


def shape_planned(handle, choice: EngineChoice, *, depth: int, tokens: bool, max_seq: int | None,
                  pooled_only: bool = False) -> CostShape:
    """The cost shape of the engine ``choice`` (its declaration and the options the run passes) on ``handle``
    before it starts (an executor whose engines start later or elsewhere), in a run that fetches token states
    (``tokens``) or pooled vectors alone (``pooled_only``: the in-graph pooled outputs alone, the plan's
    ``EngineOptions.pooled_only``), what the engine does by its declaration and rules taken as granted: the depth
    hint; one layer's states in a pooled run of an engine that declares ``pools_as_made`` or of an ONNX engine
    whose pooled-only graph pools each layer as it is made (in-graph pooling on); attention charged whole unless
    an engine that declares its own precision (the PyTorch engines) slices it by its rule (engines/torch.py
    ``pick_attention``), or an engine that takes the blocks' ``attention`` option (ort, ov) runs blocks by
    theirs (engines/blocked.py ``pick_blocks``, on a model whose config the blocks compute: ``may_block``),
    each with the run's ``attention`` option. ``auto`` is charged as the ONNX engines it picks first. A floor,
    like ``text_cost``."""
    from layerscope.engines.registry import Runtime

    manifest = handle.manifest
    spec, asked = choice.spec, dict(choice.options)
    model_dir = _model_dir(handle)
    scores, rows, above = True, None, 0
    if spec.precision is not None:
        from layerscope.engines.torch import pick_attention

        scores = pick_attention(asked.get("attention"), spec.precision, max_seq, lambda: True) == "eager"
    onnx = spec.picks_engine or spec.runtime in (Runtime.ONNXRUNTIME, Runtime.OPENVINO)
    if onnx:
        from layerscope.engines.blocked import ATTENTION_OPTION, BLOCK_ROWS, may_block, pick_blocks

        if spec.picks_engine or ATTENTION_OPTION in spec.options:
            from_width = pick_blocks(asked.get("attention"), max_seq)
            if from_width is not None and may_block(manifest, model_dir, asked.get("variant")):
                rows, above = BLOCK_ROWS, from_width
    depth = manifest.num_layers if depth is None else min(int(depth), int(manifest.num_layers))
    # an ONNX engine pools each layer as made in a derived pooled-only graph, which a run of every layer does
    # without (engines/truncate.py engine_graph: the export's own graph stacks the layers)
    per_layer = spec.pools_as_made or (onnx and pooled_only and depth < int(manifest.num_layers)
                                       and asked.get("in_graph_pooling") is not False)
    return CostShape(choice.name, int(manifest.hidden_size), attention_heads(model_dir, manifest.hidden_size),
                     depth, not tokens and bool(per_layer), scores, rows, above)


def fits(shape: CostShape, tokens: int, *, available: int | None = None, workers: int = 1) -> bool:
    """Whether ``workers`` engines of ``shape``, each on the costliest text of at most ``tokens`` tokens, fit in
    ``available`` bytes (default: the memory available now; unknown memory fits)."""
    free = available_bytes() if available is None else available
    return free is None or workers * shape.peak(tokens).bytes <= free


def check_fits(shape: CostShape, longest: int, *, available: int | None = None, workers: int = 1) -> TextCost:
    """Refuse, in one line and before any batch runs, a run whose longest text (``longest`` tokens, already
    capped by the max length) cannot fit in the memory available, shared by ``workers`` engines each running
    one such text at once; returns the text's cost floor."""
    from layerscope.errors import InputError

    cost = shape.peak(longest)
    free = available_bytes() if available is None else available
    workers = max(1, int(workers))
    if free is not None and workers * cost.bytes > free:
        each = free // workers
        fitting = longest_that_fits(each, **shape.args())
        share = f" for each of {workers} workers" if workers > 1 else ""
        which = "one text that long" if cost.tokens == max(1, int(longest)) else \
            f"one of {cost.tokens:,} (attention whole up to that length, in blocks past it)"
        raise InputError(
            f"the longest text has {max(1, int(longest)):,} tokens, and {which} needs at least "
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

