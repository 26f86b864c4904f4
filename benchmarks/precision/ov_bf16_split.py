"""Where OpenVINO bf16's time goes on a BF16 CPU, end to end: tokenizer, engine (GEMMs, attention, the other
ops, copies), and what the engine's configuration (graph, batch budget, streams) is worth.

    python benchmarks/precision/ov_bf16_split.py EXPORT_DIR --sts sts-test.csv [--budgets 2048,4096,8192,16384]
        [--repeat 3] [--out F.json]

On the STS sentences (both sides of every pair), in this one process:

- ``tokenize``: the engine's encoder over the extraction's length-sorted plan, alone (lengths, then each batch);
- ``engine`` per configuration, tokenization done first and not counted, best of ``--repeat`` passes:
  graph (``full``: the export, every hidden state an output, as the bench ran ov-bf16 before early exit's one
  rule reached it; ``pooled``: the graph an all-layer pooled run now opens, each layer pooled as made) x
  batch budget (and ``--max-batch`` texts at most) x streams (``1``: LATENCY hint, one request; ``2``: THROUGHPUT hint, 2 streams, an
  AsyncInferQueue of 2 requests); pooled.mean fetched and copied out as the engine does;
- ``profile``: OpenVINO's per-node performance counters (``PERF_COUNT``) over every batch of a configuration,
  summed per node type and grouped: weight GEMMs (FullyConnected), attention (the MatMuls between activations,
  Softmax), the other compute (norms, GELU, adds: Eltwise/Subgraph/MVN), data movement (Reorder, Convert,
  Concat, Transpose, Gather...). The weight GEMMs' own rate follows from their FLOPs and time;
- ``gemm ceiling``: the model's weight GEMMs alone as one bf16 model at the batch's rows;
- ``end to end``: ``layerscope``'s ov engine (variant bf16) through ``iter_pooled`` (background tokenizer) at
  each in-flight count and the chosen budget: what the bench's row measures.

Useful FLOPs: weight MatMuls and attention products of every layer on real tokens (``bench/peak.py``
``corpus_flops``). The peaks the shares are of are measured (``vector_peak.c``, every core at once: fp32 FMA and
bf16 VDPBF16PS in registers), with the bench's derived figure (flags x nominal clock) recorded beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from where_time_goes import _best as best_of  # this folder's other script: warm once, then the best of repeat

GROUPS = {
    "weight GEMMs": ("FullyConnected",),
    # OpenVINO's snippets: the attention (MatMul-Softmax-MatMul) and chains of elementwise ops, each fused into one
    "fused subgraphs (attention, elementwise)": ("Subgraph",),
    "attention (unfused)": ("MatMul", "Softmax", "ScaledDotProductAttention"),
    "norms, adds, masks, pooling": ("Eltwise", "MVN", "Math", "RMS", "Multiply", "Add", "MulAdd", "Select", "Erf",
                                    "Gelu", "Power", "Divide", "Sqrt", "ReduceMean", "ReduceSum", "ReduceMax",
                                    "Reduce", "Equal", "Greater", "Less", "Not", "Maximum", "Minimum", "Subtract"),
    "data movement": ("Reorder", "Convert", "Concat", "Transpose", "Gather", "Reshape", "StridedSlice", "Slice",
                      "Broadcast", "ShapeOf", "Split", "Squeeze", "Unsqueeze", "Range", "Tile", "ScatterUpdate",
                      "GatherElements", "Pad", "Input", "Output", "Parameter", "Result"),
}


def vector_peak() -> dict | None:
    """Each core's measured fp32 FMA and bf16 VDPBF16PS rates (vector_peak.c, compiled here), or None without gcc."""
    import shutil
    import subprocess
    import tempfile

    if shutil.which("gcc") is None:
        return None
    src = Path(__file__).with_name("vector_peak.c")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "vector_peak"
        subprocess.run(["gcc", "-O2", "-mavx512f", "-mavx512bf16", "-mavx512vl", "-mfma", "-o", str(exe), str(src)],
                       check=True)
        cores = len(os.sched_getaffinity(0))
        procs = [subprocess.Popen(["taskset", "-c", str(c), str(exe)], stdout=subprocess.PIPE, text=True)
                 for c in sorted(os.sched_getaffinity(0))]  # every core at once: what they reach together
        outs = [p.communicate()[0] for p in procs]
    rates: dict[str, list[float]] = defaultdict(list)
    for out in outs:
        for line in out.splitlines():
            if "GFLOP/s per core" in line:
                name, rest = line.split(":", 1)
                rates[name].append(float(rest.split()[0]))
    fp32 = max(sum(v) for k, v in rates.items() if k.startswith("fp32"))
    bf16 = max(sum(v) for k, v in rates.items() if k.startswith("bf16"))
    return {"per_core": dict(rates), "cores": cores, "fp32_gflops": fp32, "bf16_gflops": bf16}


