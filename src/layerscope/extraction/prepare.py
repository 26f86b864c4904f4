"""Preparing an extraction: every check and decision made before a row is read, shared by ``extract``
and the Ray driver (``extraction/ray_extract.py``), so both refuse the same things with the same words.

``prepare_extraction`` checks the options, claims the output directory (nothing is deleted yet),
resolves the model, its layers, poolings (the model's own by default) and prompt, and writes down the
settings the store records. ``open_to_resume`` opens a store to continue after checking that it was
made with the same settings from the same corpus.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import layerscope
from layerscope.data.corpus import records_of
from layerscope.engines.base import Engine
from layerscope.engines.registry import EngineChoice, resolve_engine
from layerscope.errors import InputError
from layerscope.model.manifest_type import Manifest
from layerscope.model.variants import run_variant
from layerscope.vocab.layers import resolve_widths
from layerscope.errors import InputError, StoreError
from layerscope.ownership import Claim
from layerscope.extraction.batching import DEFAULT_MAX_BATCH
from layerscope.vocab.pooling import check_poolings, require_pooled_output
from layerscope.extraction.spool import corpus_sha256
from layerscope.store.store import LayerStore
from layerscope.store.store_layout import StoreLayout
from layerscope.store.store_spec import StoreSpec, TokensSpec

log = logging.getLogger("layerscope")


@dataclass
class Extraction:
    """What a run will do, decided before it reads the corpus."""

    out: Path
    claim: Claim  # what is at ``out`` and whether the run may replace it
    resume: bool
    handle: Any  # the ModelHandle
    engine: Engine | None  # the engine the caller passed, else None (started once the corpus is known)
    choice: EngineChoice | None  # --engine and its options, resolved once (None: an Engine was passed)
    manifest: Manifest
    layers: list[str]
    poolings: list[str]
    max_length: int
    max_batch: int
    spec: StoreSpec  # store.json's settings; completed with the corpus hash (and auto's variant) before creation
    variant_pending: bool = False  # --engine auto picks the variant once the engine starts

    @property
    def prompt(self) -> str:
        return self.spec.prompt or ""


def check_dtype(dtype: str) -> None:
    from layerscope.store.store_dtype import check

    check(dtype)


def describe_source(source) -> str:
    """How a store's settings name its input: the path, or a count of in-memory texts."""
    if isinstance(source, (str, Path)):
        return str(source)
    return f"<{len(source)} texts in memory>" if hasattr(source, "__len__") else "<iterable of texts>"


def check_request(manifest: Manifest, spec: str, *, layers, poolings, max_length: int | None, prompt_name: str | None,
                  prompt: str | None) -> tuple:
    """``(layers, poolings, prompt)`` of one extraction, checked against the model's manifest before any engine
    starts or anything is written (extract and embed); one clear error otherwise."""
    from layerscope.limits import check_max_length
    from layerscope.model.stconfig import resolve_prompt, st_recipe
    from layerscope.vocab.pooling import default_poolings

    check_max_length(max_length, manifest, spec)
    # a store holds one width: where the word embeddings are narrower than the hidden states (ALBERT, ELECTRA
    # project them up), 'all' means 0..L, 'raw' is stored on its own at its width, and a mix is refused
    layer_list = resolve_widths(layers, manifest.num_layers, raw_width=manifest.raw_width,
                                hidden_size=manifest.hidden_size)
    if poolings is None:  # the model's own: st for a sentence-transformers checkpoint
        poolings = default_poolings(manifest)
    pool_list = check_poolings(poolings if not isinstance(poolings, str) else poolings.split(","))
    require_pooled_output(pool_list, manifest.pooled_output, manifest.family)
    if "st" in pool_list:
        st_recipe(manifest)  # a clear error before anything is written
        if manifest.is_export:  # st at layer L of an export that lacks the model's own last hidden state
            from layerscope.model.stconfig import st_layers
            from layerscope.vocab.outputs import OWN_LAST

            st_layers(manifest.anatomy, manifest.num_layers, list(layer_list), pool_list,
                      carried=OWN_LAST in manifest.outputs)
    return layer_list, pool_list, resolve_prompt(manifest, prompt_name, prompt)


