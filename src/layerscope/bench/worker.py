"""One bench row in its own process: ``python -m layerscope.bench.worker JOB.json``.

The job names what to run (a layerscope engine, the plain Hugging Face loop,
or a sentence-transformers backend), the texts file and an output folder.
The worker times ``passes`` warm passes over the texts, then splits the time
into tokenize / engine / pool-copy / write (layerscope engines: one more,
sequential pass; the Hugging Face loop: inside its last pass; sentence-transformers:
a tokenize-only pass, the rest of its best pass counted as engine), and
writes ``result.json``, ``vectors.npy`` (the first rows, for accuracy) and
``sts.npy`` (the STS sentences' vectors) into the output folder.  An engine
that cannot run here writes ``available: false`` and the reason.

Running each row in a fresh process keeps thread pools (torch's OpenMP,
ONNX Runtime's, OpenVINO's) and allocator state from one engine out of the
next one's timings.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


class Row:
    """What a runner hands back: how to encode texts, and how to split one pass's time."""

    def __init__(self, encode: Callable[[list[str]], np.ndarray], layers: list[str], info: dict[str, Any],
                 split: Callable[[list[str], float], dict[str, float]] | None = None,
                 own: Callable[[list[str]], np.ndarray] | None = None):
        self.encode, self.layers, self.info, self.split = encode, layers, info, split
        self.own = own  # the checkpoint's own embedding of texts (hf-eager, for a sentence-transformers model)


# ---------------------------------------------------------------- layerscope engines

def _engine_row(job: dict[str, Any]) -> Row:
    from layerscope.engines.registry import Runtime, engine_spec
    from layerscope.export.open import open_engine
    from layerscope.model.handle import ModelHandle
    from layerscope.extraction.batching import iter_pooled

    trust = job.get("trust_remote_code") is True  # the user's flag, as the parent resolved the model
    handle = ModelHandle.resolve(job["export_dir"], trust_remote_code=trust)
    options = dict(job.get("options") or {})
    variant = job.get("variant")
    needs = engine_spec(job["engine"]).export_variant(variant)  # the export variant running it needs made
    if needs and needs not in handle.manifest.variants:
        from layerscope.export.variants import make_variant
        from layerscope.model.variants import check_kind

        check_kind(needs)
        make_variant(handle.export_dir, needs, trust_remote_code=trust)
        handle = ModelHandle.resolve(job["export_dir"], trust_remote_code=trust)
    if variant:
        options["variant"] = variant
    if job.get("threads"):
        options["threads"] = job["threads"]
    layers, pooling = job["layers"], job["pooling"]
    from layerscope.bench.engine_rows import as_extracted

    eng = open_engine(handle, job["engine"], **as_extracted(handle.manifest, options, layers, pooling))
    kw = dict(batch_tokens=job.get("batch_tokens"), max_batch=job["max_batch"], max_length=job.get("max_length"))
    hidden = handle.manifest.hidden_size

    def encode(texts: list[str]) -> np.ndarray:
        out = np.empty((len(layers), len(texts), hidden), np.float32)
        for batch, pooled, _ in iter_pooled(eng, texts, layers, [pooling], **kw):
            out[:, batch.index] = pooled[pooling]
        return out

    def split(texts: list[str], best_s: float) -> dict[str, float]:
        from layerscope.extraction.batching import plan_batches
        from layerscope.store.store import LayerStore

        parts = dict.fromkeys(("tokenize_s", "engine_s", "pool_copy_s", "write_s"), 0.0)
        with tempfile.TemporaryDirectory(prefix="layerscope-bench-") as tmp:
            from layerscope.store.store_spec import StoreSpec

            store = LayerStore.create(Path(tmp) / "store", n=len(texts), spec=StoreSpec.bare(layers, [pooling]),
                                      hidden_size=hidden, manifest=handle.manifest)
            out = np.empty((len(layers), len(texts), hidden), np.float32)
            t = time.perf_counter()
            encoder = eng.encoder(kw["max_length"])
            lengths = encoder.token_lengths(texts)
            plan = plan_batches(lengths, batch_tokens=int(kw["batch_tokens"] or eng.preferred_batch_tokens),
                                max_batch=kw["max_batch"], max_length=encoder.max_length)
            parts["tokenize_s"] += time.perf_counter() - t
            for rows in plan:
                t0 = time.perf_counter()
                batch = encoder([texts[i] for i in rows], index=rows, lengths=lengths[rows])
                t1 = time.perf_counter()
                pooled = eng.run(batch, layers, [pooling])
                t2 = time.perf_counter()
                out[:, batch.index] = pooled[pooling]
                t3 = time.perf_counter()
                store.write(batch.index, pooled, layers)
                t4 = time.perf_counter()
                parts["tokenize_s"] += t1 - t0
                parts["engine_s"] += t2 - t1
                parts["pool_copy_s"] += t3 - t2
                parts["write_s"] += t4 - t3
            t = time.perf_counter()
            store.commit(np.arange(len(texts)))
            store.close()
            parts["write_s"] += time.perf_counter() - t
        return parts

    info = {"provider": eng.info.provider, "precision": eng.info.precision, "notes": list(eng.info.notes),
            "device": eng.info.device,
            "allocator": "torch" if engine_spec(eng.info.name).runtime is Runtime.PYTORCH else "nvml"}
    return Row(encode, layers, info, split)