def group_of(node_type: str) -> str:
    for name, types in GROUPS.items():
        if node_type in types:
            return name
    return "other"


MAX_BATCH = [256]  # texts per batch at most (the extraction's and the bench's default); --max-batch


def plan(handle, encoder, texts: list[str], budget: int) -> list:
    from layerscope.extraction.batching import plan_batches

    lengths = encoder.token_lengths(texts)
    rows = plan_batches(lengths, batch_tokens=budget, max_batch=MAX_BATCH[0], max_length=encoder.max_length)
    return [encoder([texts[i] for i in idx], index=idx, lengths=lengths[idx]) for idx in rows]


def compiled(path: Path, streams: int, perf: bool = False):
    from layerscope.engines.ov import ov_core

    config = {"PERFORMANCE_HINT": "LATENCY" if streams == 1 else "THROUGHPUT",
              "INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": 2}
    if streams > 1:
        config["NUM_STREAMS"] = streams
    if perf:
        config["PERF_COUNT"] = True
    core = ov_core()
    return core.compile_model(core.read_model(str(path)), "CPU", config)


def engine_seconds(path: Path, feeds: list[dict], streams: int, repeat: int) -> float:
    from layerscope.engines.ov import ov_module

    model = compiled(path, streams)
    out = next(i for i, p in enumerate(model.outputs) if "pooled.mean" in p.get_names())
    if streams == 1:
        req = model.create_infer_request()
        return best_of(lambda: [np.array(req.infer(f, share_inputs=True)[out], copy=True) for f in feeds], repeat)
    queue = ov_module().AsyncInferQueue(model, streams)
    queue.set_callback(lambda request, _: np.array(request.get_output_tensor(out).data, copy=True))

    def run():
        for f in feeds:
            queue.start_async(f, share_inputs=False)
        queue.wait_all()

    return best_of(run, repeat)


def profile(path: Path, feeds: list[dict]) -> dict:
    """Per node type: seconds over every batch (OpenVINO's counters; one stream), and the FullyConnected nodes'
    weight shapes (for their FLOPs)."""
    model = compiled(path, 1, perf=True)
    req = model.create_infer_request()
    by_type: dict[str, float] = defaultdict(float)
    fc: dict[str, float] = defaultdict(float)
    for f in feeds:
        req.infer(f, share_inputs=True)
        for info in req.profiling_info:
            if info.status.name != "EXECUTED":
                continue
            by_type[f"{info.node_type} [{info.exec_type}]"] += info.real_time.total_seconds()
            if info.node_type == "FullyConnected":
                fc[info.node_name] += info.real_time.total_seconds()
    groups: dict[str, float] = defaultdict(float)
    for key, s in by_type.items():
        groups[group_of(key.split(" [")[0])] += s
    total = sum(by_type.values())
    return {"total_s": total, "groups_s": dict(groups),
            "groups_share": {k: round(v / total, 4) for k, v in groups.items()},
            "top_types": dict(sorted(by_type.items(), key=lambda kv: -kv[1])[:16]),
            "fully_connected_nodes": len(fc)}


