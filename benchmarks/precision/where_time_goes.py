"""Where a reduced-precision CPU engine spends its time: per operator type, on the batches layerscope runs.

    python benchmarks/precision/where_time_goes.py EXPORT_DIR --sts sts-test.csv [--texts 2758] [--out F.json]

For one export (all layers, mean pooling in the graph) and the STS sentences, planned into the same
length-sorted batches the extraction runs (``plan_batches``, 2,048 tokens), this times each configuration
over every batch (best of ``--repeat`` passes, in this one process, tokenization done first and not
counted) and splits the engine's time by operator type from the runtime's own profiler: OpenVINO's
per-node performance counters (``PERF_COUNT``) and ONNX Runtime's profiling JSON. Configurations:

- ``ov-bf16`` as the engine runs it (LATENCY hint, one stream) and at other batch budgets;
- ``ov-bf16`` with the THROUGHPUT hint, two streams fed by an ``AsyncInferQueue`` (two batches at once);
- ``ov-bf16`` MatMul alone at the model's shapes: the ceiling the graph's GEMMs reach here;
- ``ort-int8`` and ``ort-int8-block`` when the export has those variants.

Useful FLOPs count the weight MatMuls and the attention products on real tokens only (as the bench's
peak figure does); the bf16 peak is twice the fp32 one (AVX512_BF16's VDPBF16PS: two products per fp32 lane).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


def _batches(export_dir: Path, texts: list[str], batch_tokens: int):
    from layerscope.model.handle import ModelHandle
    from layerscope.model.tokenize import Encoder
    from layerscope.extraction.batching import plan_batches

    handle = ModelHandle.resolve(export_dir)
    enc = Encoder(handle.encoding_tokenizer(), list(handle.manifest.inputs), handle.manifest.max_length)
    lengths = np.array([len(x) for x in handle.encoding_tokenizer()(texts)["input_ids"]])
    plan = plan_batches(lengths, batch_tokens=batch_tokens, max_length=handle.manifest.max_length)
    batches = [enc([texts[i] for i in idx]) for idx in plan]
    return handle, [{k: b.inputs[k] for k in handle.manifest.inputs} for b in batches], \
        int(sum(int(b.mask.sum()) for b in batches)), batches


def _flops(manifest, cfg: dict, batches) -> float:
    """Weight MatMuls + attention products over real tokens (2 FLOPs per multiply-add)."""
    h, layers = manifest.hidden_size, manifest.num_layers
    inter = int(cfg.get("intermediate_size") or 4 * h)
    per_token = 2 * layers * (4 * h * h + 2 * h * inter)
    attention = sum(2 * layers * 2 * h * float((b.mask.sum(1) ** 2).sum()) for b in batches)
    return per_token * sum(float(b.mask.sum()) for b in batches) + attention


def _best(run, repeat: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def _ov_compiled(path: Path, hint: str, perf: bool):
    from layerscope.engines.ov import ov_core

    config = {"PERFORMANCE_HINT": hint, "INFERENCE_PRECISION_HINT": "bf16"}
    if perf:
        config["PERF_COUNT"] = True
    return ov_core().compile_model(ov_core().read_model(str(path)), "CPU", config)


def ov_latency(path: Path, feeds, repeat: int) -> dict:
    compiled = _ov_compiled(path, "LATENCY", perf=False)
    req = compiled.create_infer_request()
    seconds = _best(lambda: [req.infer(f, share_inputs=True) for f in feeds], repeat)
    prof = _ov_compiled(path, "LATENCY", perf=True).create_infer_request()
    by_type: dict[str, float] = defaultdict(float)
    for f in feeds:
        prof.infer(f, share_inputs=True)
        for info in prof.profiling_info:
            if info.status.name == "EXECUTED":
                by_type[f"{info.node_type} [{info.exec_type}]"] += info.real_time.total_seconds()
    return {"seconds": seconds, "streams": int(compiled.get_property("NUM_STREAMS")), "by_type": dict(by_type)}


def ov_throughput(path: Path, feeds, repeat: int) -> dict:
    from layerscope.engines.ov import ov_module

    ov = ov_module()
    compiled = _ov_compiled(path, "THROUGHPUT", perf=False)
    queue = ov.AsyncInferQueue(compiled, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))

    def run():
        for f in feeds:
            queue.start_async(f, share_inputs=False)
        queue.wait_all()

    return {"seconds": _best(run, repeat), "streams": int(compiled.get_property("NUM_STREAMS")),
            "requests": len(queue)}


def ov_matmul_ceiling(manifest, cfg: dict, tokens: int, repeat: int) -> dict:
    """The graph's weight GEMMs alone, as one bf16 OpenVINO model, on ``tokens`` rows: their best rate here."""
    from layerscope.engines.ov import ov_core, ov_module

    ov = ov_module()
    ops = ov.opset13 if hasattr(ov, "opset13") else ov.runtime.opset13
    h = manifest.hidden_size
    inter = int(cfg.get("intermediate_size") or 4 * h)
    x = ops.parameter([tokens, h], np.float32, name="x")
    rng = np.random.default_rng(0)
    w = {k: ops.constant(rng.standard_normal(s).astype(np.float32) * 0.02)
         for k, s in {"qkv": (h, 3 * h), "o": (h, h), "up": (h, inter), "down": (inter, h)}.items()}
    y = ops.matmul(x, w["qkv"], False, False)
    y = ops.matmul(ops.slice(y, [0, 0], [tokens, h], [1, 1]), w["o"], False, False)
    y = ops.matmul(ops.matmul(y, w["up"], False, False), w["down"], False, False)
    model = ov.Model([y], [x])
    compiled = ov_core().compile_model(model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "bf16"})
    req = compiled.create_infer_request()
    feed = {"x": rng.standard_normal((tokens, h)).astype(np.float32)}
    seconds = _best(lambda: req.infer(feed), repeat * 3)
    flops = 2 * tokens * (4 * h * h + 2 * h * inter)
    return {"rows": tokens, "seconds": seconds, "gflops": flops / seconds / 1e9}


