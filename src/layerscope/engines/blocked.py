"""Long texts in bounded memory on ONNX Runtime: each layer's attention computed over blocks of query rows.

A decoder's exported graph computes attention the way transformers' eager code does: every query's scores
against every key (``heads x T x T`` floats), plus an additive causal-and-padding mask of the same square
(built once from ``attention_mask``), their softmax, and the product with the values. One text of ``T``
tokens then holds ``2 x heads x T^2`` floats per layer: 8 GiB at 8k tokens with 16 heads. ONNX Runtime's
CPU attention kernels do not bound that for a causal grouped-query layer (measured by
``benchmarks/long_texts/attention_ops.py``), so this module rewrites the graph instead.

In the derived graph each layer's attention, from the scores' ``MatMul`` to the values' ``MatMul``, is one
ONNX ``Loop`` over blocks of ``BLOCK_ROWS`` query rows. A block's scores are ``heads x BLOCK_ROWS x K``, ``K``
the keys up to the block's last row; the future and padded keys are masked, the row softmaxed and multiplied
with those keys' values. The blocks' outputs are stacked, and the rows that padded the last block cut (a batch
shorter than a block is one block of its own length: its queries are not padded). Key
and value heads are read in place by broadcasting over each group of query heads (no ``repeat_kv`` copy),
and the square mask, read by nothing any more, is pruned. A layer's attention then holds
``2 x heads x BLOCK_ROWS x T`` floats: linear in ``T``.

The rewrite finds each layer by pattern (engines/blocked_graph.py); only causal decoders whose every layer
attends to the whole past are rewritten, and anything else leaves the source graph running.

Like early exit's graph (engines/truncate.py), the derived graph is cached beside its source as
``<stem>.blocked.onnx`` (a graph with external data keeps reading the source's data file) with
``<stem>.blocked.json`` recording the source's content hash, the recipe and the check that held its every
output to the source's within the export's recorded tolerance, on engines/parity_texts.py, whose long text
spans several blocks. The record is held to the rule of model/derived.py before the graph runs (the source as it
is now, the graph as recorded, its layers in blocks, outputs and pooled layers read back from the graph), else
the graph is made again.

Which graph an engine runs (``pick_blocks``): the derived one from the start where asked
(``attention=blocked``); the source graph where asked (``whole``); under ``auto`` (the default) the source
graph, moving onto the derived one before the first batch wider than ``SLICE_FROM`` tokens, where the run's
``max_seq`` passes that. Every executor opens its engine with the same options (extraction/engine_plan.py)
and each engine decides by the batches it is handed, so the decision needs no look at the corpus ahead of the
run (a ``--shard`` worker reads only its ranges), and a corpus of short texts on a long-context model never
opens the derived graph. The derived graph is made and checked when the engine starts (before any session),
and the move releases the source graph's session before the derived graph's is made: never two at once. The
engine's notes say from which batch on attention ran in blocks, or nothing where it never did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from layerscope.engines.blocked_graph import BLOCK_ROWS, CannotBlock, attention_config, rewrite
from layerscope.engines.registry import EngineOption

RECIPE = 2  # bump when the derived graph is built differently: cached ones are made again
SUFFIX = ".blocked"


@dataclass(frozen=True)
class Blocked:
    """A derived graph whose attention runs in blocks of ``rows`` query rows."""

    path: Path
    layers: int  # attention layers rewritten
    rows: int
    max_abs: float  # the worst |derived - source| over every output on the check's batches
    reused: bool

    def note(self) -> str:
        how = "bit for bit" if self.max_abs == 0 else f"max |diff| {self.max_abs:.3g}"
        return (f"attention in blocks of {self.rows} query rows ({self.layers} layers), {self.path.name} (equal to "
                f"its source graph {how}{', cached' if self.reused else ''})")


def blocked_graph(src: Path, config_path: Path, *, pooled_layers: list[str], tolerance: float | None,
                  feeds: Callable[[], list[dict]]) -> Blocked:
    """The derived graph of ``src`` with attention in blocks: reused from the cache when its record matches the
    source's content and this recipe, else made and checked against ``src`` on the batches ``feeds()``
    returns. CannotBlock (saying why) where the model or graph is not one it rewrites, the folder cannot be
    written, or the derived graph differs from its source by more than ``tolerance``."""
    from layerscope.engines.truncate import check_outputs
    from layerscope.model.derived import source_sha256

    src = Path(src)
    cfg = attention_config(config_path)
    dst = src.with_name(f"{src.stem}{SUFFIX}.onnx")
    rec = dst.with_suffix(".json")
    key = source_sha256(src)
    bar = 0.0 if tolerance is None else float(tolerance)
    found = _cached(dst, rec, src, key, list(pooled_layers), bar)
    if found is not None:
        return found
    if not os.access(src.parent, os.W_OK):
        raise CannotBlock(f"{src.parent} is not writable, so the graph cannot be cached there")
    from layerscope.ownership import writing

    with writing(src.parent, "export") as wrote:
        wrote.add(dst.name, rec.name)  # named before they are written
        try:
            layers, nodes, full_nodes = rewrite(src, dst, cfg)
            import onnx

            names = [o.name for o in onnx.load(str(dst), load_external_data=False).graph.output]
            diffs = check_outputs(src, dst, names, list(pooled_layers), list(pooled_layers), feeds())
            worst = max(diffs.values(), default=0.0)
            if not worst <= bar:
                raise CannotBlock(f"the graph in blocks differs from its source by {worst:.3g} (> {bar:g})")
        except Exception as exc:
            dst.unlink(missing_ok=True)
            rec.unlink(missing_ok=True)
            if isinstance(exc, CannotBlock):
                raise
            # onnx and the runtimes raise untyped errors: the source graph runs
            raise CannotBlock(f"could not be made ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
        from layerscope.model.derived import write_record

        write_record(rec, dst, recipe=RECIPE, source=src, source_digest=key, rows=BLOCK_ROWS, layers=layers,
                     outputs=names, pooled_layers=list(pooled_layers), nodes=nodes, full_nodes=full_nodes,
                     check={"texts": "engines/parity_texts.py PARITY_TEXTS", "runtime": "onnxruntime CPU",
                            "tolerance_abs": bar, "max_abs": worst,
                            "outputs": {n: {"max_abs": d} for n, d in diffs.items()}})
    return Blocked(dst, layers, BLOCK_ROWS, worst, reused=False)


def _cached(dst: Path, rec: Path, src: Path, key: str, pooled_layers: list[str], bar: float) -> Blocked | None:
    """The cached graph where its record holds by the rule (model/derived.py): made by this recipe from ``src``
    as it is now, in blocks of this many rows, the graph as recorded, and the record's layers in blocks (its
    ``Loop`` nodes), outputs, nodes and pooled layers those of the graph itself (the pooled layers the source's);
    else None."""
    from layerscope.model.derived import finite_at_most, graph_facts, read_record

    data = read_record(rec, dst, recipe=RECIPE, source=src, source_digest=key, claims={"rows": BLOCK_ROWS})
    if data is None:
        return None
    try:
        outputs, stacked, nodes, ops = graph_facts(dst)
    except Exception:  # noqa: BLE001 - a graph onnx cannot parse is made again
        return None
    check = data.get("check")
    pooled = any(o.startswith("pooled.") for o in outputs)
    if data.get("layers") != ops.get("Loop", 0) or not ops.get("Loop") or data.get("outputs") != outputs \
            or data.get("nodes") != nodes or (pooled and not stacked == data.get("pooled_layers") == pooled_layers) \
            or not isinstance(check, dict) or not finite_at_most(check.get("max_abs"), bar):
        return None
    return Blocked(dst, int(data["layers"]), BLOCK_ROWS, float(check["max_abs"]), reused=True)


ATTENTIONS = ("auto", "whole", "blocked")
# the option the ort and ov engines take
ATTENTION_OPTION = EngineOption(
    "attention", str, None, "whole (each layer's [heads, T, T] scores at once), blocked (over blocks of query rows: "
    "memory linear in T; causal decoders) or auto (default: whole, moving to blocks at the first batch past "
    "SLICE_FROM tokens where max_seq passes it)")


def pick_blocks(asked: str | None, max_seq: int | None) -> int | None:
    """From which width an ONNX engine runs its attention in blocks: a batch of more tokens than the number
    returned runs them (0: every batch, asked with ``attention=blocked``); None: none (``whole``). Under ``auto``
    (the default) ``SLICE_FROM`` (the rule of the PyTorch engine's slices) where the run's texts may pass it
    (``max_seq`` above it), else None: a run of short texts never opens the derived graph."""
    from layerscope.engines.torch import SLICE_FROM
    from layerscope.errors import InputError

    asked = asked or "auto"
    if asked not in ATTENTIONS:
        raise InputError(f"engine option attention={asked!r}: use one of {', '.join(ATTENTIONS)}")
    if asked == "blocked":
        return 0
    return SLICE_FROM if asked == "auto" and max_seq and int(max_seq) > SLICE_FROM else None


FUSED_VARIANTS = ("gqa",)  # export variants whose attention is one fused node: no pattern for the blocks to rewrite


def may_block(manifest, model_dir: Path | None, variant: str | None = None) -> bool:
    """Whether a model's attention is one the blocks compute (a causal decoder attending to the whole past, by
    its config.json; not a variant that fuses it), before any graph is read: what the memory plan charges
    (engines/memory.py). The graph's own pattern is checked when the derived graph is made."""
    try:
        if model_dir is None or manifest.kind != "decoder" or variant in FUSED_VARIANTS:
            return False  # the kind is recorded: no transformers import to learn it
        attention_config(Path(model_dir) / "config.json")
    except CannotBlock:
        return False
    return True


def engine_blocks(engine, path: Path, pooled_layers: list[str], asked: str | None) -> Path:
    """The graph an ONNX engine (ort, ov) opens, given ``engine.blocks_above`` (``pick_blocks``). Where blocks
    may run, the derived graph of ``path`` is made (or found cached) and checked now, before any session, and
    ``engine.attention_rows`` says its rows: asked for (0), the derived graph is returned and its note said;
    under ``auto``, ``path`` is returned and kept in ``engine.blocks_graph`` until the first batch that passes
    ``blocks_above`` tokens (``next_graph``), the note said then. A graph that cannot be rewritten: one line
    where asked for, else a note, and attention whole."""
    above = engine.blocks_above
    engine.attention = "whole"
    if above is None:
        return path
    from layerscope.engines.truncate import probe_feeds

    manifest = engine.manifest
    try:  # the kind the manifest records: deriving the family again imports transformers (~400 MiB resident)
        if manifest.kind != "decoder":
            raise CannotBlock("an encoder's tokens attend both ways, and the blocks mask the future")
        got = blocked_graph(path, Path(engine.model.export_dir) / "config.json", pooled_layers=pooled_layers,
                            tolerance=manifest.parity.tolerance_abs if manifest.parity else None,
                            feeds=lambda: probe_feeds(engine))
    except CannotBlock as exc:
        engine.blocks_above = None
        if asked == "blocked":
            from layerscope.errors import InputError

            raise InputError(f"engine option attention=blocked: {path.name} cannot run its attention in blocks: "
                             f"{exc}; leave the option out") from None
        engine.info.notes.append(f"attention computed whole: {path.name} cannot run it in blocks ({exc})")
        return path
    engine.attention_rows = got.rows
    if above:
        engine.blocks_graph = got
        return path
    engine.attention = "blocked"
    engine.info.notes.append(got.note())
    return got.path


def next_graph(engine, batch) -> Blocked | None:
    """The derived graph an engine under ``auto`` moves onto before ``batch``: the first batch wider than its
    ``blocks_above`` tokens (None: it stays where it is; an engine with no graph to move to never reads the
    batch's width, which an image batch does not have). The caller releases its session before opening that
    graph's (``took_blocks`` then records it), so no two sessions are ever held at once."""
    got = engine.blocks_graph
    if got is None or engine.attention == "blocked":
        return None
    return got if int(batch.mask.shape[1]) > int(engine.blocks_above) else None


def took_blocks(engine, got: Blocked) -> None:
    """Record that ``engine`` now runs ``got`` (its note says from which batch on; every later batch runs it)."""
    engine.info.notes.append(f"{got.note()}, from the first batch past {engine.blocks_above:,} tokens on")
    engine.attention, engine.blocks_above, engine.blocks_graph = "blocked", 0, None
