"""Extraction: corpus -> length-sorted token-budget batches -> engine -> pooled vectors -> LayerStore.

Memory is bounded by a window of rows (``window``), not by the corpus: the
texts are spooled once into the store's ``texts.jsonl`` with their token
lengths, then read back a window at a time, sorted by length inside the
window and cut into batches whose padded size stays under ``batch_tokens``.
Tokenization runs on a background thread so it overlaps the engine.

The pieces live beside this module: ``prepare`` (checks and settings, shared with Ray),
``spool`` (texts.jsonl and its hash), ``batching`` (plans, the background tokenizer,
``iter_pooled``) and ``progress`` (the bar).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from layerscope.engines.base import Engine
from layerscope.errors import InputError, StoreError
from layerscope.export.open import open_engine
from layerscope.model.tokenize import Batch, Encoder
from layerscope.extraction.batching import (DEFAULT_MAX_BATCH, Background, check_finite, check_long_texts, encode_plan,
                                         iter_pooled, tokenizer_pool)
from layerscope.extraction.prepare import (Extraction, create_store, make_store_dir, open_to_resume, prepare_request,
                                        spool_store)
from layerscope.extraction.executor import ExtractReport
from layerscope.extraction.request import ExtractionRequest
from layerscope.progress import progress_bar
from layerscope.store.store import LayerStore
from layerscope.store.store_layout import TEXTS

log = logging.getLogger("layerscope")

DEFAULT_WINDOW = 65536


# ---------------------------------------------------------------- the run

@contextlib.contextmanager
def _cleanup_on_failure(ex: Extraction) -> Iterator[dict]:
    """Make (or replace) the store directory; if the run fails before any row is stored, remove what it
    made (the directory too when it made it), so no empty store or ``.partial`` file is left behind.
    A store with rows done, or one this run resumed, is kept. Ctrl-C becomes ``Interrupted`` with the count.
    """
    from layerscope.errors import Interrupted
    from layerscope.ownership import clear_own, remove_if_empty

    out = ex.out
    earlier = ex.claim.kind is not None and not ex.claim.replace  # a store that was there before: never removed
    created = make_store_dir(ex)
    state: dict[str, Any] = {"store": None}
    try:
        yield state
    except BaseException as exc:
        store = state["store"]
        interrupted = isinstance(exc, KeyboardInterrupt)
        rows = 0
        if store is not None:
            try:
                rows = int(store.done_mask().sum())
            except Exception:  # a store that cannot be read counts as no rows
                rows = 0
        keep = earlier or rows > 0 or (interrupted and store is not None)
        if not keep:
            if store is not None:
                store.close()
            clear_own(out, "store")
            if created:
                remove_if_empty(out)
        if not interrupted:
            raise
        if store is None or not keep:
            raise Interrupted("interrupted before the corpus was stored; nothing was kept" if not keep else
                              "interrupted; the store is as it was") from None
        raise Interrupted(f"interrupted: {rows:,} of {store.n:,} rows done; continue with --resume") from None


def _one_writer(fn: Callable) -> Callable:
    """Run ``fn`` holding the store's write lock (and recording what it wrote); a full disk (or file-size limit) becomes one line."""

    @functools.wraps(fn)
    def wrapper(req, *args, **kwargs):
        from layerscope.store.store_lock import store_writer
        from layerscope.store.store_space import FULL

        out = req.out
        try:  # the record written when the writer ends may meet the full disk too: the same line
            with store_writer(out):
                return fn(req, *args, **kwargs)
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            where = f" ({exc.filename})" if exc.filename else ""
            raise StoreError(f"no space left writing {out}{where}: {exc.strerror}; free some space and "
                             "re-run with --resume") from None

    return wrapper


