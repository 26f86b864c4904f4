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

import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layerscope.errors import InputError, MissingExtraError, StoreError
from layerscope.data.corpus import records_of
from layerscope.runtime.pipeline import ExtractReport, extraction_warnings
from layerscope.runtime.prepare import check_dtype
from layerscope.progress import progress_bar
from layerscope.runtime.ray_shards import (GRANULE, OFFSETS, SHARDS, ShardWorker, default_shard_rows, merge_shard,
                                           scan_offsets, shard_ready)
from layerscope.runtime.spool import spool_corpus
from layerscope.runtime.store import LayerStore

log = logging.getLogger("layerscope")


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
        _check_reachable(address)
    try:
        ray.init(**kwargs)
    except ConnectionError as exc:
        raise InputError(f"cannot reach the Ray cluster at {address!r} ({exc}); check the address "
                         "(ray://HOST:10001 or HOST:6379) or use --ray local") from None
    return True


def _check_reachable(address: str) -> None:
    """Fail in seconds, not minutes, on a HOST:PORT nobody listens on (Ray itself retries for long)."""
    import socket

    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if address == "auto" or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise InputError(f"cannot reach the Ray cluster at {address!r} ({exc}); check the address "
                         "(ray://HOST:10001 or HOST:6379) or use --ray local") from None


def extract_ray(model, source, out: str | Path, *, address: str | None = "local", workers: int = 2,
                engine: str = "auto", dtype: str = "float32", **options):
    """``extract`` on a Ray cluster (``address``: ``local``, ``auto``, ``HOST:6379``, ``ray://HOST:10001``).

    ``out`` must be on storage every node sees at the same path. Options are ``extract``'s (layers,
    poolings, batch_tokens, max_batch, max_length, resume, force, text_field, column, id_field, fmt,
    engine_options, progress) plus ``shard_rows``, ``cpus_per_worker``, ``gpus_per_worker`` and
    ``on_shard`` (called with each merged shard's report). Returns the same ``ExtractReport``.
    The cluster is joined before the corpus is read, so a wrong address costs nothing; a cluster
    this call started is stopped at the end.
    """
    from layerscope.engines.base import check_engine_name

    ray = require_ray()
    if workers < 1:
        raise InputError(f"--ray-workers must be at least 1, not {workers}")
    check_dtype(dtype)
    check_engine_name(engine)
    t0 = time.perf_counter()
    started = connect(address)
    from layerscope.runtime.store_lock import store_writer

    try:
        with store_writer(out):  # one writer per store, as for a plain extract
            return _extract(model, source, out, address=address, workers=workers, engine=engine, dtype=dtype,
                            start_s=time.perf_counter() - t0, **options)
    finally:
        if started:
            ray.shutdown()


