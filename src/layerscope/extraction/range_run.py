"""The steps every range executor (``--shard i/N``, Ray) shares: make or reopen the store under its lock,
open the engine, and the merge-free finish that checks every range and writes the checksums.

The in-process ``extract`` shares ``prepare`` and ``spool`` (``prepare.create_store``) and resume checks
(``prepare.open_to_resume``) with these; its loop differs only in writing batches as they come.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import InputError, StoreError
from layerscope.store import store_ranges
from layerscope.extraction.prepare import (Extraction, create_store, make_store_dir, open_to_resume, prepare_request,
                                        spool_store)
from layerscope.extraction.request import ExtractionRequest
from layerscope.store.store_layout import LENGTHS, StoreLayout
from layerscope.store.store import LayerStore
from layerscope.store.store_record import HalfError, RangePlan, StoreRecord


def open_or_create(req: ExtractionRequest, *, range_rows: int | None = None,
                   engine_runs_here: bool = True) -> tuple[Extraction, LayerStore]:
    """Prepare ``req`` and make its store (spooled, arrays reserved, plan recorded) or reopen it to continue.

    The caller holds the store lock. A store made by the in-process ``extract`` gets a plan here too.
    """
    from layerscope.model.tokenize import Encoder

    ex = prepare_request(req, engine_runs_here=engine_runs_here)
    make_store_dir(ex)
    reader = req.reader.as_kwargs()
    store = open_to_resume(ex, req.source, reader)
    if store is None:
        encoder = Encoder(ex.handle.encoding_tokenizer(), list(ex.manifest.inputs), ex.max_length, ex.prompt)
        spooled = spool_store(ex, req.source, reader, encoder, lengths_now=False)
        store = create_store(ex, spooled, range_rows=range_rows)
    elif store.range_rows is None:  # begun by the in-process extract: cut it now
        from layerscope.store.store_dtype import itemsize

        row_bytes = store.hidden_size * itemsize(store.dtype) * len(store.layers) * len(store.poolings)
        rows = int(range_rows or store_ranges.range_rows(store.n, row_bytes))
        relied_on = {k: v for k, v in store.internal_sha256.items() if k != LENGTHS}
        store.update(ranges=RangePlan(rows, -(-store.n // rows)),
                     internal_sha256=relied_on)  # range writers write their rows' lengths again
    if not store.complete and not store.store_id:  # made before stores had an identity
        import secrets

        store.update(store_id=secrets.token_hex(16))
    return ex, store


def store_id(store: LayerStore) -> str | None:
    """The identity the store was made with: every claim and done mark names it."""
    return store.store_id


def ranges_of(store: LayerStore) -> list[store_ranges.Range]:
    rows = store.range_rows
    if not rows:
        raise StoreError(f"{store.path} records no range plan (made by an older layerscope); finish it with "
                         "layerscope extract ... --resume")
    offsets = store_ranges.load_offsets(store.path, store.record.internal_sha256, store.n)
    return store_ranges.plan(store.n, rows, offsets)


def range_status(store: LayerStore) -> store_ranges.RangeStatus:
    return store_ranges.status(store.path, ranges_of(store), store.done_mask(), store_id(store))


def open_engine_for(ex: Extraction, req: ExtractionRequest):
    """The run's engine in this process, with the options every executor uses (``engine_plan``). What
    ``--engine auto`` picked goes into each range's done mark, and ``finish`` refuses a store whose ranges
    were made with different variants."""
    from layerscope.export.open import open_engine
    from layerscope.extraction.engine_plan import engine_options

    options = engine_options(ex.spec, ex.manifest, dict(ex.choice.options))
    return open_engine(ex.handle, ex.choice, **options.as_kwargs())


def ran_on(marks, made: dict[str, Any]) -> dict[str, Any]:
    """The engine record of a store written range by range: the first range's, with every note the engines of
    the others added (an engine under ``attention=auto`` moves its attention to blocks at its first batch past
    1,024 tokens, in whichever range that is, and says so); ``made``: the store's own where no range says."""
    records = [dict(m.engine) for m in marks if m.engine]
    if not records:
        return made
    notes = list(records[0].get("notes") or [])
    for record in records[1:]:
        notes += [n for n in record.get("notes") or [] if n not in notes]
    return {**records[0], "notes": notes}


