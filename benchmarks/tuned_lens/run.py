"""The tuned lens at a real shape (random weights): training throughput from a token store, and decoding through
the tuned lens's graph against the logit lens's on ONNX Runtime, on the same hidden states.

    PYTHONPATH=src python benchmarks/tuned_lens/run.py prepare [--shape qwen2.5-0.5b] [--work DIR]
    PYTHONPATH=src /work/bin/quiet python benchmarks/tuned_lens/run.py train [--steps 2 --tokens-per-step 256]
    PYTHONPATH=src /work/bin/quiet python benchmarks/tuned_lens/run.py decode [--texts 24 --passes 3]
    PYTHONPATH=src python benchmarks/tuned_lens/run.py --table

``prepare`` builds the shape (benchmarks/models/build.py), extracts a token store of every layer from STS
Benchmark train sentences (``--engine ort``, which exports it once) and trains a 1-step lens so the decode stage
has translators; ``train`` times ``train_lens`` (tokens/s: the tokens of the timed steps over their seconds, setup
left out; and the whole call); ``decode`` runs the export's ``model.onnx`` once for every layer's hidden states of
held-out STS dev sentences, then times the logit lens's head graph and the tuned lens's over those same states
(tokens decoded at every layer per second, the best of ``--passes``), and the whole ``run lens`` without and with
``--tuned``. Each stage writes ``results/tuned-lens-<shape>/<stage>.json`` with the load before and after, the
machine (CPU flags, cores) and the library versions. Not in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# the STS Benchmark beside the checkout (../shared), or where $LAYERSCOPE_STS_DIR says
STS = Path(os.environ.get("LAYERSCOPE_STS_DIR") or next(
    (p for p in (REPO.parent / "shared" / "data" / "stsbenchmark", REPO.parents[1] / "shared" / "data" / "stsbenchmark")
     if p.is_dir()), REPO.parent / "shared" / "data" / "stsbenchmark"))


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _sentences(name: str, n: int) -> list[str]:
    lines = (STS / name).read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[5] for line in lines[:n]]


def _write(args, stage: str, figures: dict, load_before: list[float]) -> Path:
    from layerscope.bench.machine import describe_machine

    out = REPO / "benchmarks" / "results" / f"tuned-lens-{args.shape}" / f"{stage}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"stage": stage, "shape": args.shape, "command": " ".join(sys.argv), "figures": figures,
           "load_before": load_before, "load_after": _load(), "machine": describe_machine(),
           "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))
    return out


def prepare(args) -> None:
    sys.path.insert(0, str(REPO / "benchmarks" / "models"))
    from build import build

    from layerscope.decoding.tuned_record import TrainSettings
    from layerscope.decoding.tuned_train import train_lens
    from layerscope.extraction.pipeline import extract

    work = Path(args.work)
    if not (work / "model" / "config.json").exists():
        build(args.shape, work / "model")
    if not (work / "store" / "store.json").exists():
        extract(str(work / "model"), _sentences("sts-train.csv", args.train_texts), work / "store", engine="ort",
                layers="all", poolings=["last"], tokens=True, progress=True)
    if not (work / "lens" / "params.pt").exists():
        train_lens(work / "store", work / "lens", settings=TrainSettings(steps=1, tokens_per_step=64))


def train(args) -> None:
    from layerscope.decoding.tuned_record import TrainSettings
    from layerscope.decoding.tuned_train import micro_batch, train_lens
    from layerscope.store.store import LayerStore

    work = Path(args.work)
    load = _load()
    t0 = time.perf_counter()
    rec = train_lens(work / "store", work / "timed-lens", force=True,
                     settings=TrainSettings(steps=args.steps, tokens_per_step=args.tokens_per_step))
    wall = time.perf_counter() - t0
    store = LayerStore.open(work / "store")
    _write(args, "train", {"steps": rec.steps_done, "tokens_per_step": args.tokens_per_step,
                           "tokens_trained": rec.tokens_seen, "seconds_in_steps": rec.seconds,
                           "tokens_per_second": rec.tokens_per_second, "seconds_whole_call": round(wall, 2),
                           "micro_batch": micro_batch(rec.vocab_size), "layers": rec.num_layers,
                           "hidden": rec.hidden_size, "vocab": rec.vocab_size, "store_tokens": rec.tokens,
                           "store_dtype": store.record.token_arrays.dtype, "threads": _threads()}, load)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def decode(args) -> None:
    import numpy as np

    from layerscope.analyses.base import RunRequest, run_analysis
    from layerscope.decoding.lens_onnx import export_lens, lens_file, onnx_lens, read_sidecar
    from layerscope.decoding.tuned_lens import read_lens
    from layerscope.engines.ort_session import make_session
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle
    from layerscope.model.tokenize import Encoder
    from layerscope.vocab.outputs import hidden_outputs

    work = Path(args.work)
    tuned = read_lens(work / "lens")
    handle = ensure_export(ModelHandle.resolve(str(work / "model")))
    k, m = 5, handle.manifest
    for lens in (None, tuned):
        if read_sidecar(handle, k, lens) is None:
            export_lens(handle.export_dir, k, tuned=lens)
    texts = _sentences("sts-dev.csv", args.texts)
    batch = Encoder(handle.tokenizer(), list(m.inputs), 128)(texts)
    graph = make_session(handle.onnx_path, "CPUExecutionProvider")
    hidden = graph.run(hidden_outputs(m.num_layers), {i.name: np.ascontiguousarray(batch.inputs[i.name])
                                                      for i in graph.get_inputs()})
    del graph
    tokens = int(np.asarray(batch.mask).sum())
    load = _load()
    figures = {"texts": len(texts), "tokens": tokens, "layers_decoded": m.num_layers + 1, "vocab": m.vocab_size,
               "hidden": m.hidden_size, "k": k}
    for name, lens in (("logit", None), ("tuned", tuned)):
        session = make_session(handle.export_dir / lens_file(k, lens), "CPUExecutionProvider")
        best = None
        for _ in range(args.passes):
            t0 = time.perf_counter()
            onnx_lens(session, hidden, batch.input_ids, batch.mask, True, k, int(m.vocab_size), divergence=True)
            took = time.perf_counter() - t0
            best = took if best is None else min(best, took)
        figures[f"{name}_head_seconds"] = round(best, 3)
        figures[f"{name}_head_tokens_per_second"] = round(tokens / best, 2)
        del session
    figures["tuned_over_logit_seconds"] = round(figures["tuned_head_seconds"] / figures["logit_head_seconds"], 3)
    figures.update(_before_divergence(handle, hidden, batch, k, tokens, args.passes))
    data = work / "heldout.txt"
    data.write_text("\n".join(texts) + "\n", encoding="utf-8")
    for name, options in (("run_lens", {}), ("run_lens_tuned", {"tuned": str(work / "lens")})):
        t0 = time.perf_counter()
        run_analysis("lens", RunRequest(models=[str(work / "model")], engine="ort", data=str(data), cache=False,
                                        out=work / f"out-{name}", force=True, recompute=True,
                                        options={"top_k": k, "show": 0, **options}))
        figures[f"{name}_seconds"] = round(time.perf_counter() - t0, 2)
    _write(args, "decode", figures, load)


def _before_divergence(handle, hidden, batch, k: int, tokens: int, passes: int) -> dict:
    """The logit lens's head as it was before the KL and log-probability outputs (traced without them, its
    positions per run under the 8-byte budget of then), timed on the same states: the baseline the new graph is
    held to."""
    import tempfile

    import layerscope.decoding.lens as lens_mod
    from layerscope.decoding import lens_onnx
    from layerscope.decoding.heads import load_decoding_model
    from layerscope.engines.ort_session import make_session

    model = load_decoding_model(handle)
    traced = lens_mod.lens_outputs
    lens_mod.lens_outputs = lambda *a, **kw: traced(*a, **{**kw, "divergence": False})
    outputs, budget = lens_onnx.OUTPUTS, lens_onnx.LOGIT_BYTES
    try:
        lens_onnx.OUTPUTS = lens_onnx.DECODED
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "before.onnx"
            lens_onnx._trace_head(model, k, int(handle.manifest.hidden_size), 17, path)
            session = make_session(path, "CPUExecutionProvider")
            lens_onnx.LOGIT_BYTES = 8
            best = None
            for _ in range(passes):
                t0 = time.perf_counter()
                lens_onnx.onnx_lens(session, hidden, batch.input_ids, batch.mask, True, k,
                                    int(handle.manifest.vocab_size))
                best = min(best or 1e9, time.perf_counter() - t0)
    finally:
        lens_mod.lens_outputs, lens_onnx.OUTPUTS, lens_onnx.LOGIT_BYTES = traced, outputs, budget
    return {"before_divergence_head_seconds": round(best, 3),
            "before_divergence_head_tokens_per_second": round(tokens / best, 2)}


def table(args) -> None:
    folder = REPO / "benchmarks" / "results" / f"tuned-lens-{args.shape}"
    for stage in ("train", "decode"):
        path = folder / f"{stage}.json"
        if path.exists():
            doc = json.loads(path.read_text())
            flags = " ".join(doc["machine"]["cpu_flags"])
            print(f"## {stage} ({doc['measured']}, load {doc['load_before']} -> {doc['load_after']}; {flags})")
            for key, value in doc["figures"].items():
                print(f"- {key}: {value}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", nargs="?", choices=("prepare", "train", "decode"))
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--work", default=os.environ.get("TUNED_BENCH_DIR", "/tmp/tuned-lens-bench"))
    ap.add_argument("--train-texts", type=int, default=400)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tokens-per-step", type=int, default=256)
    ap.add_argument("--texts", type=int, default=24)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args()
    if args.table or args.stage is None:
        return table(args)
    {"prepare": prepare, "train": train, "decode": decode}[args.stage](args)


if __name__ == "__main__":
    main()