def prepare_extraction(model, source, out: str | Path, *, engine: Any = "auto", layers="all",
                       poolings=None, dtype: str = "float32", batch_tokens: int | None = None,
                       max_batch: int | None = None, max_length: int | None = None, resume: bool = False,
                       force: bool = False, engine_options: dict | None = None, prompt_name: str | None = None,
                       prompt: str | None = None, trust_remote_code: bool = False,
                       engine_runs_here: bool = True, tokens_dtype: str | None = None) -> Extraction:
    """Check everything that can be checked before the corpus is read; raise one clear error otherwise.

    ``model`` is a name, a path or a ModelHandle (resolved with ``trust_remote_code``, off unless
    asked); an ``Engine`` passed as ``engine`` brings its own model; a name (or an ``EngineChoice``) is
    resolved here, once, with ``engine_options``, and the choice is handed down (``Extraction.choice``).
    ``engine_runs_here``: the engine starts on this machine, so whether it can is checked first (on Ray the
    workers' machines decide).
    ``tokens_dtype``: the run also stores token vectors, in that dtype.
    """
    from layerscope.export.open import require_engine, resolve_model
    from layerscope.limits import check_engine_options, check_limits
    from layerscope.ownership import claim

    check_dtype(dtype)
    check_limits(batch_tokens=batch_tokens, max_batch=max_batch, max_length=max_length)
    check_engine_options(engine_options)
    choice = None
    if not isinstance(engine, Engine):  # an unknown engine or a mistyped option is one line, before the claim
        choice = resolve_engine(engine, engine_options)
    if choice is not None and engine_runs_here:
        require_engine(choice)  # a GPU engine missing here is one line now, not after the export
    if poolings is not None:  # names need no model: refused before it is read or hashed
        check_poolings(poolings if not isinstance(poolings, str) else poolings.split(","))
    out = Path(out)
    # --force replaces only a store layerscope made that does not hold the corpus; nothing is deleted yet
    where = claim(out, "store", force=force and not resume, keep=resume,
                  inputs=[source] if isinstance(source, (str, Path)) else [])
    if isinstance(engine, Engine):
        eng, handle = engine, engine.model
    else:
        eng = None
        # exported when the engine starts; a cached export is found without transformers or torch
        handle = resolve_model(model, trust_remote_code=trust_remote_code, engine=choice)
        from layerscope.engines.base import require_code_for

        require_code_for(choice.spec, handle)  # the in-process, --shard and Ray runs alike, before any work
    manifest = handle.manifest
    layer_list, pool_list, prompt_text = check_request(manifest, handle.spec, layers=layers, poolings=poolings,
                                                       max_length=max_length, prompt_name=prompt_name, prompt=prompt)
    max_len = int(max_length or manifest.max_length)
    if max_length is not None:  # a length that cannot hold one token of text: refused before any work
        from layerscope.model.tokenize import check_room

        check_room(handle.encoding_tokenizer(), max_len, prompt_text or "")
    max_batch = int(max_batch or DEFAULT_MAX_BATCH)
    asked_variant = choice.variant if choice is not None else getattr(engine, "variant", None)
    spec = StoreSpec(model=handle.spec, model_key=handle.key, engine=(choice or engine).name,
                     variant=run_variant(asked_variant),  # resuming must not mix precisions
                     layers=tuple(layer_list), poolings=tuple(pool_list), prompt=prompt_text or None,
                     max_length=max_len, max_batch=max_batch, batch_tokens=batch_tokens, dtype=dtype,
                     tokens=TokensSpec(tokens_dtype) if tokens_dtype else None, input=describe_source(source),
                     corpus_sha256=None, layerscope_version=layerscope.__version__)
    return Extraction(out=out, claim=where, resume=resume, handle=handle, engine=eng, choice=choice,
                      manifest=manifest, layers=layer_list, poolings=pool_list, max_length=max_len,
                      max_batch=max_batch, spec=spec,
                      variant_pending=choice is not None and choice.spec.picks_engine and not asked_variant)


