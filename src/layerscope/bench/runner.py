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

The rows live in ``baseline_rows.py`` and ``engine_rows.py``, their clock and
figures in ``timing.py``; this module runs them and compares them.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np

from layerscope.bench.baseline_rows import (BASELINES, HF_EAGER, OWN_REFERENCE, ST, hf_eager_row, own_recipe,
                                            require_code_flag, st_row)
from layerscope.bench.config import BenchConfig
from layerscope.bench.engine_rows import bench_engines, engine_row
from layerscope.data.pairs import read_sts
from layerscope.errors import InputError
from layerscope.progress import track


# ov with one and with two batches in flight: the ov engine runs whichever this measures faster (engines/ov.py)
DEFAULT_ROWS = "ort,ort-int8,ov,ov-x2"


def default_rows() -> str:
    """The bench's rows when ``--engines`` is not given: ``ov-bf16`` (one and two batches in flight) joins them
    where this CPU computes in bf16."""
    from layerscope.export.cpu_precision import bf16_cpu

    return DEFAULT_ROWS + ("" if bf16_cpu() else ",ov-bf16,ov-bf16-x2")


def parse_engines(spec: str | list[str]) -> list[str]:
    if spec == "default":
        spec = default_rows()
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    known = tuple(bench_engines()) + BASELINES
    out: list[str] = []
    for name in names:
        if name not in known:
            from layerscope.errors import unknown_name

            raise unknown_name("bench engine", name, known)
        if name not in out and name not in BASELINES:
            out.append(name)
    if not out and not any(n in BASELINES for n in names):
        raise InputError("--engines named no engine")
    return out


# ---------------------------------------------------------------- helpers

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


def sts_spearman(vectors: np.ndarray, pair_a: np.ndarray, pair_b: np.ndarray, gold: np.ndarray) -> float:
    """Spearman (x100) between gold scores and cosine of the pairs' vectors ``[n_unique, hidden]``."""
    from scipy.stats import spearmanr

    a = vectors[pair_a].astype(np.float64)
    b = vectors[pair_b].astype(np.float64)
    cos = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)
    return float(spearmanr(cos, gold).statistic * 100)


# ---------------------------------------------------------------- the whole bench

def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    from layerscope.bench.machine import describe_machine
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle
    from layerscope.vocab.layers import layer_names, resolve_widths

    from layerscope.limits import check_limits, check_max_length

    say = cfg.progress or (lambda msg: None)
    check_limits(batch_tokens=cfg.batch_tokens, max_batch=cfg.max_batch, max_length=cfg.max_length,
                 threads=cfg.threads)
    if not cfg.texts:
        raise InputError("the bench corpus has no texts")
    handle = ModelHandle.resolve(cfg.model, trust_remote_code=cfg.trust_remote_code)
    require_code_flag(handle)
    if not handle.is_export:
        say("exporting the model (first use)")
        handle = ensure_export(handle)
    manifest = handle.manifest
    check_max_length(cfg.max_length, manifest, cfg.model)
    num_layers = manifest.num_layers
    if cfg.layers == "all-hidden":
        layers = layer_names(num_layers, with_raw=False)
    else:  # the rows stack layers of one width: raw only where it is as wide as the others
        layers = resolve_widths(cfg.layers, num_layers, raw_width=manifest.raw_width,
                                hidden_size=manifest.hidden_size, raw_alone=False)
    from layerscope.vocab.pooling import MASK_POOLINGS, check_poolings

    cfg.pooling = check_poolings([cfg.pooling], available=MASK_POOLINGS)[0]
    cfg.extra.setdefault("hidden_size", manifest.hidden_size)
    cfg.extra.setdefault("max_length", int(manifest.max_length))
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
    run, ref, ref_sts_encode, own = hf_eager_row(cfg, source, family, num_layers, layers, n_acc,
                                                 own_recipe(manifest))
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
        run, vecs, st_encode = st_row(cfg, source, n_acc)
        if vecs is not None:
            if own is not None:  # against the checkpoint's own embedding, computed by plain Hugging Face
                run.result["accuracy"] = {layers[-1]: _accuracy(own[None], vecs, [layers[-1]])[layers[-1]]}
                run.result["accuracy_reference"] = OWN_REFERENCE
            elif cfg.pooling == "mean":
                final = {layers[-1]: _accuracy(ref[-1:], vecs, [layers[-1]])[layers[-1]]}
                final[layers[-1]]["max_abs"] = None  # its vectors are normalized: only the direction compares
                run.result["accuracy"] = final
            if sts:
                v = st_encode(sts[0])
                run.result["sts_spearman"] = {layers[-1]: sts_spearman(v[0], sts[1], sts[2], sts[3])}
        results.append(run.result)
        gc.collect()

    for name in track(cfg.engines, "bench: engines"):
        spec = bench_engines()[name]
        say(f"{name}: {spec.note}")
        run, vecs, sts_encode, close = engine_row(cfg, spec, handle, layers, n_acc)
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
        "model": {"spec": cfg.model, "export_dir": str(handle.export_dir), "family": manifest.family,
                  "num_layers": num_layers, "hidden_size": manifest.hidden_size, "source": manifest.source.label},
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
