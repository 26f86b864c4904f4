"""``layerscope bench``: every row in its own process, rounds alternating the order, best and median.

Rows: the plain Hugging Face loop (``hf-eager``, also the fp32 reference every
accuracy is measured against), the layerscope engines asked for, and the
sentence-transformers backends a user would pick instead (final layer only,
where installed).  Each round starts one fresh process per row
(``layerscope.bench.worker``); odd rounds run the rows in reverse order so
that no row always runs right after the same neighbour.  Each process does
``passes`` warm passes; a row reports its best and median pass over all rounds,
whether the rounds' bests agree within 10%, its accuracy class (min cosine to
fp32 over the layers it produced), the fraction of a compute peak it reached
(this CPU's fp32 peak, or for a row on a GPU that GPU's peak for the row's precision:
bench/gpu_peak.py), its peak GPU memory, how it tokenized (one thread on the CPU rows, whose cores run the
engine; the tokenizers thread pool on GPU rows), and the split of one sequential pass into tokenize / engine /
pool-copy / write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layerscope.bench.baseline_rows import HF_EAGER, OWN_REFERENCE, own_recipe, require_code_flag
from layerscope.bench.engine_rows import bench_engines
from layerscope.bench.runner import _accuracy, sts_spearman
from layerscope.data.pairs import read_sts
from layerscope.errors import InputError
from layerscope.progress import steps

ROUND_AGREEMENT = 0.10  # rounds' best passes within 10% of each other


@dataclass
class IsolatedConfig:
    model: str
    engines: list[str]
    texts: list[str]
    corpus: str
    peers: list[str] = field(default_factory=list)
    layers: str = "all-hidden"
    pooling: str = "mean"
    rounds: int = 2
    passes: int = 3
    batch_tokens: int | None = None
    max_batch: int = 256
    hf_batch_size: int = 64
    st_batch_size: int = 32
    max_length: int | None = None
    threads: int | None = None
    sts: str | None = None
    trust_remote_code: bool = False  # the user's flag: rows loading the model (hf-eager, torch, peers) run its code
    accuracy_rows: int = 4096
    reference_texts: int | None = None  # hf-eager (the CPU reference) over the first N texts only
    rows_dir: Path | None = None  # each row's result written here as it finishes (a bench cut short keeps them)
    timeout_s: float = 3600.0
    progress: Callable[[str], None] | None = None


def parse_peers(spec: str) -> list[str]:
    from layerscope.bench.peers import PEERS

    if spec.strip() in ("", "none"):
        return []
    if spec.strip() == "all":
        return list(PEERS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        if name not in PEERS:
            from layerscope.errors import unknown_name

            raise unknown_name("peer", name, PEERS, listed=("all", "none", *PEERS))
    return list(dict.fromkeys(names))


def accuracy_class(min_cos: float | None) -> str:
    if min_cos is None:
        return "-"
    for bar in (0.9999, 0.999, 0.99):
        if min_cos >= bar:
            return f">= {bar:g}"
    return "< 0.99"


def _rows(cfg: IsolatedConfig, handle, layers: list[str]) -> list[dict[str, Any]]:
    from layerscope.bench.peers import PEERS, missing

    common = {"export_dir": str(handle.export_dir), "trust_remote_code": handle.trust_remote_code,
              "layers": layers, "pooling": cfg.pooling,
              "batch_tokens": cfg.batch_tokens, "max_batch": cfg.max_batch, "max_length": cfg.max_length,
              "threads": cfg.threads, "hf_batch_size": cfg.hf_batch_size, "st_batch_size": cfg.st_batch_size,
              "passes": cfg.passes}
    first = f", the first {cfg.reference_texts:,} texts" if cfg.reference_texts else ""
    rows = [dict(common, name=HF_EAGER, kind="hf-eager", row_kind="baseline", st_recipe=own_recipe(handle.manifest),
                 note=f"plain Hugging Face loop, batch {cfg.hf_batch_size}, corpus order, all layers{first}")]
    for name in cfg.engines:
        spec = bench_engines()[name]
        rows.append(dict(common, name=name, kind="engine", row_kind="engine", engine=spec.engine,
                         variant=spec.variant, options=dict(spec.options), note=spec.note))
    for peer in cfg.peers:
        rows.append(dict(common, name=peer, kind="st", row_kind="peer", backend=PEERS[peer]["backend"],
                         precision=PEERS[peer]["precision"], device=PEERS[peer].get("device", "cpu"),
                         skip=missing(peer),
                         note=f"SentenceTransformer.encode ({PEERS[peer]['backend']}), batch {cfg.st_batch_size}, "
                              "final layer only"))
    return rows


def _prepare_peers(cfg: IsolatedConfig, handle, rows: list[dict[str, Any]], say) -> None:
    from layerscope.bench.machine import describe_machine
    from layerscope.bench.peers import PEER_DIR, PEERS, quant_config, quantized_file

    st_rows = [r for r in rows if r["kind"] == "st" and not r["skip"]]
    if not st_rows:
        return
    source = handle.source()
    model_dir = Path(source.path_or_id)
    if not (source.is_local and (model_dir / "modules.json").exists()):
        for r in st_rows:
            r["skip"] = f"{source.spec} is not a local sentence-transformers model (no modules.json)"
        return
    peer_dir = Path(handle.export_dir) / PEER_DIR
    if any(PEERS[r["name"]]["backend"] == "onnx" for r in st_rows):
        flags = set(describe_machine()["cpu_flags"])
        say(f"sentence-transformers ONNX files (plain, O3, int8 {quant_config(flags)}) in {peer_dir}")
        code = ["--trust-remote-code"] if handle.trust_remote_code else []
        proc = subprocess.run([sys.executable, "-m", "layerscope.bench.peers", str(model_dir), str(peer_dir),
                               quant_config(flags), *code], capture_output=True, text=True, timeout=cfg.timeout_s)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["no message"])[-1][:200]
            for r in st_rows:
                if PEERS[r["name"]]["backend"] == "onnx":
                    r["skip"] = f"its ONNX files could not be made: {why}"
    for r in st_rows:
        r["model_dir"] = str(peer_dir if PEERS[r["name"]]["backend"] == "onnx" else model_dir)
        file = PEERS[r["name"]]["file"]
        if file == "quantized":
            file = quantized_file(peer_dir)
            r["precision"] = f"int8 ({file})" if file else r["precision"]
        r["file_name"] = file


def _run_worker(job: dict[str, Any], work: Path, timeout_s: float) -> dict[str, Any]:
    out = Path(job["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    job_file = out / "job.json"
    job_file.write_text(json.dumps(job), encoding="utf-8")
    # one tokenizer thread; a row whose engine turns out to run on a GPU turns the pool on (bench/gpu_peak.py)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    try:
        proc = subprocess.run([sys.executable, "-m", "layerscope.bench.worker", str(job_file)],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"engine": job["name"], "kind": job["row_kind"], "available": False,
                "reason": f"its process ran past {timeout_s:.0f} s"}
    result_file = out / "result.json"
    if proc.returncode != 0 or not result_file.exists():
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1][:200]
        return {"engine": job["name"], "kind": job["row_kind"], "available": False,
                "reason": f"its process failed: {tail}"}
    return json.loads(result_file.read_text(encoding="utf-8"))


def run_isolated(cfg: IsolatedConfig) -> dict[str, Any]:
    from layerscope.bench.machine import describe_machine
    from layerscope.bench.peak import corpus_flops, cpu_peak, model_shapes
    from layerscope.export.open import ensure_export
    from layerscope.vocab.layers import layer_names, resolve_layers

    say = cfg.progress or (lambda msg: None)
    if not cfg.texts:
        raise InputError("the bench corpus has no texts")
    if cfg.rounds < 1 or cfg.passes < 1:
        raise InputError("--rounds and --passes must be at least 1")
    handle = ensure_export(cfg.model, trust_remote_code=cfg.trust_remote_code)
    require_code_flag(handle)
    manifest = handle.manifest
    num_layers = manifest.num_layers
    layers = (layer_names(num_layers, with_raw=False) if cfg.layers == "all-hidden"
              else resolve_layers(cfg.layers, num_layers, with_raw=False))
    if cfg.reference_texts is not None and cfg.reference_texts < 1:
        raise InputError("--reference-texts must be at least 1")
    n_acc = min(len(cfg.texts), cfg.accuracy_rows, cfg.reference_texts or len(cfg.texts))
    rows = _rows(cfg, handle, layers)
    _prepare_peers(cfg, handle, rows, say)
    sts = None
    with tempfile.TemporaryDirectory(prefix="layerscope-bench-") as tmp:
        work = Path(tmp)
        texts_file = work / "texts.json"
        texts_file.write_text(json.dumps(cfg.texts), encoding="utf-8")
        ref_file = work / "reference-texts.json"  # the CPU reference's share of a long GPU corpus
        ref_file.write_text(json.dumps(cfg.texts[:cfg.reference_texts or len(cfg.texts)]), encoding="utf-8")
        if cfg.sts:
            s1, s2, gold = read_sts(cfg.sts)
            uniq = sorted(set(s1) | set(s2))
            pos = {s: i for i, s in enumerate(uniq)}
            sts = (np.array([pos[s] for s in s1]), np.array([pos[s] for s in s2]), gold)
            (work / "sts.json").write_text(json.dumps(uniq), encoding="utf-8")
        per_row: dict[str, list[dict[str, Any]]] = {r["name"]: [] for r in rows}
        loads = []
        runnable = [r for r in rows if not r.get("skip")]
        total = len(runnable) * cfg.rounds
        # one count over every round, so the time left covers the whole bench, not the round under way
        with steps(f"bench: {len(runnable)} rows x {cfg.rounds} rounds, each row in its own process", total) as bar:
            for rnd in range(cfg.rounds):
                order = runnable if rnd % 2 == 0 else runnable[::-1]
                for row in order:
                    say(f"round {rnd + 1}/{cfg.rounds}: {row['name']} in its own process "
                        f"(row {bar.done + 1:,} of {total:,})")
                    loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
                    out_dir = work / f"r{rnd}-{row['name']}"
                    texts_of = ref_file if row["kind"] == "hf-eager" else texts_file
                    job = dict(row, round=rnd, out_dir=str(out_dir), texts_file=str(texts_of), n_acc=n_acc,
                               sts_file=str(work / "sts.json") if sts and rnd == 0 else None)
                    res = _run_worker(job, work, cfg.timeout_s)
                    if cfg.rows_dir is not None:
                        Path(cfg.rows_dir).mkdir(parents=True, exist_ok=True)
                        (Path(cfg.rows_dir) / f"r{rnd}-{row['name']}.json").write_text(
                            json.dumps(res, indent=1), encoding="utf-8")
                    if res.get("available") and rnd == 0:
                        res["_vectors"] = np.load(out_dir / "vectors.npy")
                        if (out_dir / "own.npy").exists():  # the checkpoint's own embedding (hf-eager)
                            res["_own"] = np.load(out_dir / "own.npy")
                        if sts and (out_dir / "sts.npy").exists():
                            res["_sts"] = np.load(out_dir / "sts.npy")
                    per_row[row["name"]].append(res)
                    bar.advance()
    lengths = _token_lengths(handle, cfg)
    shapes = model_shapes(handle.export_dir)
    peak = cpu_peak()  # measured with every row done: the machine as quiet as the bench left it
    flops = corpus_flops(shapes, lengths) if shapes else None
    results = [_summarize(row, per_row[row["name"]], layers) for row in rows]
    ref = next((r for r in results if r["engine"] == HF_EAGER and r.get("available")), None)
    for r in results:
        _finish(r, ref, layers, sts, flops, peak, lengths=lengths, shapes=shapes)
    if ref is not None:
        ref.pop("_ref", None)
        ref.pop("_own", None)
    _ratios(results)
    return {
        "kind": "layerscope-bench-isolated",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"spec": cfg.model, "export_dir": str(handle.export_dir), "family": manifest.family,
                  "num_layers": num_layers, "hidden_size": manifest.hidden_size, "shapes": shapes,
                  "source": manifest.source.label, "onnx_sha256": manifest.onnx_sha256},
        "corpus": {"name": cfg.corpus, "texts": len(cfg.texts), "tokens_unpadded": int(lengths.sum()),
                   "flops": flops},
        "settings": {"layers": layers, "pooling": cfg.pooling, "rounds": cfg.rounds, "passes": cfg.passes,
                     "batch_tokens": cfg.batch_tokens, "max_batch": cfg.max_batch,
                     "hf_batch_size": cfg.hf_batch_size, "st_batch_size": cfg.st_batch_size,
                     "threads": cfg.threads, "accuracy_rows": n_acc, "reference_texts": cfg.reference_texts,
                     "sts": cfg.sts,
                     "reference": f"{HF_EAGER} (fp32 torch)", "isolation": "one process per row per round"},
        "machine": dict(describe_machine(), peak=peak,
                        load_avg_1m_at_starts=[round(v, 2) for v in loads if v is not None]),
        "results": results,
    }


def _token_lengths(handle, cfg: IsolatedConfig) -> np.ndarray:
    from layerscope.model.tokenize import Encoder

    max_length = int(cfg.max_length or handle.manifest.max_length)
    enc = Encoder(handle.encoding_tokenizer(), list(handle.manifest.inputs), max_length)
    return np.minimum(enc.token_lengths(cfg.texts), max_length)


def _summarize(row: dict[str, Any], runs: list[dict[str, Any]], layers: list[str]) -> dict[str, Any]:
    base = {"engine": row["name"], "kind": row["row_kind"], "note": row.get("note", "")}
    if row.get("skip"):
        return dict(base, available=False, reason=row["skip"])
    ok = [r for r in runs if r.get("available")]
    if not ok:
        reason = next((r.get("reason") for r in runs if r.get("reason")), "no result")
        return dict(base, available=False, reason=reason)
    first = ok[0]
    seconds = [s for r in ok for s in r["pass_seconds"]]
    round_best = [min(r["pass_seconds"]) for r in ok]
    n = first["texts"]
    fastest = min(ok, key=lambda r: min(r["pass_seconds"]))
    return dict(
        base, available=True, texts=n, provider=first.get("provider"), precision=first.get("precision"),
        engine_notes=first.get("notes", []), layers=first.get("layers"), pids=[r.get("pid") for r in ok],
        started=[r.get("started") for r in ok],
        rounds=len(ok), passes=len(seconds), best_s=min(seconds), median_s=float(np.median(seconds)),
        texts_per_s=n / min(seconds), median_texts_per_s=n / float(np.median(seconds)),
        round_best_texts_per_s=[n / s for s in round_best],
        rounds_agree=bool(max(round_best) <= min(round_best) * (1 + ROUND_AGREEMENT)),
        texts_per_cpu_s=n / min(c for r in ok for c in r["pass_cpu_s"]),
        setup_s=first.get("setup_s"), peak_rss_mib=max(r["peak_rss_mib"] for r in ok),
        device=first.get("device", "cpu"), tokenization=first.get("tokenization"), gpu_peak=first.get("gpu_peak"),
        gpu_memory=_gpu_memory(ok), batch_shapes=first.get("batch_shapes"),
        load_avg_1m=[r.get("load_avg_1m") for r in ok], split=fastest.get("split"),
        _vectors=first.get("_vectors"), _sts=first.get("_sts"), _own=first.get("_own"))


def _finish(r: dict[str, Any], ref: dict[str, Any] | None, layers: list[str], sts, flops, peak, *,
            lengths: np.ndarray | None = None, shapes: dict[str, int] | None = None) -> None:
    vectors, sts_vec = r.pop("_vectors", None), r.pop("_sts", None)
    batch_shapes = r.pop("batch_shapes", None)
    if r is not ref:
        r.pop("_own", None)
    if not r.get("available"):
        return
    produced = r["layers"]
    idx = [layers.index(x) for x in produced]
    if r.get("kind") == "peer" and ref is not None and ref.get("_own") is not None:
        # sentence-transformers against the checkpoint's own embedding, computed by plain Hugging Face
        r["accuracy"] = _accuracy(ref["_own"][None], vectors, produced)
        r["accuracy_reference"] = OWN_REFERENCE
    elif ref is not None and ref.get("_ref") is not None:
        acc = _accuracy(ref["_ref"][idx], vectors, produced)
        if produced != layers:  # final-layer-only peers normalize: only the direction compares
            for a in acc.values():
                a["max_abs"] = None
        r["accuracy"] = acc
    elif r["engine"] == HF_EAGER:
        r["_ref"] = vectors
        r["accuracy"] = _accuracy(vectors, vectors, produced)
    worst = min((a["min_cos"] for a in (r.get("accuracy") or {}).values()), default=None)
    r["min_cos"] = worst
    r["accuracy_class"] = accuracy_class(worst)
    if sts is not None and sts_vec is not None:
        r["sts_spearman"] = {layer: sts_spearman(sts_vec[i], *sts) for i, layer in enumerate(produced)}
        if ref is not None and ref.get("sts_spearman"):
            r["sts_spearman_delta"] = {k: v - ref["sts_spearman"][k] for k, v in r["sts_spearman"].items()}
    if lengths is not None and shapes and r.get("texts", len(lengths)) < len(lengths):
        from layerscope.bench.peak import corpus_flops

        flops = corpus_flops(shapes, lengths[:r["texts"]])  # a row over the first texts only (--reference-texts)
    if flops:
        r["gflops_per_s"] = flops / r["best_s"] / 1e9
    r.update(peak_against(r, peak))
    if flops and r["peak_gflops"]:
        r["peak_fraction"] = r["gflops_per_s"] / r["peak_gflops"]
    if lengths is not None and batch_shapes:
        tokens = int(lengths[:r.get("texts", len(lengths))].sum())
        r.update(padding_figures(batch_shapes, tokens, r["best_s"], shapes, r.get("peak_gflops")))


def padding_figures(batch_shapes: list[list[int]], tokens: int, best_s: float, shapes: dict[str, int] | None,
                    peak_gflops: float | None) -> dict[str, Any]:
    """What a row's padding costs, from its batches' shapes (texts x padded width) in a pass: the tokens the
    engine ran (padding included) beside the ``tokens`` of the texts, their share, both rates over the best
    pass, and the FLOPs of the padded batches as a fraction of the peak (the work the engine did; the useful
    work's fraction is ``peak_fraction``)."""
    from layerscope.bench.peak import corpus_flops

    sizes = np.array([b for b, _ in batch_shapes], dtype=np.int64)
    widths = np.array([w for _, w in batch_shapes], dtype=np.int64)
    padded = int((sizes * widths).sum())
    out: dict[str, Any] = {"tokens_real": int(tokens), "tokens_padded": padded,
                           "padding_share": 1.0 - tokens / padded if padded else None,
                           "real_tokens_per_s": tokens / best_s, "padded_tokens_per_s": padded / best_s}
    if shapes:
        out["padded_gflops_per_s"] = corpus_flops(shapes, np.repeat(widths, sizes)) / best_s / 1e9
        if peak_gflops:
            out["peak_fraction_padded"] = out["padded_gflops_per_s"] / peak_gflops
    return out


def peak_against(r: dict[str, Any], cpu_peak: dict[str, Any] | None) -> dict[str, Any]:
    """The peak a row's speed is a fraction of: its GPU's for the row's precision where it ran on a GPU
    (bench/gpu_peak.py, worked out in the row's process), else this CPU's fp32 peak."""
    from layerscope.bench.gpu_peak import on_gpu

    if on_gpu(r.get("device")):
        g = r.get("gpu_peak") or {}
        tflops = g.get("tflops")
        return {"peak_gflops": tflops * 1000 if tflops else None,
                "peak_label": f"GPU {g.get('precision', '?')}" if tflops else "GPU: unknown",
                "peak_text": g.get("text") or "GPU peak not worked out"}
    return {"peak_gflops": cpu_peak["gflops"] if cpu_peak else None, "peak_label": "CPU fp32",
            "peak_text": cpu_peak["text"] if cpu_peak else "unknown (no /proc/cpuinfo)"}


def _gpu_memory(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest peak GPU memory over a row's rounds, with how it was measured (None: a CPU row)."""
    seen = [r["gpu_memory"] for r in runs if r.get("gpu_memory")]
    if not seen:
        return None
    measured = [m for m in seen if m.get("peak_mib") is not None]
    return max(measured, key=lambda m: m["peak_mib"]) if measured else seen[0]


def _ratios(results: list[dict[str, Any]]) -> None:
    """Speed against the fastest peer at least as accurate (its min cosine >= this row's class bar)."""
    peers = [r for r in results if r["kind"] == "peer" and r.get("available") and r.get("min_cos") is not None]
    base = next((r for r in results if r["engine"] == HF_EAGER and r.get("available")), None)
    for r in results:
        if not r.get("available"):
            continue
        r["x_hf_eager"] = r["texts_per_s"] / base["texts_per_s"] if base else None
        bar = next((b for b in (0.9999, 0.999, 0.99) if (r.get("min_cos") or 0) >= b), 0.0)
        fair = [p for p in peers if p["min_cos"] >= bar and p is not r]
        best = max(fair, key=lambda p: p["texts_per_s"], default=None)
        r["best_peer_as_accurate"] = best["engine"] if best else None
        r["x_best_peer_as_accurate"] = r["texts_per_s"] / best["texts_per_s"] if best else None