def prepare_request(req, *, engine_runs_here: bool = True) -> Extraction:
    """``prepare_extraction`` of an ``ExtractionRequest`` (extraction/request.py)."""
    from layerscope.store.token_write import tokens_dtype

    return prepare_extraction(req.model, req.source, req.out, engine_runs_here=engine_runs_here,
                              tokens_dtype=tokens_dtype(req.tokens, req.store_dtype), **req.prepare_kwargs())


def drops_nul(encoder) -> bool:
    """Whether this tokenizer ignores NUL bytes (BERT-style cleaning) or encodes them (byte-level BPE)."""
    with_nul, without = encoder.token_lengths(["a\x00\x00\x00b c", "ab c"])
    return bool(with_nul == without)


@dataclass(frozen=True)
class Spooled:
    """The corpus as ``spool_store`` wrote it into the store's folder (texts.jsonl, offsets, lengths)."""

    n: int
    empty: int
    nul: int
    id_field: str | None
    lengths_now: bool
    nul_dropped: bool | None


def spool_store(ex: Extraction, source, reader: dict[str, Any], encoder, *, lengths_now: bool) -> Spooled:
    """Spool the corpus into ``ex.out`` and complete ``ex.spec`` with its hash (nothing else is made yet).

    ``lengths_now``: tokenize every text now for ``lengths.npy`` (the in-process run sorts by them);
    otherwise ``lengths.npy`` is reserved and each range's worker writes its rows' lengths. The byte
    offsets of texts.jsonl are recorded either way, so any executor can continue the store.
    """
    import numpy as np

    from layerscope.data.corpus import CorpusStats
    from layerscope.ownership import note
    from layerscope.store import store_ranges
    from layerscope.extraction.spool import spool_corpus
    from layerscope.store.store_layout import LENGTHS
    from layerscope.store.store_space import allocate_npy

    out = ex.out
    note(out, files=[store_ranges.OFFSETS, LENGTHS])  # named before they are written
    read = CorpusStats()
    spool = spool_corpus(records_of(source, **reader, stats=read), out, encoder=encoder if lengths_now else None,
                         granule=store_ranges.GRANULE)
    np.save(out / store_ranges.OFFSETS, spool["offsets"])
    if not lengths_now:
        allocate_npy(out / LENGTHS, np.dtype(np.int32), (spool["n"],))
    ex.spec = ex.spec.replace(corpus_sha256=spool["sha256"])
    return Spooled(n=spool["n"], empty=spool["empty"], nul=spool["nul"], id_field=read.id_field,
                   lengths_now=lengths_now, nul_dropped=drops_nul(encoder) if spool["nul"] else None)


