"""Extraction: corpus -> length-sorted token-budget batches -> engine -> pooled vectors -> LayerStore.

Memory is bounded by a window of rows (``window``), not by the corpus: the
texts are spooled once into the store's ``texts.jsonl`` with their token
lengths, then read back a window at a time, sorted by length inside the
window and cut into batches whose padded size stays under ``batch_tokens``.
Tokenization runs on a background thread so it overlaps the engine.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

import layerscope
from layerscope.engines.base import Engine, resolve_layers
from layerscope.model.tokenize import Batch, Encoder
from layerscope.export.open import open_engine
from layerscope.errors import InputError, StoreError
from layerscope.runtime.pooling import check_poolings
from layerscope.runtime.store import STORE_JSON, TEXTS, LayerStore

log = logging.getLogger("layerscope")

DEFAULT_BATCH_TOKENS = 16384
DEFAULT_MAX_BATCH = 256
DEFAULT_WINDOW = 65536
LENGTH_CHUNK = 4096


@dataclass
class ExtractReport:
    store: LayerStore
    n: int
    empty: int
    truncated: int
    tokens: int
    seconds: float  # the whole call: engine start, reading the corpus, extraction
    engine: dict[str, Any]
    run_seconds: float = 0.0  # the extraction loop alone
    resumed_rows: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def texts_per_s(self) -> float:
        """Throughput of the extraction loop over the rows this run computed."""
        rows = self.n - self.resumed_rows
        return rows / self.run_seconds if self.run_seconds > 0 else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.run_seconds if self.run_seconds > 0 else float("nan")


# ---------------------------------------------------------------- planning

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


# ---------------------------------------------------------------- spooling the corpus

def _spool_corpus(records: Iterable, out: Path, encoder: Encoder) -> dict[str, Any]:
    """Write texts.jsonl (atomically) and lengths.npy; return counts and the content hash."""
    texts_tmp = out / (TEXTS + ".partial")
    lengths: list[np.ndarray] = []
    h = hashlib.sha256()
    n = empty = nul = 0
    chunk: list[str] = []

    def flush_chunk():
        if chunk:
            lengths.append(encoder.token_lengths(chunk))
            chunk.clear()

    with open(texts_tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            line = record_line(rec)
            fh.write(line + "\n")
            h.update(line.encode("utf-8") + b"\n")
            n += 1
            if not rec.text.strip():
                empty += 1
            if "\x00" in rec.text:
                nul += 1
            chunk.append(rec.text)
            if len(chunk) >= LENGTH_CHUNK:
                flush_chunk()
        flush_chunk()
        fh.flush()
        os.fsync(fh.fileno())
    if n == 0:
        texts_tmp.unlink()
        raise InputError("the corpus has no texts: nothing to extract")
    all_lengths = np.concatenate(lengths).astype(np.int32)
    np.save(out / "lengths.npy", all_lengths)
    os.replace(texts_tmp, out / TEXTS)
    return {"n": n, "empty": empty, "nul": nul, "sha256": h.hexdigest()}


def record_line(rec) -> str:
    """One row of texts.jsonl; the corpus hash that --resume checks is the sha256 of these lines."""
    return json.dumps({"id": rec.id, "text": rec.text}, ensure_ascii=False)


def _corpus_sha256(records: Iterable) -> str:
    """The hash ``_spool_corpus`` records for these records, without writing anything."""
    h = hashlib.sha256()
    for rec in records:
        h.update(record_line(rec).encode("utf-8") + b"\n")
    return h.hexdigest()


def _records_from(source, *, text_field=None, column=None, id_field=None, fmt=None):
    from layerscope.runtime.corpus import CorpusStats, Record, iter_corpus

    if isinstance(source, (list, tuple)):
        if not source:
            raise InputError("no texts given: nothing to extract")
        for i, t in enumerate(source):
            if not isinstance(t, str):
                raise InputError(f"text {i} is a {type(t).__name__}, not a string")
        return (Record(str(i), t, i + 1) for i, t in enumerate(source)), None
    stats = CorpusStats()
    return iter_corpus(source, text_field=text_field, column=column, id_field=id_field, fmt=fmt,
                       stats=stats), stats


# ---------------------------------------------------------------- background tokenization

class _Prefetcher:
    """Reads a window of texts, plans its batches and tokenizes them on a background thread."""

    _END = object()

    def __init__(self, store_dir: Path, lengths: np.ndarray, done: np.ndarray, encoder: Encoder, *,
                 batch_tokens: int, max_batch: int, window: int, depth: int = 4):
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.args = (store_dir, lengths, done, encoder, batch_tokens, max_batch, window)
        self.thread = threading.Thread(target=self._work, name="layerscope-tokenize", daemon=True)
        self.thread.start()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _work(self):
        store_dir, lengths, done, encoder, batch_tokens, max_batch, window = self.args
        try:
            with open(store_dir / TEXTS, encoding="utf-8") as fh:
                row = 0
                n = len(lengths)
                while row < n and not self.stop.is_set():
                    stop = min(n, row + window)
                    texts = [json.loads(fh.readline())["text"] for _ in range(row, stop)]
                    todo = np.nonzero(done[row:stop] == 0)[0]
                    if len(todo):
                        for local in plan_batches(lengths[row:stop][todo], batch_tokens=batch_tokens,
                                                  max_batch=max_batch, max_length=encoder.max_length):
                            rows = todo[local]
                            batch = encoder([texts[i] for i in rows], index=rows + row,
                                            lengths=lengths[row:stop][rows])
                            if not self._put(batch):
                                return
                    row = stop
        except BaseException as exc:  # handed to the main thread, which raises it
            self.error = exc
        self._put(self._END)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            item = self.q.get()
            if item is self._END:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)


# ---------------------------------------------------------------- the run

def _drops_nul(encoder: Encoder) -> bool:
    """Whether this tokenizer ignores NUL bytes (BERT-style cleaning) or encodes them (byte-level BPE)."""
    with_nul, without = encoder.token_lengths(["a\x00\x00\x00b c", "ab c"])
    return bool(with_nul == without)


@contextlib.contextmanager
def _cleanup_on_failure(out: Path, where) -> Iterator[dict]:
    """Make (or replace) the store directory; if the run fails before any row is stored, remove what it
    made (the directory too when it made it), so no empty store or ``.partial`` file is left behind.
    A store with rows done, or one this run resumed, is kept. Ctrl-C becomes ``Interrupted`` with the count.
    """
    from layerscope.errors import Interrupted
    from layerscope.ownership import MARKER, clear_own, remove, remove_if_empty, write_marker

    earlier = where.kind is not None and not where.replace  # a store that was there before: never removed
    if where.replace:
        remove(out, "store")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).exists():
        write_marker(out, "store")
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


def _settings(handle, engine_name, layers, poolings, dtype, batch_tokens, max_batch, max_length, source_desc):
    return {
        "model": handle.spec, "model_key": handle.key, "engine_requested": engine_name,
        "layers": layers, "poolings": poolings, "dtype": dtype, "batch_tokens": batch_tokens,
        "max_batch": max_batch, "max_length": max_length, "input": source_desc,
        "layerscope_version": layerscope.__version__,
    }


def profile_max_seq(lengths: np.ndarray, max_length: int) -> int:
    """The longest sequence a run will feed: the corpus's longest text, capped by ``max_length``."""
    longest = int(lengths.max()) if lengths.size else 1
    return max(1, min(int(max_length), longest))