# ---------------------------------------------------------------- the plain Hugging Face loop

def _hf_row(job: dict[str, Any]) -> Row:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from layerscope.engines.ort_session import physical_cores
    from layerscope.model.handle import ModelHandle

    trust = job.get("trust_remote_code") is True  # the user's flag, never None: no interactive prompt
    handle = ModelHandle.resolve(job["export_dir"], trust_remote_code=trust)
    source = handle.source()
    torch.set_num_threads(int(job.get("threads") or physical_cores() or 1))
    tok = AutoTokenizer.from_pretrained(source.path_or_id, trust_remote_code=trust)
    net = AutoModel.from_pretrained(source.path_or_id, use_safetensors=True, dtype=torch.float32,
                                    trust_remote_code=trust).eval()
    layers, size = job["layers"], int(job["hf_batch_size"])
    max_len = int(job.get("max_length") or handle.manifest.max_length)
    parts = dict.fromkeys(("tokenize_s", "engine_s", "pool_copy_s", "write_s"), 0.0)

    def encode(texts: list[str]) -> np.ndarray:
        from layerscope.vocab.pooling import pool_torch

        for k in parts:  # the split of the latest pass
            parts[k] = 0.0
        chunks = []
        for lo in range(0, len(texts), size):
            t0 = time.perf_counter()
            enc = tok(texts[lo:lo + size], padding=True, truncation=True, max_length=max_len, return_tensors="pt")
            t1 = time.perf_counter()
            with torch.inference_mode():
                out = net(**enc, output_hidden_states=True)
                t2 = time.perf_counter()
                pooled = torch.stack([pool_torch(out.hidden_states[int(n)], enc["attention_mask"], job["pooling"])
                                      for n in layers]).numpy()
            chunks.append(pooled)
            t3 = time.perf_counter()
            parts["tokenize_s"] += t1 - t0
            parts["engine_s"] += t2 - t1
            parts["pool_copy_s"] += t3 - t2
        return np.concatenate(chunks, axis=1)

    def split(texts: list[str], best_s: float) -> dict[str, float]:
        return dict(parts)  # measured inside the last timed pass: no extra pass over the corpus

    recipe = job.get("st_recipe")

    def own(texts: list[str]) -> np.ndarray:  # not timed: the reference of the sentence-transformers rows
        from layerscope.bench.baseline_rows import own_embedding

        chunks = []
        for lo in range(0, len(texts), size):
            enc = tok(texts[lo:lo + size], padding=True, truncation=True, max_length=max_len, return_tensors="pt")
            with torch.inference_mode():
                chunks.append(own_embedding(net(**enc), enc["attention_mask"], recipe).numpy())
        return np.concatenate(chunks)

    info = {"provider": f"torch-cpu ({torch.get_num_threads()} threads)", "precision": "fp32", "notes": [],
            "device": "cpu"}
    return Row(encode, layers, info, split, own if recipe else None)


# ---------------------------------------------------------------- sentence-transformers backends