def ort_profile(path: Path, feeds, repeat: int) -> dict:
    import onnxruntime as ort

    from layerscope.engines.ort import make_session

    session = make_session(path, "CPUExecutionProvider")
    outs = ["pooled.mean"]
    seconds = _best(lambda: [session.run(outs, f) for f in feeds], repeat)
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = f"/tmp/ort-profile-{os.getpid()}"
    prof = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    for f in feeds:
        prof.run(outs, f)
    trace = json.loads(Path(prof.end_profiling()).read_text())
    by_type: dict[str, float] = defaultdict(float)
    for ev in trace:
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            by_type[ev["args"].get("op_name", "?")] += ev["dur"] / 1e6
    return {"seconds": seconds, "by_type": dict(by_type)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir", type=Path)
    ap.add_argument("--sts", type=Path, required=True)
    ap.add_argument("--texts", type=int, default=2758)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budgets", default="1024,2048,4096,8192")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from layerscope.bench.machine import describe_machine
    from layerscope.bench.texts import bench_texts

    texts = bench_texts(sts_texts=True, sts=str(args.sts))[0][: args.texts]
    cfg = json.loads((args.export_dir / "config.json").read_text())
    result: dict = {"export": str(args.export_dir), "texts": len(texts), "loadavg_start": os.getloadavg(),
                    "machine": describe_machine(), "runs": {}}
    handle, feeds, tokens, batches = _batches(args.export_dir, texts, 2048)
    flops = _flops(handle.manifest, cfg, batches)
    result.update(tokens=tokens, useful_gflop=flops / 1e9)
    onnx_path = args.export_dir / handle.manifest.onnx_file
    for budget in (int(b) for b in args.budgets.split(",")):
        _, f_b, _, _ = _batches(args.export_dir, texts, budget)
        r = ov_latency(onnx_path, f_b, args.repeat) if budget == 2048 else \
            {"seconds": _best(lambda: [req.infer(f, share_inputs=True) for f in f_b], args.repeat)
             if (req := _ov_compiled(onnx_path, "LATENCY", False).create_infer_request()) else None}
        result["runs"][f"ov-bf16 latency batch_tokens={budget}"] = r
    result["runs"]["ov-bf16 throughput (2 streams) batch_tokens=2048"] = ov_throughput(onnx_path, feeds, args.repeat)
    result["runs"]["ov-bf16 weight GEMMs alone"] = ov_matmul_ceiling(handle.manifest, cfg, 2048, args.repeat)
    for kind in ("int8", "int8-block"):
        entry = handle.manifest.variant(kind)
        if entry:
            result["runs"][f"ort-{kind}"] = ort_profile(args.export_dir / entry.file, feeds, args.repeat)
    result["runs"]["ort fp32"] = ort_profile(onnx_path, feeds, args.repeat)
    for r in result["runs"].values():
        if "seconds" in r and "gflops" not in r:
            r["texts_per_s"] = round(len(texts) / r["seconds"], 1)
            r["gflops"] = round(flops / r["seconds"] / 1e9, 1)
    result["loadavg_end"] = os.getloadavg()
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