_MATCH_KEYS = ("model_key", "layers", "poolings", "dtype", "max_length", "input", "variant", "prompt")


def _one_writer(fn: Callable) -> Callable:
    """Run ``fn`` holding the store's write lock; a full disk (or file-size limit) becomes one line."""

    @functools.wraps(fn)
    def wrapper(model, source, out, *args, **kwargs):
        from layerscope.runtime.store_lock import store_lock
        from layerscope.runtime.store_space import FULL

        with store_lock(out):
            try:
                return fn(model, source, out, *args, **kwargs)
            except OSError as exc:
                if exc.errno not in FULL:
                    raise
                where = f" ({exc.filename})" if exc.filename else ""
                raise StoreError(f"no space left writing {out}{where}: {exc.strerror}; free some space and "
                                 "re-run with --resume") from None

    return wrapper


@_one_writer
def extract(model, source, out: str | Path, *, engine: str | Engine = "auto", layers="all",
            poolings=("mean",), dtype: str = "float32", batch_tokens: int | None = None,
            max_batch: int = DEFAULT_MAX_BATCH, max_length: int | None = None, resume: bool = False,
            force: bool = False, window: int = DEFAULT_WINDOW, text_field=None, column=None,
            id_field=None, fmt=None, progress: bool | Callable = False,
            engine_options: dict | None = None, prompt_name: str | None = None,
            prompt: str | None = None) -> ExtractReport:
    """Extract pooled per-layer vectors of every text in ``source`` into a LayerStore at ``out``."""
    from layerscope.model.handle import ModelHandle
    from layerscope.limits import check_engine_options, check_limits, check_max_length
    from layerscope.ownership import claim

    if dtype not in ("float32", "float16"):
        raise InputError(f"--dtype must be float32 or float16, not {dtype}")
    check_limits(batch_tokens=batch_tokens, max_batch=max_batch, max_length=max_length)
    check_engine_options(engine_options)
    out = Path(out)
    existing = out / STORE_JSON
    # --force replaces only a store layerscope made that does not hold the corpus; nothing is deleted yet
    where = claim(out, "store", force=force and not resume, keep=resume,
                  inputs=[source] if isinstance(source, (str, Path)) else [])
    if isinstance(engine, Engine):
        eng = engine
        handle = eng.model
    else:
        handle = model if isinstance(model, ModelHandle) else ModelHandle.resolve(model)
        eng = None
    manifest = handle.manifest
    check_max_length(max_length, manifest, handle.spec)
    layer_list = resolve_layers(layers, manifest["num_layers"])
    if poolings is None:  # the model's own: st for a sentence-transformers checkpoint
        from layerscope.runtime.pooling import default_poolings

        poolings = default_poolings(manifest)
    pool_list = check_poolings(poolings if not isinstance(poolings, str) else poolings.split(","))
    if "eos" in pool_list and not manifest.get("pooled_output"):
        raise InputError(f"pooling 'eos' needs a model with its own pooled output (CLIP); "
                         f"{manifest['family']} has none: use 'last' or 'mean'")
    if "st" in pool_list:
        from layerscope.model.stconfig import st_recipe

        st_recipe(manifest)  # a clear error before anything is written
    from layerscope.model.stconfig import resolve_prompt

    prompt_text = resolve_prompt(manifest, prompt_name, prompt)
    max_len = int(max_length or manifest["max_length"])
    source_desc = source if isinstance(source, (str, Path)) else f"<{len(source)} texts in memory>"
    settings = _settings(handle, engine if isinstance(engine, str) else engine.name, layer_list, pool_list,
                         dtype, batch_tokens, max_batch, max_len, str(source_desc))
    variant = (engine_options or {}).get("variant") or getattr(engine, "variant", None)
    settings["variant"] = variant if variant not in ("", "fp32") else None  # resuming must not mix precisions
    settings["prompt"] = prompt_text or None
    t0 = time.perf_counter()
    with _cleanup_on_failure(out, where) as state:
        return _extract_into(
            out, state, existing=existing, resume=resume, handle=handle, eng=eng, engine=engine,
            engine_options=engine_options, manifest=manifest, settings=settings, layer_list=layer_list,
            pool_list=pool_list, dtype=dtype, batch_tokens=batch_tokens, max_batch=max_batch, max_len=max_len,
            source=source, window=window, progress=progress, t0=t0,
            reader=dict(text_field=text_field, column=column, id_field=id_field, fmt=fmt))


