"""Extraction on a Ray cluster, giving the same LayerStore as a single-process ``extract``.

How the work is cut:

* The driver reads the corpus once with layerscope's own streaming readers (so ids, order,
  empty lines, id columns, gzip and stdin behave exactly as in ``extract``) and spools it into
  the store's ``texts.jsonl``, noting the byte offset of every ``GRANULE``-th row.
* The corpus is cut into shards of ``shard_rows`` consecutive rows. The shards form a Ray
  Dataset (one block per shard); ``map_batches`` runs them on an actor pool with one engine
  session per actor. Each actor reads its rows from ``texts.jsonl`` (shared storage),
  tokenizes them, sorts them by length into token-budget batches, runs the engine and writes
  the pooled vectors as a shard directory ``shards/<k>/`` (built beside it, renamed into place).
  Only shard descriptors and small reports travel through Ray's object store, never vectors.
* The driver merges each finished shard into the one LayerStore (rows at their corpus
  positions), marks the rows done and deletes the shard. The result is an ordinary store, so
  index building and every analysis read it memory-mapped, as before.

Faults: a killed actor is restarted and its task retried by Ray (``max_restarts`` /
``max_task_retries``); a shard is only visible once complete, so a retry rewrites it whole.
A killed driver leaves merged rows marked done and finished shards on disk: ``resume=True``
merges those and computes only the shards that never finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layerscope.errors import InputError, MissingExtraError, StoreError

log = logging.getLogger("layerscope")

GRANULE = 256  # rows between recorded byte offsets of texts.jsonl; shard sizes are multiples of it
MAX_SHARD_ROWS = 8192
OFFSETS = "ray-offsets.npy"
SHARDS = "shards"


def require_ray():
    """Import ray and ray.data, or raise the one-line install hint."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise MissingExtraError("ray[data]", "ray") from None
    return ray


def connect(address: str | None, *, num_cpus: int | None = None) -> bool:
    """Join the Ray cluster at ``address`` (``local``/None: start one in this process).

    Returns True when this call started the connection (the caller then shuts it down).
    """
    ray = require_ray()
    if not log.isEnabledFor(logging.DEBUG):  # Ray Data's per-run INFO lines drown our summary
        logging.getLogger("ray.data").setLevel(logging.ERROR)
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "logging_level": logging.WARNING}
    if address in (None, "", "local"):
        kwargs["num_cpus"] = num_cpus
    else:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except ConnectionError as exc:
        raise InputError(f"cannot reach the Ray cluster at {address!r} ({exc}); check the address "
                         "(ray://HOST:10001 or HOST:6379) or use --ray local") from None
    return True


# ---------------------------------------------------------------- spooling

def _spool(records, out: Path) -> dict[str, Any]:
    """texts.jsonl exactly as ``extract`` writes it, plus the byte offset of every GRANULE-th row."""
    from layerscope.runtime.store import TEXTS

    tmp = out / (TEXTS + ".partial")
    h = hashlib.sha256()
    offsets: list[int] = []
    n = empty = pos = 0
    try:
        with open(tmp, "wb") as fh:
            for rec in records:
                if n % GRANULE == 0:
                    offsets.append(pos)
                line = json.dumps({"id": rec.id, "text": rec.text}, ensure_ascii=False).encode("utf-8") + b"\n"
                fh.write(line)
                h.update(line)
                pos += len(line)
                n += 1
                if not rec.text.strip():
                    empty += 1
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if n == 0:
        tmp.unlink()
        raise InputError("the corpus has no texts: nothing to extract")
    np.save(out / OFFSETS, np.asarray(offsets, dtype=np.int64))
    os.replace(tmp, out / TEXTS)
    return {"n": n, "empty": empty, "sha256": h.hexdigest()}


def _scan_offsets(out: Path) -> np.ndarray:
    """Offsets of a texts.jsonl spooled without them (a store begun by plain ``extract``)."""
    from layerscope.runtime.store import TEXTS

    offsets, pos = [], 0
    with open(out / TEXTS, "rb") as fh:
        for i, line in enumerate(fh):
            if i % GRANULE == 0:
                offsets.append(pos)
            pos += len(line)
    arr = np.asarray(offsets, dtype=np.int64)
    np.save(out / OFFSETS, arr)
    return arr


