"""Run every engine over the same texts in one process: throughput, latency, memory, accuracy.

Two baselines are always measured next to the engines asked for:

- ``hf-eager``: the plain Hugging Face loop: batches of 64 in corpus order,
  ``output_hidden_states=True``, mask-aware pooling of every layer in torch.
  It is also the fp32 reference every engine's accuracy is measured against.
- ``sentence-transformers``: ``SentenceTransformer.encode`` with its own
  batching, final layer only (where installed and where the model is a
  sentence-transformers model).

Every other engine runs the layerscope path: length-sorted token-budget
batches, tokenization on a background thread, one session reused.
Setup (session creation, variant building, TensorRT engine build) is timed
apart from the run; one warm-up batch is run before the clock starts.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from layerscope.errors import EngineUnavailableError, InputError, LayerscopeError

HF_EAGER = "hf-eager"
ST = "sentence-transformers"
BASELINES = (HF_EAGER, ST)


@dataclass(frozen=True)
class BenchEngine:
    """A bench name mapped onto a layerscope engine, an export variant and engine options."""

    name: str
    engine: str
    variant: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    note: str = ""


def bench_engines() -> dict[str, BenchEngine]:
    """The rows each engine declares (engines/registry.py ``BenchRow``), by bench name, read when asked."""
    from layerscope.engines.registry import bench_rows

    return {name: BenchEngine(name, engine, row.variant, row.options, row.note)
            for name, (engine, row) in bench_rows().items()}


def parse_engines(spec: str | list[str]) -> list[str]:
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    known = tuple(bench_engines()) + BASELINES
    out: list[str] = []
    for name in names:
        if name not in known:
            from difflib import get_close_matches

            hint = get_close_matches(name, known, n=1)
            extra = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise InputError(f"unknown bench engine '{name}'{extra}; choose from {', '.join(known)}")
        if name not in out and name not in BASELINES:
            out.append(name)
    if not out and not any(n in BASELINES for n in names):
        raise InputError("--engines named no engine")
    return out


@dataclass
class BenchConfig:
    model: str
    engines: list[str]
    texts: list[str]
    corpus: str
    layers: str = "all-hidden"
    pooling: str = "mean"
    batch_tokens: int | None = None  # None: each engine's preferred budget
    max_batch: int = 256
    hf_batch_size: int = 64
    st_batch_size: int = 32
    max_length: int | None = None
    sts: str | None = None
    make_variants: bool = True
    include_st: bool = True
    threads: int | None = None
    accuracy_rows: int = 4096
    progress: Callable[[str], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- helpers

def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def _accuracy(ref: np.ndarray, got: np.ndarray, layers: list[str]) -> dict[str, dict[str, float]]:
    """Per layer: max |ref-got| and min cosine over texts (float64)."""
    out = {}
    for li, layer in enumerate(layers):
        r = ref[li].astype(np.float64)
        g = got[li].astype(np.float64)
        num = (r * g).sum(-1)
        den = np.linalg.norm(r, axis=-1) * np.linalg.norm(g, axis=-1)
        cos = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
        out[layer] = {"max_abs": float(np.abs(r - g).max()), "min_cos": float(cos.min()),
                      "mean_cos": float(cos.mean())}
    return out


def read_sts(path: str) -> tuple[list[str], list[str], np.ndarray]:
    """STS Benchmark file: tab-separated, no quoting; columns genre file year id score s1 s2 [...]."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise InputError(f"--sts {path}: no such file (give e.g. sts-test.csv of the STS Benchmark)")
    s1, s2, gold = [], [], []
    with open(p, encoding="utf-8", newline="") as fh:
        for i, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split("\t")
            try:
                score = float(parts[4])
                a, b = parts[5], parts[6]
            except (IndexError, ValueError):
                raise InputError(f"--sts {path}: line {i} is not 'genre file year id score s1 s2' "
                                 "(tab-separated)") from None
            s1.append(a)
            s2.append(b)
            gold.append(score)
    if len(gold) < 3:
        raise InputError(f"--sts {path}: fewer than 3 scored pairs")
    return s1, s2, np.asarray(gold)


def sts_spearman(vectors: np.ndarray, pair_a: np.ndarray, pair_b: np.ndarray, gold: np.ndarray) -> float:
    """Spearman (x100) between gold scores and cosine of the pairs' vectors ``[n_unique, hidden]``."""
    from scipy.stats import spearmanr

    a = vectors[pair_a].astype(np.float64)
    b = vectors[pair_b].astype(np.float64)
    cos = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)
    return float(spearmanr(cos, gold).statistic * 100)


# ---------------------------------------------------------------- the runs