def _extract_into(out: Path, state: dict, *, existing, resume, handle, eng, engine, engine_options, manifest,
                  settings, layer_list, pool_list, dtype, batch_tokens, max_batch, max_len, source, window,
                  progress, t0, reader) -> ExtractReport:
    """The run itself, inside the directory ``_cleanup_on_failure`` prepared (``state['store']``: the store)."""
    store: LayerStore | None = None
    stats = None
    if existing.exists() and resume:
        store = LayerStore.open(out, allow_incomplete=True)
        store.mode = "r+"
        for key in _MATCH_KEYS:
            if key == "variant" and eng is None and engine == "auto":
                continue  # what auto picks is known once it has picked (checked below)
            if store.settings.get(key) != settings.get(key):
                raise StoreError(f"{out} was made with {key}={store.settings.get(key)!r}, this run asks for "
                                 f"{settings.get(key)!r}; use another --out or drop --resume (and use --force)")
        recorded = store.settings.get("corpus_sha256")
        records, _ = _records_from(source, **reader)
        if recorded and _corpus_sha256(records) != recorded:
            raise StoreError(f"{out} was made from another version of {settings['input']} (its texts or ids changed "
                             "since); drop --resume and use --force, or choose another --out")
        if store.complete:
            log.info("store already complete")
        state["store"] = store
    from layerscope.model.tokenize import Encoder

    # the engine starts once the corpus is known: its profile (TensorRT) follows the longest text
    encoder = eng.encoder(max_len, settings["prompt"] or "") if eng is not None else \
        Encoder(handle.encoding_tokenizer(), manifest["inputs"], max_len, settings["prompt"] or "")
    created = False
    if store is None:
        records, stats = _records_from(source, **reader)
        spool = _spool_corpus(records, out, encoder)
        settings["corpus_sha256"] = spool["sha256"]
        store = LayerStore.create(out, n=spool["n"], layers=layer_list, poolings=pool_list,
                                  hidden_size=int(manifest["hidden_size"]), dtype=dtype,
                                  manifest=manifest, settings=settings)
        state["store"] = store
        store.update_meta({"empty_texts": spool["empty"], "nul_texts": spool["nul"],
                           "nul_dropped_by_tokenizer": _drops_nul(encoder) if spool["nul"] else None})
        created = True
    lengths = np.load(out / "lengths.npy")
    if eng is None:
        # TensorRT builds its optimization profile from the batching plan: at most max_batch texts of
        # the corpus's longest text (capped by max_length), not of the model's 32k context (other
        # engines ignore these). A store made for this run is removed by _cleanup_on_failure if the
        # engine does not start.
        options = {"max_batch": max_batch, "max_seq": profile_max_seq(lengths, max_len), **(engine_options or {})}
        eng = open_engine(handle, engine, **options)
        if engine == "auto":  # auto may pick a reduced-precision variant: record it, never mix it on resume
            picked = getattr(eng, "variant", None)
            settings["variant"] = picked if picked not in ("", "fp32") else None
            if not created and store.settings.get("variant") != settings["variant"]:
                raise StoreError(f"{out} was made with variant={store.settings.get('variant')!r}, --engine auto "
                                 f"picked {settings['variant']!r} now ({eng.info.notes[-1] if eng.info.notes else ''})"
                                 "; pass the same --min-cosine, or use another --out")
    batch_tokens = int(batch_tokens or eng.preferred_batch_tokens)
    settings["batch_tokens"] = batch_tokens
    if created:
        store.update_meta({"engine": eng.info.to_dict(), "settings": settings})
    done = store.done_mask()
    already = int(done.sum())
    truncated = int((lengths > max_len).sum())
    warnings: list[str] = []
    empty = int(store.meta.get("empty_texts", 0))
    if empty:
        warnings.append(f"{empty:,} of {store.n:,} texts are empty or whitespace-only "
                        "(kept as rows so ids stay aligned)")
    if truncated:
        warnings.append(f"{truncated:,} of {store.n:,} texts are longer than {max_len} tokens and were "
                        f"truncated to {max_len}")
    nul = int(store.meta.get("nul_texts", 0))
    if nul:
        fate = ("drops them, so they do not change the vectors" if store.meta.get("nul_dropped_by_tokenizer")
                else "encodes them as tokens, so they change the vectors")
        warnings.append(f"{nul:,} of {store.n:,} texts contain NUL bytes (\\x00); they are kept as is in "
                        f"texts.jsonl, and this model's tokenizer {fate}")
    todo_tokens = int(np.minimum(lengths, max_len)[done == 0].sum())
    tokens_done = 0
    rows_done = 0
    bar = _progress_bar(progress, store.n - already, todo_tokens)
    prefetch = _Prefetcher(out, lengths, done, encoder, batch_tokens=batch_tokens, max_batch=max_batch,
                           window=window)
    last_commit = t_run = time.perf_counter()
    pending: list[np.ndarray] = []
    try:
        for batch in prefetch:
            pooled = eng.run(batch, layer_list, pool_list)
            store.write(batch.index, pooled, layer_list)
            pending.append(batch.index)
            rows_done += batch.size
            tokens_done += batch.n_tokens
            if time.perf_counter() - last_commit > 2.0 or len(pending) >= 64:
                store.commit(np.concatenate(pending))
                pending.clear()
                last_commit = time.perf_counter()
            bar.advance(batch.size, batch.n_tokens)
        if pending:
            store.commit(np.concatenate(pending))
            pending.clear()
    except BaseException:
        if pending:  # rows already written: keep them, so --resume does not redo them
            store.commit(np.concatenate(pending))
        raise
    finally:
        prefetch.close()
        bar.close()
    if int(store.done_mask().sum()) != store.n:
        raise StoreError(f"{out}: {store.n - int(store.done_mask().sum())} rows are missing after the run; "
                         "run again with --resume")
    run_seconds = time.perf_counter() - t_run
    seconds = time.perf_counter() - t0
    store.finish({"engine": eng.info.to_dict(), "truncated_texts": truncated, "warnings": warnings,
                  "seconds": round(seconds, 3), "tokens": int(np.minimum(lengths, max_len).sum())})
    if stats is not None and stats.empty != empty:
        log.debug("corpus stats and spool disagree on empty texts")
    report = ExtractReport(store=store, n=store.n, empty=empty, truncated=truncated,
                           tokens=tokens_done, seconds=seconds, run_seconds=run_seconds,
                           engine=eng.info.to_dict(),
                           resumed_rows=already, warnings=warnings)
    return report