def extract(model, source, out: str | Path, *, engine: str | Engine = "auto", layers="all",
            poolings=None, dtype: str | None = None, store_dtype: str | None = None,
            batch_tokens: int | None = None, max_batch: int = DEFAULT_MAX_BATCH, max_length: int | None = None,
            resume: bool = False, force: bool = False, window: int = DEFAULT_WINDOW, text_field=None, column=None,
            id_field=None, fmt=None, progress: bool | str | None | Callable = False,
            engine_options: dict | None = None, prompt_name: str | None = None,
            prompt: str | None = None, trust_remote_code: bool = False, tokens: bool = False) -> ExtractReport:
    """Extract pooled per-layer vectors of every text in ``source`` into a LayerStore at ``out``.

    ``store_dtype`` (``dtype`` is its older name): float32 (default), float16 or bfloat16 on disk, for the
    pooled vectors and (with ``tokens``) the token vectors alike; every reader gets float32 back.
    ``trust_remote_code`` lets a model whose repository ships its own code be resolved (off unless asked).
    ``tokens`` also stores every token's vector of ``layers`` (store/token_store.py).
    """
    req = ExtractionRequest.of(model, source, out, engine=engine, layers=layers, poolings=poolings,
                               store_dtype=store_dtype or dtype or "float32", batch_tokens=batch_tokens,
                               max_batch=max_batch, max_length=max_length, resume=resume, force=force,
                               text_field=text_field, column=column, id_field=id_field, fmt=fmt, progress=progress,
                               engine_options=engine_options, prompt_name=prompt_name, prompt=prompt,
                               trust_remote_code=trust_remote_code, tokens=tokens)
    return InProcess(window).run(req)


@dataclass(frozen=True)
class InProcess:
    """The in-process executor (extraction/executor.py): this process runs the whole request, reading the
    corpus back ``window`` rows at a time."""

    window: int = DEFAULT_WINDOW

    def run(self, request: ExtractionRequest) -> ExtractReport:
        return extract_request(request, window=self.window)


@_one_writer
def extract_request(req: ExtractionRequest, *, window: int = DEFAULT_WINDOW) -> ExtractReport:
    """The in-process executor: one process runs the whole ``ExtractionRequest``."""
    ex = prepare_request(req)
    t0 = time.perf_counter()
    with _cleanup_on_failure(ex) as state:
        return _extract_into(ex, state, req, window=window, t0=t0)