def create_store(ex: Extraction, spooled: Spooled, *, engine_info: dict | None = None,
                 range_rows: int | None = None) -> LayerStore:
    """Make the store every executor writes into, for the spooled corpus: arrays reserved up front,
    ``ex.spec`` written as its settings (once), the range plan recorded (``range_rows`` overrides its
    rows per range, a multiple of ``GRANULE``)."""
    from layerscope.store import store_ranges
    from layerscope.store.npy_files import internal_sha256
    from layerscope.store.store_layout import LENGTHS
    from layerscope.store.store_dtype import itemsize
    from layerscope.store.store_record import RangePlan

    out, n = ex.out, spooled.n
    hidden = int(ex.manifest.width_of(ex.layers))  # raw alone: the word embeddings' width
    row_bytes = hidden * itemsize(ex.spec.dtype) * len(ex.layers) * len(ex.poolings)
    rows = int(range_rows or store_ranges.range_rows(n, row_bytes))
    if rows % store_ranges.GRANULE:
        raise InputError(f"range rows must be a multiple of {store_ranges.GRANULE}, not {rows}")
    store = LayerStore.create(out, n=n, spec=ex.spec, hidden_size=hidden, manifest=ex.manifest)
    # range writers fill lengths.npy later
    relied_on = [store_ranges.OFFSETS] + ([LENGTHS] if spooled.lengths_now else [])
    store.update(empty_texts=spooled.empty, nul_texts=spooled.nul, id_field=spooled.id_field,
                 internal_sha256=internal_sha256(out, relied_on), nul_dropped_by_tokenizer=spooled.nul_dropped,
                 ranges=RangePlan(rows, -(-n // rows)),
                 range_writers=not spooled.lengths_now,  # lengths.npy is filled range by range
                 engine=dict(engine_info or {}))
    return store


def _locked() -> type:
    from layerscope.store.store_lock import StoreLockedError

    return StoreLockedError


def make_store_dir(ex: Extraction) -> bool:
    """Create the store directory (replacing the old store first when the claim allows), marked as a
    store; True when this call created the directory."""
    from layerscope.ownership import remove, write_marker

    if ex.claim.replace:
        remove(ex.out, "store")
    created = not ex.out.exists()
    ex.out.mkdir(parents=True, exist_ok=True)
    from layerscope.out_lock import hold_folder

    hold_folder(ex.out, error=StoreError, locked=_locked())  # a bind mount of it made now meets the same lock
    layout = StoreLayout(ex.out)
    if not layout.marker.exists() and not layout.store_json.exists():  # an older store: left unmarked
        write_marker(ex.out, "store")
    return created


def open_to_resume(ex: Extraction, source, reader: dict[str, Any], *,
                   variant_later: bool = False) -> LayerStore | None:
    """The store at ``ex.out`` to continue, or None when this run does not resume one.

    Refused when the store's spec differs from this run's in its identity (``StoreSpec.identity``;
    ``variant_later``: the caller checks the variant once ``--engine auto`` has picked one), the corpus
    hash included (texts or ids changed). ``reader`` holds the corpus reader's options.
    """
    if not (ex.resume and StoreLayout(ex.out).store_json.exists()):
        return None
    store = LayerStore.open(ex.out, allow_incomplete=True)
    made = store.spec
    check_same(ex, made, skip=("variant", "corpus_sha256") if variant_later else ("corpus_sha256",))
    if made.corpus_sha256:  # the corpus is read again only when everything else matches
        ex.spec = ex.spec.replace(corpus_sha256=corpus_sha256(records_of(source, **reader)))
        check_same(ex, made, skip=("variant",) if variant_later else ())
    if store.complete:
        log.info("store already complete")
    else:
        from layerscope.ownership import rewriting

        rewriting(ex.out, "store")  # its files are written again: a run killed now leaves them known as ours
    store.mode = "r+"
    return store


def check_same(ex: Extraction, made: StoreSpec, *, skip: tuple[str, ...] = (), picked: str = "") -> None:
    """Refuse to continue a store whose spec ``made`` differs from this run's in its identity (one line).
    ``picked``: what ``--engine auto`` said about the variant it picked."""
    diff = ex.spec.mismatch(made, skip=skip)
    if diff is None:
        return
    key, was, now = diff
    if key == "corpus_sha256":
        raise StoreError(f"{ex.out} was made from another version of {ex.spec.input} (its texts or ids "
                         "changed since); drop --resume and use --force, or choose another --out")
    if key == "tokens":
        was, now = (t.to_json() if t else None for t in (was, now))
    if key == "variant" and picked:
        raise StoreError(f"{ex.out} was made with variant={was!r}, --engine auto picked {now!r} now ({picked})"
                         "; pass the same --min-cosine, or use another --out")
    if isinstance(was, tuple):
        was, now = list(was), list(now)
    raise StoreError(f"{ex.out} was made with {key}={was!r}, this run asks for {now!r}; use another --out or "
                     "drop --resume (and use --force)")


def check_ranges_fit(ex: Extraction, choice: EngineChoice, ranges, *, workers: int = 1,
                     available: int | None = None, here: bool = True) -> None:
    """``--shard`` and Ray, before the first range runs and before any engine starts: the memory check of an
    in-process extraction (engines/memory.py) over the texts of ``ranges`` (``store_ranges.Range`` or the Ray
    driver's dicts), shared by ``workers`` engines of ``choice`` (the run's engine and options, as prepare
    resolved them: ``ex.choice``) running at once. The longest text the plan allows (``--max-length``, else the
    model's limit) is tried first; only where that does not fit are the ranges' texts tokenized to find their
    longest. ``available``: bytes each machine has (None: this machine's memory now, where ``here``; elsewhere
    unknown, and nothing is refused)."""
    from layerscope.engines.memory import check_fits, fits, shape_planned
    from layerscope.extraction.engine_plan import engine_options
    from layerscope.model.tokenize import Encoder

    if available is None and not here:
        return
    plan = engine_options(ex.spec, ex.manifest, dict(choice.options))
    shape = shape_planned(ex.handle, choice, depth=plan.depth, tokens=bool(ex.spec.tokens), max_seq=plan.max_seq,
                          pooled_only=plan.pooled_only)
    if fits(shape, ex.max_length, available=available, workers=workers):
        return  # the longest text the plan allows fits: nothing to count
    log.info("counting the tokens of %s ranges to check memory for the longest text", f"{len(ranges):,}")
    encoder = Encoder(ex.handle.encoding_tokenizer(), list(ex.manifest.inputs), ex.max_length, ex.prompt)
    longest = 0
    for texts in _range_texts(ex.out, ranges):
        longest = max(longest, max((int(n) for n in encoder.token_lengths(texts)), default=0))
    try:
        check_fits(shape, min(longest, ex.max_length), available=available, workers=workers)
    except InputError as exc:  # the store is spooled but holds no vectors: a run with other settings needs it gone
        raise InputError(f"{exc} (no vectors were written: remove {ex.out} before running again with another "
                         "--max-length)") from None


def _range_texts(out: Path, ranges):
    """The texts of each range, read from the spooled ``texts.jsonl`` at the range's recorded offset."""
    import json

    from layerscope.store.store_layout import TEXTS

    with open(out / TEXTS, "rb") as fh:
        for r in ranges:
            offset, rows = (r["offset"], r["stop"] - r["start"]) if isinstance(r, dict) else (r.offset, r.rows)
            fh.seek(int(offset))
            yield [json.loads(fh.readline())["text"] for _ in range(int(rows))]


def ray_share(ray, actors: int, cpus: float, gpus: float = 0.0, *, local: bool) -> dict[str, Any]:
    """``check_ranges_fit``'s ``workers``/``available``/``here`` for ``actors`` Ray actors of ``cpus`` CPUs each:
    on a local cluster they share this machine's memory; on another cluster each node's ``memory`` resource is
    shared by the actors it can hold, and the tightest node sets what each actor has (unknown: no check).
    Actors with GPUs (``gpus``) hold their activations there: no host-memory check."""
    if gpus:
        return {"workers": 1, "available": None, "here": False}
    if local:
        return {"workers": max(1, int(actors)), "available": None, "here": True}
    each = []
    for node in ray.nodes():
        res = node.get("Resources") or {}
        fit = min(int(actors), int(float(res.get("CPU", 0)) // max(float(cpus), 1e-9)))
        if node.get("Alive") and fit >= 1 and float(res.get("memory", 0)) > 0:
            each.append(int(float(res["memory"]) // fit))
    return {"workers": 1, "available": min(each) if each else None, "here": False}