def default_shard_rows(n: int, workers: int) -> int:
    """About four shards per worker (so a retried shard costs little), in GRANULE steps."""
    rows = math.ceil(n / max(1, 4 * workers))
    return int(min(MAX_SHARD_ROWS, max(GRANULE, math.ceil(rows / GRANULE) * GRANULE)))


# ---------------------------------------------------------------- the actor

def _shard_dir(store_dir: Path, k: int) -> Path:
    return Path(store_dir) / SHARDS / f"{int(k):08d}"


def _shard_ready(store_dir: Path, k: int) -> bool:
    return (_shard_dir(store_dir, k) / "shard.json").exists()


class ShardWorker:
    """One engine session; each call turns shard descriptors into shard directories on disk."""

    def __init__(self, *, model: str, engine: str, engine_options: dict, layers: list[str],
                 poolings: list[str], dtype: str, max_length: int, batch_tokens: int | None,
                 max_batch: int, store_dir: str, kill_once: dict | None = None):
        from layerscope.engines.base import create_engine
        from layerscope.export.manifest import ModelHandle

        self.eng = create_engine(engine, ModelHandle.resolve(model), **engine_options)
        self.encoder = self.eng.encoder(max_length)
        self.layers, self.poolings, self.dtype = layers, poolings, np.dtype(dtype)
        self.batch_tokens = int(batch_tokens or self.eng.preferred_batch_tokens)
        self.max_batch = max_batch
        self.store_dir = Path(store_dir)
        self.kill_once = kill_once  # test hook: SIGKILL this process once, on that shard

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = [self._one(int(k), int(s), int(e), int(o))
                for k, s, e, o in zip(batch["shard"], batch["start"], batch["stop"], batch["offset"])]
        return {key: np.asarray([r[key] for r in rows]) for key in rows[0]}

    def _read(self, start: int, stop: int, offset: int) -> list[str]:
        from layerscope.runtime.store import TEXTS

        with open(self.store_dir / TEXTS, "rb") as fh:
            fh.seek(offset)
            texts = [json.loads(fh.readline())["text"] for _ in range(start, stop)]
        return texts

    def _one(self, k: int, start: int, stop: int, offset: int) -> dict[str, Any]:
        from layerscope.runtime.pipeline import plan_batches

        final = _shard_dir(self.store_dir, k)
        if _shard_ready(self.store_dir, k):  # a retry after the shard was already written
            meta = json.loads((final / "shard.json").read_text(encoding="utf-8"))
            return {**meta, "computed": False}
        if self.kill_once and self.kill_once["shard"] == k and not Path(self.kill_once["marker"]).exists():
            import signal

            Path(self.kill_once["marker"]).write_text(str(os.getpid()), encoding="utf-8")
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        texts = self._read(start, stop, offset)
        t_read = time.perf_counter()
        lengths = self.encoder.token_lengths(texts)
        t_tok = time.perf_counter() - t_read
        t_engine = 0.0
        hidden = int(self.eng.manifest["hidden_size"])
        out = {p: np.zeros((len(self.layers), stop - start, hidden), dtype=self.dtype) for p in self.poolings}
        tokens = 0
        for rows in plan_batches(lengths, batch_tokens=self.batch_tokens, max_batch=self.max_batch,
                                 max_length=self.encoder.max_length):
            t = time.perf_counter()
            b = self.encoder([texts[i] for i in rows], index=rows, lengths=lengths[rows])
            t_run = time.perf_counter()
            pooled = self.eng.run(b, self.layers, self.poolings)
            t_engine += time.perf_counter() - t_run
            t_tok += t_run - t
            for p in self.poolings:
                out[p][:, rows] = pooled[p]
            tokens += b.n_tokens
        t_write = time.perf_counter()
        tmp = final.with_name(f"{final.name}.partial-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for p in self.poolings:
            np.save(tmp / f"{p}.npy", out[p])
        np.save(tmp / "lengths.npy", lengths.astype(np.int32))
        meta = {"shard": k, "start": start, "stop": stop, "tokens": int(tokens), "pid": os.getpid(),
                "seconds": round(time.perf_counter() - t0, 4), "read_s": round(t_read - t0, 4),
                "tokenize_s": round(t_tok, 4), "engine_s": round(t_engine, 4),
                "write_s": round(time.perf_counter() - t_write, 4), "batch_tokens": self.batch_tokens,
                "engine": json.dumps(self.eng.info.to_dict())}
        (tmp / "shard.json").write_text(json.dumps(meta), encoding="utf-8")
        try:
            os.replace(tmp, final)
        except OSError:  # another attempt finished it first: theirs is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
        return {**meta, "computed": True}


# ---------------------------------------------------------------- the driver

_TIMES = ("read_s", "tokenize_s", "engine_s", "write_s")


def _merge(store, k: int, lengths_out: np.ndarray, timing: dict[str, float]) -> tuple[int, int]:
    """Copy shard ``k`` into the store at its rows, mark them done, delete the shard."""
    t0 = time.perf_counter()
    d = _shard_dir(store.path, k)
    meta = json.loads((d / "shard.json").read_text(encoding="utf-8"))
    start, stop = int(meta["start"]), int(meta["stop"])
    for p in store.poolings:
        arr = np.load(d / f"{p}.npy", mmap_mode="r", allow_pickle=False)
        if arr.shape != (len(store.layers), stop - start, int(store.meta["hidden_size"])):
            raise StoreError(f"{d} holds an array of shape {arr.shape}, not the store's; delete it and resume")
        for li, layer in enumerate(store.layers):
            store[p, layer][start:stop] = arr[li]
    lengths_out[start:stop] = np.load(d / "lengths.npy", allow_pickle=False)
    lengths_out.flush()
    store.commit(np.arange(start, stop))
    shutil.rmtree(d)
    for key in _TIMES:  # where the workers' time went, summed over shards
        timing[key] = round(timing.get(key, 0.0) + float(meta.get(key, 0.0)), 4)
    timing["merge_s"] = round(timing.get("merge_s", 0.0) + time.perf_counter() - t0, 4)
    return stop - start, int(meta["tokens"])


def extract_ray(model, source, out: str | Path, *, address: str | None = "local", workers: int = 2,
                engine: str = "auto", layers="all", poolings=("mean",), dtype: str = "float32",
                batch_tokens: int | None = None, max_batch: int | None = None, max_length: int | None = None,
                resume: bool = False, force: bool = False, text_field=None, column=None, id_field=None,
                fmt=None, engine_options: dict | None = None, shard_rows: int | None = None,
                cpus_per_worker: float | None = None, gpus_per_worker: float | None = None,
                on_shard: Callable[[dict], None] | None = None, progress: bool | Callable = False,
                _kill_once: dict | None = None):
    """``extract`` on a Ray cluster (``address``: ``local``, ``auto``, ``HOST:6379``, ``ray://HOST:10001``).

    ``out`` must be on storage every node sees at the same path. ``on_shard`` is called with each
    merged shard's report (for progress). Returns the same ``ExtractReport`` as ``extract``.
    """
    from layerscope.engines.base import check_engine_name, resolve_layers
    from layerscope.export.manifest import ModelHandle
    from layerscope.runtime.pipeline import _MATCH_KEYS, DEFAULT_MAX_BATCH, ExtractReport, _progress_bar, _settings
    from layerscope.runtime.pooling import check_poolings
    from layerscope.runtime.store import STORE_JSON, LayerStore

    ray = require_ray()
    if workers < 1:
        raise InputError(f"--ray-workers must be at least 1, not {workers}")
    if dtype not in ("float32", "float16"):
        raise InputError(f"--dtype must be float32 or float16, not {dtype}")
    check_engine_name(engine)
    max_batch = int(max_batch or DEFAULT_MAX_BATCH)
    out = Path(out).resolve()
    existing = out / STORE_JSON
    if existing.exists() and not resume and not force:
        raise StoreError(f"{out} already holds a store; pass --resume to continue it or --force to replace it")
    if out.exists() and force and not resume:
        shutil.rmtree(out)
    handle = ModelHandle.resolve(model)
    manifest = handle.manifest
    layer_list = resolve_layers(layers, manifest["num_layers"])
    pool_list = check_poolings(poolings if not isinstance(poolings, str) else poolings.split(","))
    if "eos" in pool_list and not manifest.get("pooled_output"):
        raise InputError(f"pooling 'eos' needs a model with its own pooled output (CLIP); "
                         f"{manifest['family']} has none: use 'last' or 'mean'")
    max_len = int(max_length or manifest["max_length"])
    source_desc = source if isinstance(source, (str, Path)) else (
        f"<{len(source)} texts in memory>" if hasattr(source, "__len__") else "<iterable of texts>")
    settings = _settings(handle, engine, layer_list, pool_list, dtype, batch_tokens, max_batch, max_len,
                         str(source_desc))
    variant = (engine_options or {}).get("variant")
    settings["variant"] = variant if variant not in ("", "fp32") else None
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    if existing.exists() and resume:
        store = LayerStore.open(out, allow_incomplete=True)
        store.mode = "r+"
        for key in _MATCH_KEYS:
            if store.settings.get(key) != settings.get(key):
                raise StoreError(f"{out} was made with {key}={store.settings.get(key)!r}, this run asks for "
                                 f"{settings.get(key)!r}; use another --out or drop --resume (and use --force)")
        offsets = np.load(out / OFFSETS) if (out / OFFSETS).exists() else _scan_offsets(out)
    else:
        records = _records(source, text_field=text_field, column=column, id_field=id_field, fmt=fmt)
        spool = _spool(records, out)
        settings["corpus_sha256"] = spool["sha256"]
        store = LayerStore.create(out, n=spool["n"], layers=layer_list, poolings=pool_list,
                                  hidden_size=int(manifest["hidden_size"]), dtype=dtype,
                                  manifest=manifest, settings=settings)
        store.update_meta({"empty_texts": spool["empty"]})
        offsets = np.load(out / OFFSETS)
    n = store.n
    ray_meta = dict(store.meta.get("ray") or {})
    rows_per_shard = int(ray_meta.get("shard_rows") or shard_rows or default_shard_rows(n, workers))
    if rows_per_shard % GRANULE:
        raise InputError(f"shard_rows must be a multiple of {GRANULE}, not {rows_per_shard}")
    n_shards = math.ceil(n / rows_per_shard)
    store.update_meta({"ray": {"shard_rows": rows_per_shard, "shards": n_shards}})
    lengths_path = out / "lengths.npy"
    if not lengths_path.exists():
        np.lib.format.open_memmap(lengths_path, mode="w+", dtype=np.int32, shape=(n,)).flush()
    lengths = np.load(lengths_path, mmap_mode="r+")
    shard_root = out / SHARDS
    shard_root.mkdir(exist_ok=True)
    for stale in shard_root.glob("*.partial-*"):  # an attempt killed while writing
        shutil.rmtree(stale, ignore_errors=True)

    done = store.done_mask()
    already = int(done.sum())
    counts = {"computed": 0, "reused": 0, "merged_before": 0}
    todo: list[dict[str, int]] = []
    tokens = 0
    timing: dict[str, float] = {}
    for k in range(n_shards):
        start, stop = k * rows_per_shard, min(n, (k + 1) * rows_per_shard)
        if done[start:stop].all():
            counts["merged_before"] += 1
        elif _shard_ready(out, k):  # finished before the driver died, never merged
            tokens += _merge(store, k, lengths, timing)[1]
            counts["reused"] += 1
        else:
            todo.append({"shard": k, "start": start, "stop": stop, "offset": int(offsets[start // GRANULE])})

    engine_info: dict[str, Any] = dict(store.meta.get("engine") or {})
    used_batch_tokens = batch_tokens
    started = False
    t_run = time.perf_counter()
    if todo:
        started = connect(address, num_cpus=None)
        timing["start_s"] = round(time.perf_counter() - t_run, 4)  # joining or starting the cluster
        t_run = time.perf_counter()
        bar = _progress_bar(progress, sum(t["stop"] - t["start"] for t in todo), 0)
        try:
            cpus, gpus = _resources(ray, workers, engine, cpus_per_worker, gpus_per_worker)
            options = {"max_batch": max_batch, "max_seq": max_len, **(engine_options or {})}
            if not gpus and "threads" not in options and engine in ("auto", "ort", "torch"):
                options["threads"] = max(1, int(cpus))
            ctx = ray.data.DataContext.get_current()
            ctx.enable_progress_bars = False
            ds = ray.data.from_items(todo, override_num_blocks=len(todo))
            ds = ds.map_batches(
                ShardWorker, batch_size=1, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=workers),
                num_cpus=cpus, num_gpus=gpus or None,  # Ray Data's actors default to max_restarts=-1, max_task_retries=-1
                fn_constructor_kwargs={
                    "model": str(handle.export_dir or handle.spec), "engine": engine, "engine_options": options,
                    "layers": layer_list, "poolings": pool_list, "dtype": dtype, "max_length": max_len,
                    "batch_tokens": batch_tokens, "max_batch": max_batch, "store_dir": str(out),
                    "kill_once": _kill_once})
            for row in ds.iter_rows():
                k = int(row["shard"])
                rows, shard_tokens = _merge(store, k, lengths, timing)
                tokens += shard_tokens
                counts["computed" if bool(row["computed"]) else "reused"] += 1
                engine_info = engine_info or json.loads(str(row["engine"]))
                bar.advance(rows, shard_tokens)
                used_batch_tokens = int(row["batch_tokens"])
                if on_shard is not None:
                    on_shard({"shard": k, "rows": rows, "tokens": shard_tokens, "pid": int(row["pid"]),
                              "seconds": float(row["seconds"]), "computed": bool(row["computed"])})
        finally:
            bar.close()
            if started:
                ray.shutdown()
    missing = n - int(store.done_mask().sum())
    if missing:
        raise StoreError(f"{out}: {missing} rows are missing after the run; run again with --resume")
    run_seconds = time.perf_counter() - t_run
    truncated = int((np.asarray(lengths) > max_len).sum())
    empty = int(store.meta.get("empty_texts", 0))
    warnings: list[str] = []
    if empty:
        warnings.append(f"{empty:,} of {n:,} texts are empty or whitespace-only (kept as rows so ids stay aligned)")
    if truncated:
        warnings.append(f"{truncated:,} of {n:,} texts are longer than {max_len} tokens and were "
                        f"truncated to {max_len}")
    if used_batch_tokens:
        store.settings["batch_tokens"] = used_batch_tokens
    shutil.rmtree(shard_root, ignore_errors=True)
    seconds = time.perf_counter() - t0
    store.finish({"engine": engine_info, "truncated_texts": truncated, "warnings": warnings,
                  "seconds": round(seconds, 3), "tokens": int(np.minimum(lengths, max_len).sum()),
                  "ray": {"shard_rows": rows_per_shard, "shards": n_shards, "workers": workers, **counts,
                          "address": address or "local", "seconds": timing}})
    return ExtractReport(store=store, n=n, empty=empty, truncated=truncated, tokens=tokens, seconds=seconds,
                         run_seconds=run_seconds, engine=engine_info, resumed_rows=already, warnings=warnings)


def _records(source, **kw):
    from layerscope.runtime.corpus import Record, iter_corpus

    if isinstance(source, (str, os.PathLike)):
        return iter_corpus(source, **kw)
    field = kw.get("text_field") or "text"
    if hasattr(source, "column_names"):  # a Hugging Face dataset: its text column, ids by row
        if field not in source.column_names:
            raise InputError(f"the dataset has no column '{field}' (it has {', '.join(source.column_names)}); "
                             "name one with text_field=")
        source = source[field] if len(source) < 1_000_000 else (row[field] for row in source)

    def gen():
        i = -1
        for i, t in enumerate(source):
            if not isinstance(t, str):
                raise InputError(f"text {i} is a {type(t).__name__}, not a string")
            yield Record(str(i), t, i + 1)
        if i < 0:
            raise InputError("no texts given: nothing to extract")

    return gen()


def _resources(ray, workers: int, engine: str, cpus: float | None, gpus: float | None) -> tuple[float, float]:
    """CPUs and GPUs per actor: a GPU each when the cluster has GPUs and the engine can use one;
    else an even share of the largest node's CPUs."""
    total = ray.cluster_resources()
    if gpus is None:
        gpus = 1.0 if total.get("GPU", 0) >= 1 and engine in ("auto", "cuda", "trt", "torch") else 0.0
    if gpus and engine == "ort":
        raise InputError("engine 'ort' runs on the CPU; use --engine cuda, trt or auto to use the cluster's GPUs")
    if not gpus and engine in ("cuda", "trt"):
        raise InputError(f"engine '{engine}' needs GPUs, and the Ray cluster has none; use --engine ort or auto")
    if cpus is None:
        node_cpus = max((float(nd["Resources"].get("CPU", 0)) for nd in ray.nodes() if nd.get("Alive")), default=1.0)
        cpus = max(1.0, min(node_cpus, math.floor(float(total.get("CPU", 1)) / workers)))
    return float(cpus), float(gpus)