def _extract_into(ex: Extraction, state: dict, req: ExtractionRequest, *, window: int, t0: float) -> ExtractReport:
    """The run itself, inside the directory ``_cleanup_on_failure`` prepared (``state['store']``: the store)."""
    out, manifest, max_len = ex.out, ex.manifest, ex.max_length
    reader = req.reader.as_kwargs()
    eng = ex.engine
    store = state["store"] = open_to_resume(ex, req.source, reader, variant_later=eng is None and ex.variant_pending)
    if store is not None and store.range_writers and not store.complete:
        raise StoreError(f"{out} is being written range by range (--shard or --ray); continue it the same way "
                         "(layerscope extract ... --shard i/N, or --ray ... --resume)")
    encoder = eng.encoder(max_len, ex.prompt) if eng is not None else \
        Encoder(ex.handle.encoding_tokenizer(), list(manifest.inputs), max_len, ex.prompt)
    spooled = None
    if store is None:  # the corpus is read (and refused, when it is bad) before the engine starts
        spooled = spool_store(ex, req.source, reader, encoder, lengths_now=True)
    if eng is None:
        eng = _start_engine(ex, req, made=None if store is None else store.spec)
    batch_tokens = int(req.batch_tokens or eng.preferred_batch_tokens)
    if store is None:
        ex.spec = ex.spec.replace(batch_tokens=batch_tokens)
        store = state["store"] = create_store(ex, spooled, engine_info=eng.info.to_dict())
    from layerscope.store.npy_files import load_internal
    from layerscope.store.store_layout import LENGTHS
    from layerscope.store.token_write import start_tokens

    lengths = load_internal(out, LENGTHS, store.record.internal_sha256, np.dtype(np.int32), (store.n,))
    tok = start_tokens(store, lengths, ex.layers)
    encoder.details = tok is not None
    commit = store.commit if tok is None else functools.partial(tok.commit, store)
    done = store.done_mask()
    already = int(done.sum())
    # memory refused, truncation said, before any batch
    check_long_texts(eng, lengths[done == 0], max_len, tokens=tok is not None)
    warnings = extraction_warnings(store, lengths, max_len)
    todo_tokens = int(np.minimum(lengths, max_len)[done == 0].sum())
    tokens_done = 0
    bar = progress_bar(req.progress, store.n - already, todo_tokens)
    pool = tokenizer_pool(eng, encoder) if tok is None else None  # processes only where measured to be needed
    batches = Background(_stored_batches(out, lengths, done, encoder, batch_tokens=batch_tokens,
                                         max_batch=ex.max_batch, window=window, pool=pool))
    last_commit = t_run = time.perf_counter()
    pending: list[np.ndarray] = []
    try:
        # pooled runs go through run_stream (OpenVINO keeps two batches in flight there); token runs one by one
        stream = eng.run_stream(batches, ex.layers, ex.poolings) if tok is None else \
            ((b, tok.run(eng, b, ex.layers, ex.poolings)) for b in batches)
        for batch, pooled in stream:
            pooled = check_finite(pooled, ex.layers, batch)
            store.write(batch.index, pooled, ex.layers)
            pending.append(batch.index)
            tokens_done += batch.n_tokens
            if time.perf_counter() - last_commit > 2.0 or len(pending) >= 64:
                commit(np.concatenate(pending))
                pending.clear()
                last_commit = time.perf_counter()
            bar.advance(batch.size, batch.n_tokens)
        if pending:
            commit(np.concatenate(pending))
            pending.clear()
    except BaseException:
        if pending:  # rows already written: keep them, so --resume does not redo them
            commit(np.concatenate(pending))
        raise
    finally:
        batches.close()
        if pool is not None:
            pool.close()
        bar.close()
    if int(store.done_mask().sum()) != store.n:
        raise StoreError(f"{out}: {store.n - int(store.done_mask().sum())} rows are missing after the run; "
                         "run again with --resume")
    if store.dtype != "float32":
        from layerscope.store.store_dtype import check_error_bar

        check_error_bar(out, store.dtype, store.half_error)
    run_seconds = time.perf_counter() - t_run
    seconds = time.perf_counter() - t0
    truncated = int((lengths > max_len).sum())
    if tok is not None:
        tok.finish(encoder.tokenizer)
    store.finish(engine=eng.info.to_dict(), truncated_texts=truncated, warnings=tuple(warnings),
                 tokens=int(np.minimum(lengths, max_len).sum()),
                 # this call's timing, its extraction loop alone (no engine start), and what it extracted
                 extra={"seconds": round(seconds, 3), "run_seconds": round(run_seconds, 3),
                        "run_rows": store.n - already, "run_tokens": int(tokens_done)})
    return ExtractReport(store=store, n=store.n, empty=store.empty_texts, truncated=truncated,
                         tokens=tokens_done, seconds=seconds, run_seconds=run_seconds, engine=eng.info.to_dict(),
                         resumed_rows=already, warnings=warnings)


def _start_engine(ex: Extraction, req: ExtractionRequest, *, made) -> Engine:
    """The engine, started once the corpus is spooled, with the options every executor uses
    (``engine_plan``); what ``auto`` picked goes into the spec and, resuming, must be what the store
    ``made`` was made with. A store made for this run is removed by _cleanup_on_failure if the engine does
    not start."""
    from layerscope.extraction.prepare import check_same
    from layerscope.extraction.engine_plan import engine_options
    from layerscope.model.variants import run_variant

    options = engine_options(ex.spec, ex.manifest, dict(ex.choice.options))
    eng = open_engine(ex.handle, ex.choice, **options.as_kwargs())
    if ex.variant_pending:  # auto may pick a reduced-precision variant: record it, never mix it on resume
        ex.spec = ex.spec.replace(variant=run_variant(getattr(eng, "variant", None)))
        if made is not None:
            check_same(ex, made, picked=eng.info.notes[-1] if eng.info.notes else "")
    return eng


def _stored_batches(store_dir: Path, lengths: np.ndarray, done: np.ndarray, encoder: Encoder, *,
                    batch_tokens: int, max_batch: int, window: int, pool=None) -> Iterator[Batch]:
    """The batches of the rows not done yet, read back from texts.jsonl ``window`` rows at a time."""
    n = len(lengths)
    with open(store_dir / TEXTS, encoding="utf-8") as fh:
        for row in range(0, n, window):
            stop = min(n, row + window)
            texts = [json.loads(fh.readline())["text"] for _ in range(row, stop)]
            todo = np.nonzero(done[row:stop] == 0)[0]
            yield from encode_plan(encoder, [texts[i] for i in todo], lengths[row:stop][todo],
                                   batch_tokens=batch_tokens, max_batch=max_batch, index=todo + row, pool=pool)