def _st_row(job: dict[str, Any]) -> Row:
    from sentence_transformers import SentenceTransformer

    backend, file_name = job["backend"], job.get("file_name")
    kwargs: dict[str, Any] = {}
    if backend == "onnx":
        kwargs["model_kwargs"] = {"provider": "CPUExecutionProvider", **({"file_name": file_name} if file_name else {})}
    if backend == "torch" and job.get("threads"):
        import torch

        torch.set_num_threads(int(job["threads"]))
    device = job.get("device", "cpu")
    model = SentenceTransformer(job["model_dir"], backend=backend, device=device,
                                trust_remote_code=job.get("trust_remote_code") is True, **kwargs)
    if job.get("precision") == "fp16":
        model.half()
    if job.get("max_length"):
        model.max_seq_length = int(job["max_length"])
    size = int(job["st_batch_size"])

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(texts, batch_size=size, convert_to_numpy=True, show_progress_bar=False)[None]

    def split(texts: list[str], best_s: float) -> dict[str, float]:
        t = time.perf_counter()
        for lo in range(0, len(texts), size):
            model.tokenize(texts[lo:lo + size])
        tokenize = time.perf_counter() - t
        # encode() tokenizes inside; the rest of its best pass is its model run, pooling and copies together
        return {"tokenize_s": tokenize, "engine_s": max(best_s - tokenize, 0.0), "pool_copy_s": None,
                "write_s": None}

    info = {"provider": f"sentence-transformers {backend} on {device}" + (f" ({file_name})" if file_name else ""),
            "precision": job.get("precision", "fp32"), "notes": [], "device": device,
            "allocator": "torch" if backend == "torch" else "nvml"}
    return Row(encode, [job["layers"][-1]], info, split)


RUNNERS = {"engine": _engine_row, "hf-eager": _hf_row, "st": _st_row}


def _device_index(device: str) -> int:
    """The CUDA device number of ``cuda`` / ``cuda:N``."""
    return int(device.split(":")[1]) if ":" in device else 0


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    from contextlib import nullcontext

    from layerscope.bench.gpu_peak import GpuMemory, gpu_peak, on_gpu, set_tokenization
    from layerscope.bench.machine import PeakMemory
    from layerscope.errors import LayerscopeError

    out_dir = Path(job["out_dir"])
    texts = json.loads(Path(job["texts_file"]).read_text(encoding="utf-8"))
    result: dict[str, Any] = {"engine": job["name"], "kind": job["row_kind"], "available": True,
                              "pid": os.getpid(), "round": job.get("round"), "started": time.time()}
    t0 = time.perf_counter()
    try:
        row = RUNNERS[job["kind"]](job)
        result["tokenization"] = set_tokenization(row.info.get("device"))
        row.encode(texts[: min(64, len(texts))])  # warm-up
    except (LayerscopeError, ImportError) as exc:
        result.update(available=False, reason=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return result
    result["setup_s"] = time.perf_counter() - t0
    info = dict(row.info)
    allocator = info.pop("allocator", None)
    result.update(info)
    result["layers"] = row.layers
    gpu = on_gpu(info.get("device"))
    if gpu:
        result["gpu_peak"] = gpu_peak(info.get("precision"), _device_index(info["device"])).to_dict()
    seconds, cpu = [], []
    vectors = None
    with PeakMemory() as mem, (GpuMemory(allocator or "nvml") if gpu else nullcontext()) as gmem:
        for _ in range(int(job["passes"])):
            c0, w0 = time.process_time(), time.perf_counter()
            vectors = row.encode(texts)
            seconds.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
    if gpu:
        result["gpu_memory"] = gmem.result()
    result.update(pass_seconds=seconds, pass_cpu_s=cpu, texts=len(texts), peak_rss_mib=mem.peak_rss / 2**20,
                  load_avg_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
    np.save(out_dir / "vectors.npy", np.ascontiguousarray(vectors[:, : int(job["n_acc"])], dtype=np.float32))
    if row.own is not None:
        np.save(out_dir / "own.npy", np.ascontiguousarray(row.own(texts[: int(job["n_acc"])]), dtype=np.float32))
    if row.split is not None:
        result["split"] = row.split(texts, min(seconds))
    if job.get("sts_file"):
        sentences = json.loads(Path(job["sts_file"]).read_text(encoding="utf-8"))
        np.save(out_dir / "sts.npy", row.encode(sentences).astype(np.float32))
    return result


def main(argv: list[str]) -> int:
    from layerscope.signals import child_start

    child_start()  # Ctrl-C is the bench's to answer: it stops this row's process
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        result = run_job(job)
    except Exception as exc:  # reported as this row's reason, never a traceback in the table
        result = {"engine": job["name"], "kind": job["row_kind"], "available": False,
                  "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    Path(job["out_dir"], "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
