"""``extract --shard i/N``: one of N independent processes writing one store, no cluster needed.

Each process (a Slurm array task, a process per GPU, a process per machine on shared storage) runs the
same command with its own ``i``. The first to arrive makes the store under the store lock (spools the
corpus, reserves the arrays, records the range plan); the others wait for the lock and reopen it. Each
then writes the ranges ``k`` with ``k % N == i`` straight into the store (``range_writer``), claiming
each first (``store_ranges``), so a shard run twice, or two shards given the same ``i``, never write a
range at the same time and a rerun skips what is done. The shard that sees every range done finishes
the store (``range_run.finish``: a check and the checksums, no data moved); ``--shard finish`` does the
same by hand, ``--shard status`` counts ranges done, claimed and missing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from layerscope.errors import InputError
from layerscope.extraction import range_run
from layerscope.extraction.executor import ExtractReport, RangeWork
from layerscope.store import store_ranges
from layerscope.store.store_record import StoreRecord
from layerscope.extraction.request import ExtractionRequest

LOCK_WAIT_S = 3600.0  # how long a shard waits for the first one to spool the corpus (LAYERSCOPE_SHARD_LOCK_WAIT)


def _env_number(name: str, default: float, *, multiple: int = 0) -> float:
    """A positive number from environment variable ``name`` (docs/SCALE_OUT.md), else ``default``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text) if not multiple else int(text)
    except ValueError:
        value = -1
    if not value > 0 or (multiple and value % multiple):
        what = f"a positive multiple of {multiple}" if multiple else "a positive number of seconds"
        raise InputError(f"{name}={text!r}: it must be {what}, or unset")
    return value


@dataclass(frozen=True)
class Shard:
    """The ``--shard i/N`` executor (extraction/executor.py): shard ``index`` of ``count`` processes."""

    index: int
    count: int
    range_rows: int | None = None  # rows per range of a store this shard makes (a multiple of GRANULE)

    def run(self, request: ExtractionRequest) -> ExtractReport:
        return extract_shard(request, self.index, self.count, range_rows=self.range_rows)


def extract_shard(req: ExtractionRequest, index: int, count: int, *, range_rows: int | None = None) -> ExtractReport:
    """Write shard ``index`` of ``count`` of ``req`` into its store; finish the store when it is the last."""
    from layerscope.extraction.range_writer import RangeWriter

    if req.tokens:
        raise InputError("--tokens is not supported with --shard yet; run without it")
    if req.force:
        raise InputError("--force with --shard would let each shard replace the others' work; remove the store "
                         "(or choose another --out) and run the shards without --force")
    if not 0 <= index < count:
        raise InputError(f"--shard {index}/{count}: the index must be at least 0 and below {count}")
    t0 = time.perf_counter()
    range_rows = range_rows or int(_env_number("LAYERSCOPE_RANGE_ROWS", 0, multiple=store_ranges.GRANULE)) or None
    lock_wait = _env_number("LAYERSCOPE_SHARD_LOCK_WAIT", LOCK_WAIT_S)
    # every shard but the first finds the store made: it continues it, with the same checks as --resume
    from dataclasses import replace

    req = replace(req, resume=True)
    with range_run.waiting_writer(req.out, lock_wait):
        ex, store = range_run.open_or_create(req, range_rows=range_rows)
    if store.complete:
        return _report(store, RangeWork(0, 0, 0, shard=(index, count)), {}, 0, 0, 0, time.perf_counter() - t0, 0.0)
    mine = store_ranges.shard_ranges(range_run.ranges_of(store), index, count)
    done_rows = store.done_mask()
    sid = range_run.store_id(store)
    todo = [r for r in mine
            if not store_ranges.is_done(store.path, r.k, sid) and not bool(done_rows[r.start:r.stop].all())]
    computed = claimed = rows = tokens = 0
    engine: dict = {}
    t_run = time.perf_counter()
    if todo:
        from layerscope.extraction.prepare import check_ranges_fit

        check_ranges_fit(ex, ex.choice, todo)  # the longest text fits in memory: checked before the engine starts
        eng = range_run.open_engine_for(ex, req)
        writer = RangeWriter(store.path, eng, layers=ex.layers, poolings=ex.poolings,
                             store_dtype=ex.spec.dtype, max_length=ex.max_length, prompt=ex.spec.prompt,
                             batch_tokens=req.batch_tokens, max_batch=ex.max_batch, store_id=sid)
        for r in todo:
            writer.check_store(r)
            claim = store_ranges.try_claim(store.path, r.k, sid)
            if claim is None:
                claimed += not store_ranges.is_done(store.path, r.k, sid)
                continue
            try:
                report = writer.run(r, claim)
            finally:
                claim.release()
            computed += 1
            rows += r.rows
            tokens += report.tokens
        engine = eng.info.to_dict()  # after its ranges: what ran (attention moved to blocks on a long batch)
    run_seconds = time.perf_counter() - t_run
    record = _finish_if_last(store)
    work = RangeWork(len(mine), computed, len(mine) - len(todo), held_elsewhere=claimed, shard=(index, count),
                     finished=record is not None)
    before = sum(r.rows for r in mine) - sum(r.rows for r in todo)
    return _report(store, work, engine, rows, before, tokens, time.perf_counter() - t0, run_seconds, record)


def _report(store, work: RangeWork, engine: dict, rows: int, before: int, tokens: int, seconds: float,
            run_seconds: float, record: StoreRecord | None = None) -> ExtractReport:
    """What one shard did (``before``: rows of its ranges done before it ran); what only the finished store
    knows (truncation, warnings) when this shard finished it."""
    from layerscope.store.store import LayerStore

    if record is not None:
        store = LayerStore.open(store.path)
    return ExtractReport(store=store, n=store.n, empty=store.empty_texts,
                         truncated=None if record is None else record.truncated_texts, tokens=tokens,
                         seconds=seconds, engine=engine, run_seconds=run_seconds, resumed_rows=before,
                         warnings=[] if record is None else list(record.warnings or ()), complete=store.complete,
                         rows=rows, ranges=work)


def _finish_if_last(store) -> StoreRecord | None:
    """Finish the store when every range is done and no other process holds its lock (else leave it); what
    ``finish`` recorded, or None when this process did not finish it."""
    from layerscope.store.store import LayerStore
    from layerscope.store.store_lock import StoreLockedError, store_writer

    if not range_run.range_status(store).complete:
        return None
    try:
        with store_writer(store.path):
            fresh = LayerStore.open(store.path, allow_incomplete=True)
            if fresh.complete:
                return None
            fresh.mode = "r+"
            return range_run.finish(fresh)
    except StoreLockedError:  # another shard is finishing it
        return None


def shard_status(out) -> tuple[store_ranges.RangeStatus, int, bool]:
    """(range status, ranges in the plan, complete) of the store at ``out``."""
    from layerscope.store.store import LayerStore

    store = LayerStore.open(out, allow_incomplete=True)
    if store.complete:
        count = len(range_run.ranges_of(store)) if store.range_rows else 0
        return store_ranges.RangeStatus(list(range(count)), [], [], []), count, True
    return range_run.range_status(store), len(range_run.ranges_of(store)), False


def shard_finish(out) -> StoreRecord | None:
    """``--shard finish``: check every range and write the checksums (under the store lock); the store's
    record as finished, or None when it was complete already."""
    from layerscope.store.store import LayerStore
    from layerscope.store.store_lock import store_writer

    with store_writer(out):
        store = LayerStore.open(out, allow_incomplete=True)
        if store.complete:
            return None
        store.mode = "r+"
        return range_run.finish(store)