def _extract(model, source, out: str | Path, *, address: str | None, workers: int, engine: str, dtype: str,
             layers="all", poolings=("mean",), batch_tokens: int | None = None, max_batch: int | None = None,
             max_length: int | None = None, resume: bool = False, force: bool = False, text_field=None,
             column=None, id_field=None, fmt=None, engine_options: dict | None = None,
             shard_rows: int | None = None, cpus_per_worker: float | None = None,
             gpus_per_worker: float | None = None, on_shard: Callable[[dict], None] | None = None,
             progress: bool | str | None | Callable = False, trust_remote_code: bool = False, _kill_once: dict | None = None,
             start_s: float = 0.0):
    """The run itself, on a connected cluster (see ``extract_ray``)."""
    from layerscope.runtime.prepare import make_store_dir, open_to_resume, prepare_extraction

    # the same checks and the same rules as a plain extract: --force replaces only a store layerscope made
    # that does not hold the corpus, and an existing folder of anything else is refused before anything is written
    ex = prepare_extraction(model, source, Path(out).resolve(), engine=engine, layers=layers, poolings=poolings,
                            dtype=dtype, batch_tokens=batch_tokens, max_batch=max_batch, max_length=max_length,
                            resume=resume, force=force, engine_options=engine_options,
                            trust_remote_code=trust_remote_code, engine_runs_here=False)
    if ex.settings["prompt"]:
        raise InputError(f"{ex.handle.spec} puts a default prompt before every text, which --ray does not apply "
                         "yet; run without --ray")
    out, handle, max_len, max_batch = ex.out, ex.handle, ex.max_length, ex.max_batch
    layer_list, pool_list = ex.layers, ex.poolings
    t0 = time.perf_counter()
    make_store_dir(ex)
    reader = dict(text_field=text_field, column=column, id_field=id_field, fmt=fmt)
    store = open_to_resume(ex, source, reader)
    if store is not None:
        offsets = np.load(out / OFFSETS) if (out / OFFSETS).exists() else scan_offsets(out)
    else:
        spool = spool_corpus(records_of(source, **reader), out, granule=GRANULE)
        np.save(out / OFFSETS, spool["offsets"])
        ex.settings["corpus_sha256"] = spool["sha256"]
        store = LayerStore.create(out, n=spool["n"], layers=layer_list, poolings=pool_list,
                                  hidden_size=ex.manifest.hidden_size, dtype=dtype,
                                  manifest=ex.manifest, settings=ex.settings)
        store.update_meta({"empty_texts": spool["empty"]})
        offsets = spool["offsets"]
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
        elif shard_ready(out, k):  # finished before the driver died, never merged
            tokens += merge_shard(store, k, lengths, timing)[1]
            counts["reused"] += 1
        else:
            todo.append({"shard": k, "start": start, "stop": stop, "offset": int(offsets[start // GRANULE])})

    engine_info: dict[str, Any] = dict(store.meta.get("engine") or {})
    used_batch_tokens = batch_tokens
    timing["start_s"] = round(start_s, 4)  # joining or starting the cluster
    t_run = time.perf_counter()
    if todo:
        bar = progress_bar(progress, sum(t["stop"] - t["start"] for t in todo), 0)
        try:
            import ray

            from layerscope.engines.registry import engine_spec

            cpus, gpus = _resources(ray, workers, engine, cpus_per_worker, gpus_per_worker,
                                    local=address in (None, "", "local"))
            options = {"max_batch": max_batch, "max_seq": max_len, **(engine_options or {})}
            if not gpus and "threads" not in options and engine_spec(engine).device in ("cpu", "any"):
                options["threads"] = max(1, int(cpus))
            ctx = ray.data.DataContext.get_current()
            ctx.enable_progress_bars = False
            ds = ray.data.from_items(todo, override_num_blocks=len(todo))
            ds = ds.map_batches(
                ShardWorker, batch_size=1, batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=min(workers, len(todo))),  # no idle actors on a short resume
                # Ray Data's actors default to max_restarts=-1 and max_task_retries=-1: a killed actor is
                # restarted and its shard retried
                num_cpus=cpus, num_gpus=gpus or None,
                fn_constructor_kwargs={
                    "model": _worker_model(handle, engine, trust_remote_code), "engine": engine,
                    "engine_options": options, "trust_remote_code": trust_remote_code,
                    "layers": layer_list, "poolings": pool_list, "dtype": dtype, "max_length": max_len,
                    "batch_tokens": batch_tokens, "max_batch": max_batch, "store_dir": str(out),
                    "kill_once": _kill_once})
            for row in ds.iter_rows():
                k = int(row["shard"])
                rows, shard_tokens = merge_shard(store, k, lengths, timing)
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
    missing = n - int(store.done_mask().sum())
    if missing:
        raise StoreError(f"{out}: {missing} rows are missing after the run; run again with --resume")
    run_seconds = time.perf_counter() - t_run
    truncated = int((np.asarray(lengths) > max_len).sum())
    empty = int(store.meta.get("empty_texts", 0))
    warnings = extraction_warnings(store, lengths, max_len)
    if used_batch_tokens:
        store.settings["batch_tokens"] = used_batch_tokens
    shutil.rmtree(shard_root, ignore_errors=True)
    seconds = time.perf_counter() - t0 + start_s  # the whole call, joining the cluster included
    store.finish({"engine": engine_info, "truncated_texts": truncated, "warnings": warnings,
                  "seconds": round(seconds, 3), "tokens": int(np.minimum(lengths, max_len).sum()),
                  "ray": {"shard_rows": rows_per_shard, "shards": n_shards, "workers": workers, **counts,
                          "address": address or "local", "seconds": timing}})
    return ExtractReport(store=store, n=n, empty=empty, truncated=truncated, tokens=tokens, seconds=seconds,
                         run_seconds=run_seconds, engine=engine_info, resumed_rows=already, warnings=warnings)


def _worker_model(handle, engine: str, trust_remote_code: bool) -> str:
    """What each actor opens: the model's export, made here once when the engine runs exports (not by
    every actor at the same time)."""
    from layerscope.engines.base import needs_export
    from layerscope.export.open import ensure_export

    if needs_export(engine) and not handle.is_export:
        handle = ensure_export(handle, trust_remote_code=trust_remote_code)
    return str(handle.export_dir or handle.spec)


def _resources(ray, workers: int, engine: str, cpus: float | None, gpus: float | None, *,
               local: bool = False) -> tuple[float, float]:
    """CPUs and GPUs per actor: a GPU each when the cluster has GPUs and the engine can use one;
    else an even share of the largest node's CPUs. A pool the cluster cannot hold would wait
    forever: on a local cluster that is an error, elsewhere (an autoscaler may add nodes) a warning."""
    from layerscope.engines.registry import engine_spec, gpu_engines, names_text

    device = engine_spec(engine).device
    total = ray.cluster_resources()
    if gpus is None:
        gpus = 1.0 if total.get("GPU", 0) >= 1 and device in ("any", "gpu") else 0.0
    if gpus and device == "cpu":
        raise InputError(f"engine '{engine}' runs on the CPU; use --engine {names_text(gpu_engines() + ['auto'])} "
                         "to use the cluster's GPUs")
    if not gpus and device == "gpu":
        raise InputError(f"engine '{engine}' needs GPUs, and the Ray cluster has none; use --engine ort or auto")
    if cpus is None:
        node_cpus = max((float(nd["Resources"].get("CPU", 0)) for nd in ray.nodes() if nd.get("Alive")), default=1.0)
        cpus = max(1.0, min(node_cpus, math.floor(float(total.get("CPU", 1)) / workers)))
    for name, each, have in (("CPU", cpus, total.get("CPU", 0)), ("GPU", gpus, total.get("GPU", 0))):
        if each and workers * each > have:
            msg = (f"--ray-workers {workers} needs {workers * each:g} {name}s ({each:g} per worker) and the Ray "
                   f"cluster has {have:g}; use fewer workers")
            if local:
                raise InputError(msg)
            log.warning("%s (waiting for the cluster to grow)", msg)
    return float(cpus), float(gpus)