def finish(store: LayerStore, *, extra: dict[str, Any] | None = None) -> StoreRecord:
    """Check every range is done, mark every row done and write the checksums: no data is moved.

    The caller holds the store lock. Returns the store's record as finished (tokens, engine, half-size error;
    ``extra``: what the executor records for people).
    """
    from layerscope.extraction.pipeline import extraction_warnings

    ranges = ranges_of(store)
    st = store_ranges.status(store.path, ranges, store.done_mask(), store_id(store))
    foreign = store_ranges.foreign_marks(store.path, store_id(store))
    if foreign and not st.complete:
        raise StoreError(f"{store.path}: ranges {foreign[:8]} were marked done by a writer of another store (one "
                         "deleted and made again at this path while it ran); their rows are not this store's: run "
                         "those shards again (layerscope extract ... --shard i/N)")
    if not st.complete:
        todo = len(st.missing) + len(st.claimed) + len(st.stale)
        raise StoreError(f"{store.path}: {todo} of {len(ranges)} ranges are not done ({len(st.claimed)} being "
                         f"written, {len(st.stale)} left by a worker that died, {len(st.missing)} not started); "
                         "run the missing shards (layerscope extract ... --shard status lists them)")
    marks = [store_ranges.done_mark(store.path, r.k) for r in ranges]
    marks = [m for m in marks if m.store in (None, store_id(store))]
    engine = ran_on(marks, store.engine_info)
    variants = {m.variant for m in marks if m.variant_known}
    if len(variants) > 1:
        raise StoreError(f"{store.path}: its ranges were made with different variants ({sorted(map(str, variants))}: "
                         "--engine auto picked differently on different machines); pass --engine and --variant, "
                         "and redo the store")
    spec = store.spec
    batch_tokens = next((m.batch_tokens for m in marks if m.batch_tokens), None)
    half = store.half_error
    for m in marks:  # each range's done mark: (error, cosine) per pooling/layer
        for key, (err, cos) in m.half_error.items():
            half[key] = half.get(key, HalfError()).worst(err, cos)
    if store.dtype != "float32":
        from layerscope.store.store_dtype import check_error_bar

        check_error_bar(store.path, store.dtype, half)
    done = np.load(StoreLayout(store.path).done, mmap_mode="r+")
    done[:] = 1
    done.flush()
    del done
    store.close()
    from layerscope.store.npy_files import load_internal

    lengths = load_internal(store.path, LENGTHS, store.record.internal_sha256, np.dtype(np.int32), (store.n,))
    max_len = spec.max_length
    # what the ranges ran with, recorded beside the settings (the spec is as the store was made)
    ran = {"variant": next(iter(variants)) if variants else spec.variant,
           "batch_tokens": int(batch_tokens) if batch_tokens else spec.batch_tokens}
    store.finish(engine=engine, ran=ran, truncated_texts=int((lengths > max_len).sum()),
                 warnings=tuple(extraction_warnings(store, lengths, max_len)),
                 tokens=int(np.minimum(lengths, max_len).sum()), half_error=half, extra=extra or {})
    shutil.rmtree(StoreLayout(store.path).ranges, ignore_errors=True)
    return store.record


def parse_shard(spec: str) -> tuple[str, int, int]:
    """``i/N`` -> ("run", i, N); ``status`` / ``finish`` -> (that, 0, 0); one line otherwise."""
    if spec in ("status", "finish"):
        return spec, 0, 0
    i, sep, n = spec.partition("/")
    if sep and i.strip().isdigit() and n.strip().isdigit() and 0 <= int(i) < int(n):
        return "run", int(i), int(n)
    raise InputError(f"--shard takes i/N with 0 <= i < N (e.g. 0/4, the first of four), 'status' or 'finish'; "
                     f"not {spec!r}")


def waiting_writer(out: Path, wait_s: float):
    """The store's writer lock (``store_lock.store_writer``: the lock, and the record of what was written),
    waiting while another shard holds it to make the store (or finish it). Use as ``with waiting_writer(...)``."""
    import contextlib

    from layerscope.store.store_lock import StoreLockedError, store_writer

    deadline = time.monotonic() + wait_s
    while True:
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(store_writer(out))
            return stack
        except StoreLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