def gemm_ceiling(h: int, inter: int, rows: int, repeat: int) -> dict:
    from layerscope.engines.ov import ov_core, ov_module

    ov = ov_module()
    ops = ov.opset13
    x = ops.parameter([rows, h], np.float32, name="x")
    rng = np.random.default_rng(0)

    def w(a, b):
        return ops.constant((rng.standard_normal((b, a)) * 0.02).astype(np.float32))

    y = ops.matmul(x, w(h, 3 * h), False, True)  # as the export: weights [out, in], transposed
    y = ops.matmul(ops.slice(y, [0, 0], [rows, h], [1, 1]), w(h, h), False, True)
    y = ops.matmul(ops.matmul(y, w(h, inter), False, True), w(inter, h), False, True)
    model = ov_core().compile_model(ov.Model([y], [x]), "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                                 "INFERENCE_PRECISION_HINT": "bf16",
                                                                 "INFERENCE_NUM_THREADS": 2})
    req = model.create_infer_request()
    feed = {"x": rng.standard_normal((rows, h)).astype(np.float32)}
    seconds = best_of(lambda: req.infer(feed), repeat * 5)
    return {"rows": rows, "seconds": seconds, "gflops": 2 * rows * (4 * h * h + 2 * h * inter) / seconds / 1e9}