# ---------------------------------------------------------------- progress

class _NoBar:
    def advance(self, rows: int, tokens: int) -> None:
        pass

    def close(self) -> None:
        pass


class _RichBar:
    def __init__(self, total_rows: int, total_tokens: int):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.progress = Progress(
            TextColumn("[bold]extracting"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            transient=False,
        )
        self.task = self.progress.add_task("extract", total=total_rows, rate="")
        self.t0 = time.perf_counter()
        self.tokens = 0
        self.rows = 0
        self.progress.start()

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        dt = max(time.perf_counter() - self.t0, 1e-9)
        self.progress.update(self.task, advance=rows,
                             rate=f"{self.rows / dt:,.0f} texts/s  {self.tokens / dt:,.0f} tokens/s")

    def close(self) -> None:
        self.progress.stop()


def _progress_bar(progress, total_rows: int, total_tokens: int):
    if callable(progress):
        return progress(total_rows, total_tokens)
    return _RichBar(total_rows, total_tokens) if progress else _NoBar()


# ---------------------------------------------------------------- in-memory convenience

def embed(model, texts: list[str], *, engine: str | Engine = "auto", layers="all", poolings=("mean",),
          batch_tokens: int | None = None, max_length: int | None = None,
          engine_options: dict | None = None, prompt_name: str | None = None,
          prompt: str | None = None) -> dict[tuple[str, str], np.ndarray]:
    """Pooled vectors of a small list of texts, in memory: ``{(pooling, layer): [n, hidden]}``.

    ``prompt_name``/``prompt`` choose the text put before each input as sentence-transformers does
    (by default the checkpoint's ``default_prompt_name``, if it has one)."""
    from layerscope.model.stconfig import resolve_prompt

    from layerscope.limits import check_engine_options, check_limits, check_max_length

    if not texts:
        raise InputError("no texts given")
    check_limits(batch_tokens=batch_tokens, max_length=max_length)
    check_engine_options(engine_options)
    eng = engine if isinstance(engine, Engine) else open_engine(model, engine, **(engine_options or {}))
    manifest = eng.manifest
    check_max_length(max_length, manifest, str(getattr(eng.model, "spec", "the model")))
    layer_list = resolve_layers(layers, manifest["num_layers"])
    pool_list = check_poolings(poolings if not isinstance(poolings, str) else poolings.split(","))
    if "st" in pool_list:
        from layerscope.model.stconfig import st_recipe

        st_recipe(manifest)
    prompt_text = resolve_prompt(manifest, prompt_name, prompt)
    out = {(p, l): np.zeros((len(texts), manifest["hidden_size"]), np.float32) for p in pool_list for l in layer_list}
    for batch, pooled, _ in iter_pooled(eng, texts, layer_list, pool_list, batch_tokens=batch_tokens,
                                        max_length=max_length, prompt=prompt_text):
        for p in pool_list:
            for li, layer in enumerate(layer_list):
                out[p, layer][batch.index] = pooled[p][li]
    return out


def iter_pooled(eng: Engine, texts: list[str], layers: list[str], poolings: list[str], *,
                batch_tokens: int | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                max_length: int | None = None, background: bool = True, depth: int = 4, prompt: str = ""
                ) -> Iterator[tuple[Batch, dict[str, np.ndarray], float]]:
    """In-memory texts -> (batch, pooled, engine seconds): length-sorted token-budget batches,
    tokenized on a background thread (``background``) so tokenization overlaps the engine."""
    encoder = eng.encoder(max_length, prompt)
    lengths = encoder.token_lengths(texts)
    batch_tokens = int(batch_tokens or eng.preferred_batch_tokens)
    plan = plan_batches(lengths, batch_tokens=batch_tokens, max_batch=max_batch, max_length=encoder.max_length)

    def make(rows):
        return encoder([texts[i] for i in rows], index=rows, lengths=lengths[rows])

    if not background:
        for rows in plan:
            batch = make(rows)
            t = time.perf_counter()
            pooled = eng.run(batch, layers, poolings)
            yield batch, pooled, time.perf_counter() - t
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    box: dict[str, BaseException] = {}
    end = object()

    def work():
        try:
            for rows in plan:
                item = make(rows)
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc
        q.put(end)

    thread = threading.Thread(target=work, name="layerscope-tokenize", daemon=True)
    thread.start()
    try:
        while True:
            batch = q.get()
            if batch is end:
                if "error" in box:
                    raise box["error"]
                return
            t = time.perf_counter()
            pooled = eng.run(batch, layers, poolings)
            yield batch, pooled, time.perf_counter() - t
    finally:
        stop.set()
        while thread.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.1)