def extraction_warnings(store: LayerStore, lengths: np.ndarray, max_len: int) -> list[str]:
    """The lines a finished extraction reports: empty texts, truncated texts, texts with NUL bytes."""
    warnings: list[str] = []
    empty = store.empty_texts
    if empty:
        warnings.append(f"{empty:,} of {store.n:,} texts are empty or whitespace-only "
                        "(kept as rows so ids stay aligned)")
    truncated = int((np.asarray(lengths) > max_len).sum())
    if truncated:
        warnings.append(f"{truncated:,} of {store.n:,} texts are longer than {max_len} tokens and were "
                        f"truncated to {max_len}")
    nul = store.nul_texts
    if nul:
        fate = ("drops them, so they do not change the vectors" if store.nul_dropped_by_tokenizer
                else "encodes them as tokens, so they change the vectors")
        warnings.append(f"{nul:,} of {store.n:,} texts contain NUL bytes (\\x00); they are kept as is in "
                        f"texts.jsonl, and this model's tokenizer {fate}")
    return warnings


# ---------------------------------------------------------------- in-memory convenience

def embed(model, texts: list[str], *, engine: str | Engine = "auto", layers="all", poolings=None,
          batch_tokens: int | None = None, max_length: int | None = None,
          engine_options: dict | None = None, prompt_name: str | None = None,
          prompt: str | None = None) -> dict[tuple[str, str], np.ndarray]:
    """Pooled vectors of a small list of texts, in memory: ``{(pooling, layer): [n, hidden]}``.

    ``prompt_name``/``prompt`` choose the text put before each input as sentence-transformers does
    (by default the checkpoint's ``default_prompt_name``, if it has one)."""
    from layerscope.engines.registry import resolve_engine
    from layerscope.export.open import resolve_model
    from layerscope.limits import check_engine_options, check_limits
    from layerscope.extraction.prepare import check_request

    if not texts:
        raise InputError("no texts given")
    check_limits(batch_tokens=batch_tokens, max_length=max_length)
    check_engine_options(engine_options)
    # the engine looked up once: an unknown name or option is one line before the model is read
    choice = None if isinstance(engine, Engine) else resolve_engine(engine, engine_options)
    handle = engine.model if isinstance(engine, Engine) else resolve_model(model)
    # the same checks as extract, and before the engine starts (a 3B model's takes minutes)
    layer_list, pool_list, prompt_text = check_request(
        handle.manifest, str(getattr(handle, "spec", "the model")), layers=layers, poolings=poolings,
        max_length=max_length, prompt_name=prompt_name, prompt=prompt)
    if max_length is not None:  # before the engine starts
        from layerscope.model.tokenize import check_room

        check_room(handle.encoding_tokenizer(), max_length, prompt_text or "")
    if not isinstance(engine, Engine):
        from layerscope.extraction.engine_plan import EngineReads, early_exit

        plan = early_exit(handle.manifest, EngineReads.of(layer_list, pool_list))  # early exit: --layers decides
    eng = engine if isinstance(engine, Engine) else open_engine(
        handle, choice, **{**plan.as_kwargs(), **(engine_options or {})})
    manifest = eng.manifest
    out = {(p, l): np.zeros((len(texts), manifest.width_of([l])), np.float32) for p in pool_list for l in layer_list}
    for batch, pooled, _ in iter_pooled(eng, texts, layer_list, pool_list, batch_tokens=batch_tokens,
                                        max_length=max_length, prompt=prompt_text):
        for p in pool_list:
            for li, layer in enumerate(layer_list):
                out[p, layer][batch.index] = pooled[p][li]
    from layerscope.vocab.layers import LayerVectors

    return LayerVectors(out, manifest.num_layers)  # ("mean", 6), ("mean", -1) and ("mean", "6") as in a store