class _Run:
    """One engine's measurements."""

    def __init__(self, name: str, kind: str, note: str = ""):
        self.result: dict[str, Any] = {"engine": name, "kind": kind, "note": note, "available": True}

    def fail(self, reason: str) -> dict[str, Any]:
        self.result.update(available=False, reason=reason)
        return self.result


def _hf_eager(cfg: BenchConfig, source, family, num_layers: int, layers: list[str], n_acc: int):
    """The plain loop: corpus order, fixed batch size, every hidden state, pooling in torch."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from layerscope.bench.machine import PeakMemory

    run = _Run(HF_EAGER, "baseline", f"plain Hugging Face loop, batch {cfg.hf_batch_size}, corpus order")
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(source.path_or_id, trust_remote_code=False)  # never a prompt
    net = AutoModel.from_pretrained(source.path_or_id, use_safetensors=True, dtype=torch.float32,
                                    trust_remote_code=False).eval()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    max_len = cfg.max_length or cfg.extra["max_length"]
    setup = time.perf_counter() - t0
    word_emb = net.get_input_embeddings()

    def encode(texts: list[str]) -> np.ndarray:
        enc = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        with torch.inference_mode():
            out = net(**enc, output_hidden_states=True)
            states = [word_emb(enc["input_ids"]) if name == "raw" else out.hidden_states[int(name)]
                      for name in layers]
            pooled = [_torch_pool(s, enc["attention_mask"], cfg.pooling) for s in states]
        return torch.stack(pooled).numpy(), int(enc["attention_mask"].sum())

    texts = cfg.texts
    encode(texts[: min(8, len(texts))])  # warm-up
    vectors = np.zeros((len(layers), n_acc, cfg.extra["hidden_size"]), np.float32)
    lat, tokens = [], 0
    with PeakMemory() as mem, _Clock() as clock:
        for lo in range(0, len(texts), cfg.hf_batch_size):
            t = time.perf_counter()
            v, n_tok = encode(texts[lo:lo + cfg.hf_batch_size])
            lat.append(time.perf_counter() - t)
            tokens += n_tok
            hi = min(lo + cfg.hf_batch_size, n_acc)
            if lo < n_acc:
                vectors[:, lo:hi] = v[:, : hi - lo]
    run.result.update(_timing(len(texts), tokens, clock, lat, setup, mem))
    run.result["provider"] = f"torch-cpu ({torch.get_num_threads()} threads)"

    def sts_encode(sentences: list[str]) -> np.ndarray:
        out = []
        for lo in range(0, len(sentences), cfg.hf_batch_size):
            out.append(encode(sentences[lo:lo + cfg.hf_batch_size])[0])
        return np.concatenate(out, axis=1)

    return run, vectors, sts_encode, lambda: None


def _torch_pool(states, mask, mode: str):
    import torch

    from layerscope.runtime.pooling import pooling_weights

    if mode == "max":
        filled = states.masked_fill(mask[..., None] == 0, float("-inf"))
        return filled.max(dim=1).values
    if mode == "mean":
        m = mask.to(states.dtype)[..., None]
        return (states * m).sum(1) / m.sum(1).clamp(min=1.0)
    w = torch.from_numpy(pooling_weights(mode, mask.numpy())).to(states.dtype)
    return torch.einsum("bsh,bs->bh", states, w)


def _sentence_transformers(cfg: BenchConfig, source, n_acc: int):
    from pathlib import Path

    from layerscope.bench.machine import PeakMemory

    run = _Run(ST, "baseline", f"SentenceTransformer.encode, batch {cfg.st_batch_size}, final layer only")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        run.fail("sentence-transformers is not installed (pip install 'layerscope[compare]')")
        return run, None, None
    if not (source.is_local and (Path(source.path_or_id) / "modules.json").exists()):
        run.fail(f"{source.spec} is not a local sentence-transformers model (no modules.json)")
        return run, None, None
    t0 = time.perf_counter()
    model = SentenceTransformer(source.path_or_id, device="cpu")
    if cfg.max_length:
        model.max_seq_length = cfg.max_length
    setup = time.perf_counter() - t0
    model.encode(cfg.texts[:8], batch_size=cfg.st_batch_size, show_progress_bar=False)  # warm-up
    with PeakMemory() as mem, _Clock() as clock:
        vecs = model.encode(cfg.texts, batch_size=cfg.st_batch_size, convert_to_numpy=True, show_progress_bar=False)
    tokens = int(sum(len(ids) for ids in model.tokenizer(cfg.texts, truncation=True,
                                                         max_length=model.max_seq_length)["input_ids"]))
    run.result.update(_timing(len(cfg.texts), tokens, clock, [], setup, mem))
    run.result["provider"] = "torch-cpu"
    run.result["latency_note"] = "its own batching: per-batch latency not observable"
    run.result["layers"] = "final only"

    def sts_encode(sentences: list[str]) -> np.ndarray:
        return model.encode(sentences, batch_size=cfg.st_batch_size, convert_to_numpy=True,
                            show_progress_bar=False)[None]

    return run, vecs[:n_acc][None].astype(np.float32), sts_encode


class _Clock:
    """Wall time, this process's CPU time and the machine's load average over one timed run.

    On a machine shared with other work, wall-clock throughput drifts with the load;
    texts per CPU-second of this process is the steadier figure, so both are recorded.
    """

    def __enter__(self):
        import os

        self.load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import os

        self.seconds = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.cpu0
        self.load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        return False


def _timing(n: int, tokens: int, clock: "_Clock", lat: list[float], setup: float, mem) -> dict[str, Any]:
    seconds = clock.seconds
    return {
        "texts": n, "tokens": tokens, "seconds": seconds,
        "texts_per_s": n / seconds, "tokens_per_s": tokens / seconds,
        "cpu_s": round(clock.cpu, 3), "texts_per_cpu_s": n / clock.cpu if clock.cpu > 0 else None,
        "load_avg_1m": [clock.load_before, clock.load_after],
        "latency_p50_ms": None if not lat else _percentile(lat, 50) * 1000,
        "latency_p95_ms": None if not lat else _percentile(lat, 95) * 1000,
        "batches": len(lat) or None,
        "setup_s": round(setup, 3),
        "peak_rss_mib": mem.peak_rss / 2**20,
        "peak_anon_rss_mib": None if mem.peak_anon is None else mem.peak_anon / 2**20,
        "peak_gpu_mib": None if mem.peak_gpu is None else mem.peak_gpu / 2**20,
    }


def _layerscope_engine(cfg: BenchConfig, spec: BenchEngine, handle, layers: list[str], n_acc: int):
    from layerscope.bench.machine import PeakMemory
    from layerscope.export.open import open_engine
    from layerscope.runtime.pipeline import iter_pooled

    run = _Run(spec.name, "engine", spec.note)
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
        if spec.variant not in handle.manifest.get("variants", {}):
            if not cfg.make_variants:
                run.fail(f"the export has no '{spec.variant}' variant (make it with inspect optimize "
                         f"{handle.export_dir} --variant {spec.variant})")
                return run, None, None, None
            t = time.perf_counter()
            try:
                make_variant(handle.export_dir, spec.variant)
            except LayerscopeError as exc:
                run.fail(f"variant could not be made: {exc}")
                return run, None, None, None
            setup_parts["variant_build_s"] = round(time.perf_counter() - t, 3)
            from layerscope.model.handle import ModelHandle

            handle = ModelHandle.resolve(handle.export_dir)
        options["variant"] = spec.variant
    if cfg.threads and spec.engine != "torch":
        options["threads"] = cfg.threads
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
    with PeakMemory(gpu=eng.info.device != "cpu") as mem, _Clock() as clock:
        for batch, pooled, secs in iter_pooled(eng, cfg.texts, layers, pool, **kw):
            lat.append(secs)
            tokens += batch.n_tokens
            keep = batch.index < n_acc
            if keep.any():
                vectors[:, batch.index[keep]] = pooled[cfg.pooling][:, keep]
    run.result.update(_timing(len(cfg.texts), tokens, clock, lat, sum(setup_parts.values()), mem))
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


# ---------------------------------------------------------------- the whole bench

def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    from layerscope.bench.machine import describe_machine
    from layerscope.engines.base import resolve_layers
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    from layerscope.limits import check_limits, check_max_length

    say = cfg.progress or (lambda msg: None)
    check_limits(batch_tokens=cfg.batch_tokens, max_batch=cfg.max_batch, max_length=cfg.max_length,
                 threads=cfg.threads)
    if not cfg.texts:
        raise InputError("the bench corpus has no texts")
    handle = ModelHandle.resolve(cfg.model)
    if not handle.is_export:
        say("exporting the model (first use)")
        handle = ensure_export(handle)
    manifest = handle.manifest
    check_max_length(cfg.max_length, manifest, cfg.model)
    num_layers = int(manifest["num_layers"])
    if cfg.layers == "all-hidden":
        layers = [str(i) for i in range(num_layers + 1)]
    else:
        layers = resolve_layers(cfg.layers, num_layers)
    from layerscope.runtime.pooling import check_poolings

    cfg.pooling = check_poolings([cfg.pooling], available=("mean", "cls", "max", "last", "mean-nobos"))[0]
    cfg.extra.setdefault("hidden_size", int(manifest["hidden_size"]))
    cfg.extra.setdefault("max_length", int(manifest["max_length"]))
    n_acc = min(len(cfg.texts), cfg.accuracy_rows)
    source = handle.source()
    family = handle.family()
    sts = None
    if cfg.sts:
        s1, s2, gold = read_sts(cfg.sts)
        uniq = sorted(set(s1) | set(s2))
        pos = {s: i for i, s in enumerate(uniq)}
        sts = (uniq, np.array([pos[s] for s in s1]), np.array([pos[s] for s in s2]), gold)

    results: list[dict[str, Any]] = []
    say(f"{HF_EAGER}: plain loop over {len(cfg.texts):,} texts")
    run, ref, ref_sts_encode, _ = _hf_eager(cfg, source, family, num_layers, layers, n_acc)
    ref_sts = None
    if sts:
        say(f"{HF_EAGER}: STS Benchmark ({len(sts[0]):,} sentences)")
        vec = ref_sts_encode(sts[0])
        ref_sts = {layer: sts_spearman(vec[li], sts[1], sts[2], sts[3]) for li, layer in enumerate(layers)}
        run.result["sts_spearman"] = ref_sts
    run.result["accuracy"] = _accuracy(ref, ref, layers)
    results.append(run.result)
    del ref_sts_encode
    gc.collect()

    if cfg.include_st:
        say(f"{ST}: encode (final layer only)")
        run, vecs, st_encode = _sentence_transformers(cfg, source, n_acc)
        if vecs is not None:
            if cfg.pooling == "mean":
                final = {layers[-1]: _accuracy(ref[-1:], vecs, [layers[-1]])[layers[-1]]}
                final[layers[-1]]["max_abs"] = None  # its vectors are normalized: only the direction compares
                run.result["accuracy"] = final
            if sts:
                v = st_encode(sts[0])
                run.result["sts_spearman"] = {layers[-1]: sts_spearman(v[0], sts[1], sts[2], sts[3])}
        results.append(run.result)
        gc.collect()

    for name in cfg.engines:
        spec = bench_engines()[name]
        say(f"{name}: {spec.note}")
        run, vecs, sts_encode, close = _layerscope_engine(cfg, spec, handle, layers, n_acc)
        if vecs is not None:
            run.result["accuracy"] = _accuracy(ref, vecs, layers)
            if sts:
                vec = sts_encode(sts[0])
                run.result["sts_spearman"] = {layer: sts_spearman(vec[li], sts[1], sts[2], sts[3])
                                              for li, layer in enumerate(layers)}
            close()
        elif run.result.get("available"):
            run.result.update(available=False, reason="no output")
        results.append(run.result)
        del sts_encode
        gc.collect()

    _speedups(results, ref_sts)
    return {
        "kind": "layerscope-bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"spec": cfg.model, "export_dir": str(handle.export_dir), "family": manifest["family"],
                  "num_layers": num_layers, "hidden_size": int(manifest["hidden_size"]),
                  "source": manifest["source"].get("alias") or manifest["source"].get("path_or_id")},
        "corpus": {"name": cfg.corpus, "texts": len(cfg.texts),
                   "tokens_unpadded": next((r["tokens"] for r in results if r.get("tokens")), None)},
        "settings": {"layers": layers, "pooling": cfg.pooling, "batch_tokens": cfg.batch_tokens,
                     "max_batch": cfg.max_batch, "hf_batch_size": cfg.hf_batch_size,
                     "st_batch_size": cfg.st_batch_size, "max_length": cfg.extra["max_length"],
                     "threads": cfg.threads, "accuracy_rows": n_acc, "sts": cfg.sts,
                     "reference": f"{HF_EAGER} (fp32 torch)"},
        "machine": describe_machine(),
        "results": results,
    }


def _speedups(results: list[dict[str, Any]], ref_sts: dict[str, float] | None) -> None:
    by = {r["engine"]: r for r in results}
    base = by.get(HF_EAGER, {}).get("texts_per_s")
    st = by.get(ST, {}).get("texts_per_s") if by.get(ST, {}).get("available") else None
    for r in results:
        if not r.get("available"):
            continue
        r["speedup_vs_hf_eager"] = r["texts_per_s"] / base if base else None
        base_cpu = by.get(HF_EAGER, {}).get("texts_per_cpu_s")
        r["cpu_speedup_vs_hf_eager"] = (r["texts_per_cpu_s"] / base_cpu
                                        if base_cpu and r.get("texts_per_cpu_s") else None)
        r["speedup_vs_sentence_transformers"] = r["texts_per_s"] / st if st else None
        if ref_sts and r.get("sts_spearman"):
            r["sts_spearman_delta"] = {layer: v - ref_sts[layer] for layer, v in r["sts_spearman"].items()
                                       if layer in ref_sts}