def end_to_end(export: Path, texts: list[str], requests: int, budget: int, repeat: int) -> dict:
    from layerscope.engines.base import create_engine
    from layerscope.extraction.batching import iter_pooled
    from layerscope.extraction.engine_plan import EngineReads, early_exit
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(export)
    layers = [str(i) for i in range(handle.manifest.num_layers + 1)]
    plan_ = early_exit(handle.manifest, EngineReads.of(layers, ("mean",)))
    eng = create_engine("ov", handle, variant="bf16", requests=requests, **plan_.as_kwargs())

    def run():
        for _ in iter_pooled(eng, texts, layers, ["mean"], batch_tokens=budget, max_batch=MAX_BATCH[0]):
            pass

    s = best_of(run, repeat)
    return {"requests": requests, "batch_tokens": budget, "seconds": s, "texts_per_s": len(texts) / s,
            "graph": eng.graph_path.name, "notes": eng.info.notes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--sts", required=True)
    ap.add_argument("--budgets", default="2048,4096,8192,16384")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-batch", type=int, default=256, help="texts per batch at most (default: the engine's)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    MAX_BATCH[0] = args.max_batch
    from layerscope.bench.machine import describe_machine
    from layerscope.bench.peak import corpus_flops, machine_peak, model_shapes
    from layerscope.data.pairs import read_sts
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    s1, s2, _ = read_sts(args.sts)
    texts = list(s1) + list(s2)
    handle = ModelHandle.resolve(args.export)
    shapes = model_shapes(args.export)
    say = lambda m: print(m, flush=True)  # noqa: E731
    derived = machine_peak()
    measured = vector_peak()
    # the peak the shares are of: measured where the compiler is at hand, else the bench's derived one (x2 for bf16)
    bf16_peak = measured["bf16_gflops"] if measured else 2 * derived["gflops"]
    doc = {"command": " ".join([sys.executable, *sys.argv]), "machine": describe_machine(),
           "load_start": os.getloadavg(), "texts": len(texts), "max_batch": args.max_batch,
           "derived_peak": derived, "measured_peak": measured, "bf16_peak_gflops": bf16_peak, "runs": []}
    if measured:
        say(f"measured peaks, every core at once: fp32 {measured['fp32_gflops']:.0f}, bf16 {measured['bf16_gflops']:.0f} "
            f"GFLOP/s (derived from flags and the nominal clock: fp32 {derived['gflops']:.0f}, bf16 "
            f"{2 * derived['gflops']:.0f})")
    full = handle.onnx_path
    pooled = create_engine("ov", handle, variant="bf16", depth=handle.manifest.num_layers, pooled_only=True,
                           requests=1).graph_path
    encoder = create_engine("ov", handle, variant="bf16", requests=1).encoder()
    t = time.perf_counter()
    batches = plan(handle, encoder, texts, 2048)
    doc["tokenize_s"] = time.perf_counter() - t
    lengths = np.concatenate([b.mask.sum(1) for b in batches])
    flops = corpus_flops(shapes, lengths)
    doc.update(tokens=int(lengths.sum()), useful_gflop=flops / 1e9)
    say(f"tokenize alone: {doc['tokenize_s']:.3f} s; {doc['tokens']:,} tokens, {flops / 1e9:.1f} GFLOP")
    for budget in (int(b) for b in args.budgets.split(",")):
        feeds = [{k: b.inputs[k] for k in handle.manifest.inputs} for b in plan(handle, encoder, texts, budget)]
        for graph, path in (("full", full), ("pooled", pooled)):
            for streams in (1, 2):
                s = engine_seconds(path, feeds, streams, args.repeat)
                row = {"graph": graph, "batch_tokens": budget, "streams": streams, "seconds": s,
                       "texts_per_s": len(texts) / s, "gflops": flops / s / 1e9,
                       "share_of_bf16_peak": flops / s / 1e9 / bf16_peak}
                doc["runs"].append(row)
                say(f"engine {graph:6} budget {budget:6} streams {streams}: {s:.3f} s, {row['texts_per_s']:.0f} "
                    f"texts/s, {100 * row['share_of_bf16_peak']:.1f}% of bf16 peak")
    doc["profiles"] = {}
    for budget in sorted({2048, max(int(b) for b in args.budgets.split(","))}):
        feeds = [{k: b.inputs[k] for k in handle.manifest.inputs} for b in plan(handle, encoder, texts, budget)]
        for graph, path in (("full", full), ("pooled", pooled)):
            prof = profile(path, feeds)
            # the weight GEMMs' rate: their FLOPs (every token, real or padded) over their counted time
            gemm_flops = 2 * sum(int(np.prod(f["input_ids"].shape)) for f in feeds) * shapes["layers"] * \
                (4 * shapes["hidden"] ** 2 + 2 * shapes["hidden"] * shapes["intermediate"])
            prof["weight_gemm_gflops"] = gemm_flops / prof["groups_s"].get("weight GEMMs", float("nan")) / 1e9
            prof["weight_gemm_share_of_bf16_peak"] = prof["weight_gemm_gflops"] / bf16_peak
            prof["padded_tokens"] = int(sum(int(np.prod(f["input_ids"].shape)) for f in feeds))
            doc["profiles"][f"{graph} budget {budget}"] = prof
            say(f"profile {graph} {budget}: {json.dumps(prof['groups_share'])}; weight GEMMs at "
                f"{prof['weight_gemm_gflops']:.0f} GFLOP/s")
    doc["gemm_ceiling"] = [gemm_ceiling(shapes["hidden"], shapes["intermediate"], rows, args.repeat)
                           for rows in (2048, 8192)]
    for g in doc["gemm_ceiling"]:
        g["share_of_bf16_peak"] = g["gflops"] / bf16_peak
    say(f"weight GEMMs alone: {[round(g['gflops']) for g in doc['gemm_ceiling']]} GFLOP/s")
    best = max(doc["runs"], key=lambda r: r["texts_per_s"])
    doc["end_to_end"] = [end_to_end(args.export, texts, req, budget, args.repeat)
                         for req in (1, 2) for budget in sorted({2048, best["batch_tokens"]})]
    for r in doc["end_to_end"]:
        r["share_of_bf16_peak"] = flops / r["seconds"] / 1e9 / bf16_peak
        say(f"end to end, {r['requests']} in flight, budget {r['batch_tokens']}: {r['texts_per_s']:.0f} texts/s, "
            f"{100 * r['share_of_bf16_peak']:.1f}% of bf16 peak")
    doc["load_end"] = os.getloadavg()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
