"""Extraction on a Ray cluster, giving the same LayerStore as a single-process ``extract``.

The driver makes the store exactly as ``--shard`` does (``range_run.open_or_create``: the corpus spooled
once with layerscope's own readers, the arrays reserved, the range plan recorded), then hands the ranges
that are not done to a pool of actors, one engine session each (``ray_shards.RangeActor``). An actor
writes each range's rows straight into the store's arrays on shared storage, fsyncs them and marks the
range done (``range_writer``); only range descriptors and small reports travel through Ray's object
store, never vectors, and the driver merges nothing: it records completion (``done.npy``) and finishes
the store (``range_run.finish``: a check and the checksums).

Faults: a killed actor is restarted and its range retried by Ray (``max_restarts`` /
``max_task_retries``); a range whose claim was left by a dead actor is taken over (``store_ranges``).
A killed driver leaves every range an actor finished marked done: ``resume=True`` computes only the
others.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from layerscope.errors import InputError, MissingExtraError, StoreError
from layerscope.extraction.executor import ExtractReport, RangeWork
from layerscope.extraction.prepare import check_dtype, check_ranges_fit, ray_share
from layerscope.progress import progress_bar
from layerscope.extraction import range_run
from layerscope.store import store_ranges
from layerscope.extraction.ray_shards import RangeActor
from layerscope.extraction.request import ExtractionRequest

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
                engine: str = "auto", dtype: str | None = None, store_dtype: str | None = None,
                shard_rows: int | None = None, cpus_per_worker: float | None = None,
                gpus_per_worker: float | None = None, on_shard: Callable[[dict], None] | None = None, **options):
    """``extract`` on a Ray cluster (``address``: ``local``, ``auto``, ``HOST:6379``, ``ray://HOST:10001``).

    ``out`` must be on storage every node sees at the same path. Options are ``extract``'s (layers,
    poolings, batch_tokens, max_batch, max_length, resume, force, text_field, column, id_field, fmt,
    engine_options, prompt_name, prompt, progress) plus ``shard_rows`` (rows per range, a multiple of
    256), ``cpus_per_worker``, ``gpus_per_worker`` and ``on_shard`` (called with each finished range's
    report). Returns the same ``ExtractReport``. The cluster is joined before the corpus is read, so a
    wrong address costs nothing; a cluster this call started is stopped at the end.
    """
    req = ExtractionRequest.of(model, source, Path(out).resolve(), engine=engine,
                               store_dtype=store_dtype or dtype or "float32", **options)
    return RayExecutor(address=address, workers=workers, shard_rows=shard_rows, cpus_per_worker=cpus_per_worker,
                       gpus_per_worker=gpus_per_worker, on_shard=on_shard).run(req)


@dataclass(frozen=True)
class RayExecutor:
    """The Ray executor (extraction/executor.py): a driver here, ``workers`` actors on the cluster at
    ``address`` (``local``, ``auto``, ``HOST:6379``, ``ray://HOST:10001``)."""

    address: str | None = "local"
    workers: int = 2
    shard_rows: int | None = None  # rows per range (a multiple of 256)
    cpus_per_worker: float | None = None
    gpus_per_worker: float | None = None
    on_shard: Callable[[dict], None] | None = None  # called with each finished range's report

    def run(self, request: ExtractionRequest) -> ExtractReport:
        return extract_ray_request(request, address=self.address, workers=self.workers, shard_rows=self.shard_rows,
                                   cpus_per_worker=self.cpus_per_worker, gpus_per_worker=self.gpus_per_worker,
                                   on_shard=self.on_shard)


def extract_ray_request(req: ExtractionRequest, *, address: str | None = "local", workers: int = 2,
                        shard_rows: int | None = None, cpus_per_worker: float | None = None,
                        gpus_per_worker: float | None = None, on_shard: Callable[[dict], None] | None = None
                        ) -> ExtractReport:
    """The Ray executor of an ``ExtractionRequest``."""
    from dataclasses import replace

    from layerscope.engines.registry import resolve_engine

    ray = require_ray()
    if workers < 1:
        raise InputError(f"--ray-workers must be at least 1, not {workers}")
    if req.tokens:
        raise InputError("--tokens is not supported with --ray yet; run without --ray")
    check_dtype(req.store_dtype)
    req = replace(req, engine=resolve_engine(req.engine, req.options))  # resolved once, handed down
    t0 = time.perf_counter()
    started = connect(address)
    from layerscope.store.store_lock import store_writer

    try:
        with store_writer(req.out):  # one driver per store, as for a plain extract
            return _extract(req, address=address, workers=workers, shard_rows=shard_rows,
                            cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker, on_shard=on_shard,
                            start_s=time.perf_counter() - t0)
    finally:
        if started:
            ray.shutdown()


def _extract(req: ExtractionRequest, *, address, workers, shard_rows, cpus_per_worker, gpus_per_worker, on_shard,
             start_s: float) -> ExtractReport:
    """The run itself, on a connected cluster (see ``extract_ray``)."""
    # the same checks, spool and store as a plain extract and --shard: --force replaces only a store layerscope
    # made that does not hold the corpus, and an existing folder of anything else is refused before anything is written
    t0 = time.perf_counter()
    ex, store = range_run.open_or_create(req, range_rows=shard_rows, engine_runs_here=False)
    out, choice = ex.out, ex.choice
    if shard_rows and store.range_rows != int(shard_rows):
        raise InputError(f"{out} is cut into ranges of {store.range_rows} rows, not {shard_rows}; "
                         "resume it without shard_rows")
    ranges = range_run.ranges_of(store)
    done = store.done_mask()
    already = int(done.sum())
    counts = {"computed": 0, "reused": 0, "done_before": 0}
    todo: list[dict[str, int]] = []
    for r in ranges:
        if bool(done[r.start:r.stop].all()):
            counts["done_before"] += 1
        elif store_ranges.is_done(out, r.k, range_run.store_id(store)):  # written by an actor before the driver died
            done[r.start:r.stop] = 1
            counts["done_before"] += 1
        else:
            todo.append({"k": r.k, "start": r.start, "stop": r.stop, "offset": r.offset})
    done.flush()
    timing: dict[str, float] = {"start_s": round(start_s, 4)}  # joining or starting the cluster
    tokens = 0
    t_run = time.perf_counter()
    if todo:
        bar = progress_bar(req.progress, sum(t["stop"] - t["start"] for t in todo), 0)
        try:
            import ray

            from layerscope.extraction.engine_plan import engine_options

            cpus, gpus = _resources(ray, workers, choice, cpus_per_worker, gpus_per_worker,
                                    local=address in (None, "", "local"))
            check_ranges_fit(ex, choice, todo, **ray_share(ray, min(workers, len(todo)), cpus, gpus,
                                                            local=address in (None, "", "local")))
            options = engine_options(ex.spec, ex.manifest, dict(choice.options))
            if not gpus and choice.device in ("cpu", "any"):  # each actor's share of the CPUs
                options = options.with_asked(threads=max(1, int(cpus)))
            ctx = ray.data.DataContext.get_current()
            ctx.enable_progress_bars = False
            ds = ray.data.from_items(todo, override_num_blocks=len(todo))
            ds = ds.map_batches(
                RangeActor, batch_size=1, batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=min(workers, len(todo))),  # no idle actors on a short resume
                # Ray Data's actors default to max_restarts=-1 and max_task_retries=-1: a killed actor is
                # restarted and its range retried
                num_cpus=cpus, num_gpus=gpus or None,
                fn_constructor_kwargs={
                    # each actor's process looks the name up once
                    "model": _worker_model(ex.handle, choice, req.trust_remote_code), "engine": choice.name,
                    "engine_options": options.as_kwargs(), "trust_remote_code": req.trust_remote_code,
                    "layers": ex.layers, "poolings": ex.poolings, "store_dtype": ex.spec.dtype,
                    "max_length": ex.max_length, "prompt": ex.spec.prompt, "batch_tokens": req.batch_tokens,
                    "max_batch": ex.max_batch, "store_dir": str(out),
                    "store_id": range_run.store_id(store)})
            for row in ds.iter_rows():
                start, stop = int(row["start"]), int(row["stop"])
                done[start:stop] = 1  # the driver records completion; the rows are already on disk
                done.flush()
                tokens += int(row["tokens"])
                counts["computed" if bool(row["computed"]) else "reused"] += 1
                timing["write_s"] = round(timing.get("write_s", 0.0) + float(row["write_s"]), 4)
                bar.advance(stop - start, int(row["tokens"]))
                if on_shard is not None:
                    on_shard({"shard": int(row["k"]), "rows": stop - start, "tokens": int(row["tokens"]),
                              "pid": int(row["pid"]), "seconds": float(row["seconds"]),
                              "computed": bool(row["computed"])})
        finally:
            bar.close()
    missing = store.n - int(store.done_mask().sum())
    if missing:
        raise StoreError(f"{out}: {missing} rows are missing after the run; run again with --resume")
    run_seconds = time.perf_counter() - t_run
    seconds = time.perf_counter() - t0 + start_s  # the whole call, joining the cluster included
    record = range_run.finish(store, extra={
        "seconds": round(seconds, 3),
        "ray": {"shard_rows": ranges[0].rows if ranges else 0, "shards": len(ranges), "workers": workers, **counts,
                "address": address or "local", "seconds": timing}})
    return ExtractReport(store=store, n=store.n, empty=store.empty_texts,
                         truncated=record.truncated_texts, tokens=tokens, seconds=seconds,
                         run_seconds=run_seconds, engine=dict(record.engine), resumed_rows=already,
                         warnings=list(record.warnings or ()),
                         ranges=RangeWork(len(ranges), counts["computed"], counts["done_before"],
                                          found_done=counts["reused"], finished=True))


def _worker_model(handle, engine, trust_remote_code: bool) -> str:
    """What each actor opens: the model's export, made here once when the engine runs exports (not by
    every actor at the same time)."""
    from layerscope.engines.base import needs_export
    from layerscope.export.open import ensure_export

    if needs_export(engine) and not handle.is_export:
        handle = ensure_export(handle, trust_remote_code=trust_remote_code)
    return str(handle.export_dir or handle.spec)


def _resources(ray, workers: int, choice, cpus: float | None, gpus: float | None, *,
               local: bool = False) -> tuple[float, float]:
    """CPUs and GPUs per actor: a GPU each when the cluster has GPUs and the engine can use one;
    else an even share of the largest node's CPUs. A pool the cluster cannot hold would wait
    forever: on a local cluster that is an error, elsewhere (an autoscaler may add nodes) a warning."""
    from layerscope.engines.registry import gpu_engines, names_text

    engine, device = choice.name, choice.device
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
