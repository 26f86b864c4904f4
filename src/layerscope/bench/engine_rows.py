"""The engine rows of the bench: each bench name mapped onto a layerscope engine, an export variant
and engine options, run the layerscope way (sorted token-budget batches, one session reused)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from layerscope.bench.timing import Clock, Run, timing
from layerscope.errors import EngineUnavailableError, InputError, LayerscopeError

if TYPE_CHECKING:
    from layerscope.bench.config import BenchConfig


@dataclass(frozen=True)
class BenchEngine:
    """A bench name mapped onto a layerscope engine, an export variant and engine options."""

    name: str
    engine: str
    variant: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    note: str = ""


def bench_engines() -> dict[str, BenchEngine]:
    """The rows each engine declares (engines/registry.py ``BenchRow``), by bench name, read when asked (an engine
    declared after this module was imported is still a row)."""
    from layerscope.engines.registry import bench_rows

    return {name: BenchEngine(name, engine, row.variant, row.options, row.note)
            for name, (engine, row) in bench_rows().items()}



def as_extracted(manifest, options: dict[str, Any], layers: list[str], pooling: str) -> dict[str, Any]:
    """A row's engine options over what an extraction of ``layers`` in ``pooling`` opens its engine with (the one
    early-exit rule, extraction/engine_plan.py): no block after the deepest layer, pooled outputs only where the
    graph pools them. The row's own options win (a row that pools in numpy, say)."""
    from layerscope.extraction.engine_plan import EngineReads, early_exit

    return {**early_exit(manifest, EngineReads.of(layers, (pooling,))).as_kwargs(), **options}


def engine_row(cfg: BenchConfig, spec: BenchEngine, handle, layers: list[str], n_acc: int):
    from layerscope.bench.machine import PeakMemory
    from layerscope.export.open import open_engine
    from layerscope.extraction.pipeline import iter_pooled

    run = Run(spec.name, "engine", spec.note)
    options = dict(spec.options)
    setup_parts: dict[str, float] = {}
    if spec.variant:
        from layerscope.export.variants import make_variant
        from layerscope.model.variants import check_kind

        try:
            check_kind(spec.variant)
        except InputError as exc:
            run.fail(str(exc))
            return run, None, None, None
        if spec.variant not in handle.manifest.variants:
            if not cfg.make_variants:
                run.fail(f"the export has no '{spec.variant}' variant (make it with layerscope optimize "
                         f"{handle.export_dir} --variant {spec.variant})")
                return run, None, None, None
            t = time.perf_counter()
            try:
                make_variant(handle.export_dir, spec.variant, trust_remote_code=handle.trust_remote_code)
            except LayerscopeError as exc:
                run.fail(f"variant could not be made: {exc}")
                return run, None, None, None
            setup_parts["variant_build_s"] = round(time.perf_counter() - t, 3)
            from layerscope.model.handle import ModelHandle

            handle = ModelHandle.resolve(handle.export_dir, trust_remote_code=handle.trust_remote_code)
        options["variant"] = spec.variant
    from layerscope.engines.registry import Runtime, engine_spec

    # PyTorch's thread pool is the process's: rows sharing this process leave it as the process has it
    if cfg.threads and engine_spec(spec.engine).runtime is not Runtime.PYTORCH:
        options["threads"] = cfg.threads
    options = as_extracted(handle.manifest, options, layers, cfg.pooling)
    t0 = time.perf_counter()
    try:
        eng = open_engine(handle, spec.engine, **options)
    except EngineUnavailableError as exc:
        run.fail(str(exc))
        return run, None, None, None
    setup_parts["session_s"] = round(time.perf_counter() - t0, 3)
    pool = [cfg.pooling]
    kw = dict(batch_tokens=cfg.batch_tokens, max_batch=cfg.max_batch, max_length=cfg.max_length)
    t0 = time.perf_counter()
    for _ in iter_pooled(eng, cfg.texts[: min(64, len(cfg.texts))], layers, pool, background=False, **kw):
        pass  # warm-up (TensorRT builds its engines here)
    setup_parts["warmup_s"] = round(time.perf_counter() - t0, 3)
    vectors = np.zeros((len(layers), n_acc, cfg.extra["hidden_size"]), np.float32)
    lat, tokens = [], 0
    with PeakMemory(gpu=eng.info.device != "cpu") as mem, Clock() as clock:
        for batch, pooled, secs in iter_pooled(eng, cfg.texts, layers, pool, **kw):
            lat.append(secs)
            tokens += batch.n_tokens
            keep = batch.index < n_acc
            if keep.any():
                vectors[:, batch.index[keep]] = pooled[cfg.pooling][:, keep]
    run.result.update(timing(len(cfg.texts), tokens, clock, lat, sum(setup_parts.values()), mem))
    run.result["setup_parts"] = setup_parts
    run.result["provider"] = eng.info.provider
    run.result["precision"] = eng.info.precision
    run.result["engine_notes"] = list(eng.info.notes)
    run.result["batch_tokens"] = int(cfg.batch_tokens or eng.preferred_batch_tokens)

    def sts_encode(sentences: list[str]) -> np.ndarray:
        out = np.zeros((len(layers), len(sentences), cfg.extra["hidden_size"]), np.float32)
        for batch, pooled, _ in iter_pooled(eng, sentences, layers, pool, **kw):
            out[:, batch.index] = pooled[cfg.pooling]
        return out

    return run, vectors, sts_encode, eng.close
