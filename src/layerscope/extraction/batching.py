"""Batching: length-sorted token-budget batches, tokenized ahead of the engine on one background thread.

Every loop that feeds an engine goes through here: ``plan_batches`` groups rows by length under a
padded-token budget, ``encode_plan`` tokenizes the planned batches, ``Background`` runs that
tokenization on a thread a few batches ahead of the engine, and ``iter_pooled`` puts the three
together for texts held in memory (``extract`` feeds the same pieces from its spooled store).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Generic, Iterable, Iterator, TypeVar

import numpy as np

from layerscope.engines.base import Engine
from layerscope.errors import InputError
from layerscope.model.tokenize import Batch, Encoder

log = logging.getLogger("layerscope")

DEFAULT_BATCH_TOKENS = 16384
DEFAULT_MAX_BATCH = 256

T = TypeVar("T")


def plan_batches(lengths: np.ndarray, *, batch_tokens: int = DEFAULT_BATCH_TOKENS,
                 max_batch: int = DEFAULT_MAX_BATCH, max_length: int | None = None) -> list[np.ndarray]:
    """Indices into ``lengths`` grouped into batches: sorted by length, padded size <= batch_tokens.

    A single text longer than the budget still gets a batch of its own (it is truncated to
    ``max_length`` by the tokenizer, never dropped).
    """
    if batch_tokens < 1 or max_batch < 1:
        raise InputError("--batch-tokens and --max-batch must be positive")
    lengths = np.asarray(lengths, dtype=np.int64)
    if max_length is not None:
        lengths = np.minimum(lengths, max_length)
    order = np.argsort(lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    n = len(order)
    while start < n:
        end = start + 1
        while end < n and end - start < max_batch and lengths[order[end]] * (end - start + 1) <= batch_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


def encode_plan(encoder: Encoder, texts: list[str], lengths: np.ndarray, *, batch_tokens: int, max_batch: int,
                index: np.ndarray | None = None, pool=None) -> Iterator[Batch]:
    """The planned batches of ``texts`` (token counts ``lengths``), tokenized one by one as they are asked for.

    ``index`` maps each text to its row in the corpus (default: its position in ``texts``); it becomes
    ``Batch.index``, where the engine's vectors are written back. ``pool`` (a ``TokenizerPool``) tokenizes
    several batches at once in its processes, handed back in the same order.
    """
    lengths = np.asarray(lengths)
    jobs = (([texts[i] for i in rows], rows if index is None else index[rows], lengths[rows])
            for rows in plan_batches(lengths, batch_tokens=batch_tokens, max_batch=max_batch,
                                     max_length=encoder.max_length))
    if pool is not None:
        yield from pool.map(jobs)
        return
    for batch_texts, rows, counts in jobs:
        yield encoder(batch_texts, index=rows, lengths=counts)


def tokenizer_pool(eng: Engine, encoder: Encoder):
    """A ``TokenizerPool`` where a measurement recorded on this CPU says one tokenizer cannot keep ``eng`` fed
    (model/tokenize_pool.py), else None (the one background thread)."""
    from layerscope.engines.speed_order import cpu_identity
    from layerscope.model.tokenize_pool import TokenizerPool, processes_for

    count, why = processes_for(eng.manifest.source.weights_sha256, eng.name, cpu=cpu_identity()[0])
    if count < 2:
        return None
    log.info("%s", why)
    return TokenizerPool(encoder, count)


def check_long_texts(eng: Engine, lengths: np.ndarray, max_length: int, *, tokens: bool = False) -> str | None:
    """Before the first batch: refuse a run whose longest text cannot fit in memory (engines/memory.py; ``tokens``:
    the run fetches token states), and return (and log) the line saying how many texts ``max_length`` cuts, None
    when it cuts none."""
    from layerscope.engines.memory import check_longest_text

    lengths = np.asarray(lengths)
    if lengths.size:
        check_longest_text(eng, int(min(int(lengths.max()), int(max_length))), tokens=tokens)
    cut = int((lengths > max_length).sum())
    if not cut:
        return None
    line = (f"{cut:,} of {lengths.size:,} texts are longer than {max_length} tokens and were truncated to "
            f"{max_length}")
    manifest = eng.manifest
    note = manifest.default_length_note() if max_length == manifest.max_length else None
    limit = ("the model's position limit" if manifest.length_limit and max_length >= int(manifest.length_limit)
             else note or "--max-length")
    log.warning("%s of %s texts are longer than %s tokens and will be truncated to %s (%s; the longest has %s)",
                f"{cut:,}", f"{lengths.size:,}", max_length, max_length, limit, f"{int(lengths.max()):,}")
    return line


def check_finite(pooled: dict[str, np.ndarray], layers: list[str], batch: Batch) -> dict[str, np.ndarray]:
    """``pooled`` as the engine gave it, or one line naming the first layer whose vectors hold NaN or inf.

    A model with broken weights (or one that overflows its precision) gives non-finite vectors; stored,
    they would turn every later figure into NaN or a silent tie, so no engine's output passes unchecked.
    """
    for mode, arr in pooled.items():
        if np.isfinite(arr).all():
            continue
        bad = ~np.isfinite(arr).reshape(arr.shape[0], arr.shape[1], -1).all(axis=2)  # [layer, text]
        li = int(np.nonzero(bad.any(axis=1))[0][0])
        rows = np.nonzero(bad[li])[0]
        first = int(np.asarray(batch.index)[rows[0]])
        more = f" and {len(rows) - 1:,} other texts of its batch" if len(rows) > 1 else ""
        raise InputError(f"the model gives non-finite vectors (NaN or inf) at layer {layers[li]} ({mode} pooling, "
                         f"row {first}{more}): its weights hold NaN/inf or its activations overflow; "
                         "check the checkpoint (layerscope export refuses such a model)")
    return pooled


_END = object()


class Background(Generic[T]):
    """Runs an iterator on its own thread, up to ``depth`` items ahead of the one consuming it.

    Iterating gives the items in order; an error raised by the iterator is raised again on the
    consuming thread. ``close`` (or leaving the ``with`` block) stops the thread after its current
    item, and the iterator's own cleanup (a generator's ``finally``) runs on that thread.
    """

    def __init__(self, items: Iterable[T], *, depth: int = 4, name: str = "layerscope-tokenize"):
        self._items = iter(items)
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consuming thread, which raises it
            self._error = exc
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()
        self._put(_END)

    def __iter__(self) -> Iterator[T]:
        while True:
            item = self._q.get()
            if item is _END:
                if self._error is not None:
                    raise self._error
                return
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            self._thread.join(timeout=0.1)

    def __enter__(self) -> Background[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iter_pooled(eng: Engine, texts: list[str], layers: list[str], poolings: list[str], *,
                batch_tokens: int | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                max_length: int | None = None, background: bool = True, depth: int = 4, prompt: str = ""
                ) -> Iterator[tuple[Batch, dict[str, np.ndarray], float]]:
    """In-memory texts -> (batch, pooled, engine seconds): length-sorted token-budget batches,
    tokenized on a background thread (``background``) so tokenization overlaps the engine."""
    encoder = eng.encoder(max_length, prompt)
    lengths = encoder.token_lengths(texts)
    check_long_texts(eng, lengths, encoder.max_length)
    pool = tokenizer_pool(eng, encoder) if background else None
    batches = encode_plan(encoder, texts, lengths, pool=pool,
                          batch_tokens=int(batch_tokens or eng.preferred_batch_tokens), max_batch=max_batch)
    waited = [0.0]  # seconds the engine spent waiting for the tokenizer

    def timed(feed: Iterable[Batch]) -> Iterator[Batch]:
        items = iter(feed)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                waited[0] += time.perf_counter() - t0
            yield item

    # the pool outlives the thread that reads from it
    with pool if pool is not None else contextlib.nullcontext(), \
            Background(batches, depth=depth) if background else contextlib.closing(batches) as feed:
        t = time.perf_counter()
        # an engine with several batches in flight hands them back in order: a batch's seconds are those
        # since the previous hand-back, less the waits for the tokenizer
        for batch, pooled in eng.run_stream(timed(feed), layers, poolings):
            pooled = check_finite(pooled, layers, batch)
            now = time.perf_counter()
            yield batch, pooled, max(0.0, now - t - waited[0])
            t, waited[0] = time.perf_counter(), 0.0

