"""The gqa variant against the plain fp32 graph by text length: tokens/s of one 2,048-token batch.

    python benchmarks/models/gqa_lengths.py EXPORT_DIR [--lengths 16,128,512] [--repeat 3]

The export must have its ``gqa`` variant (``layerscope optimize EXPORT_DIR --variant gqa``). For each
length, a batch of 2,048 // length texts of exactly that many tokens (seeded random ids, every row real,
no padding) runs through ONNX Runtime on the fp32 graph and on the gqa graph, each session built as the
``ort`` engine builds it, all outputs fetched (every hidden state); best of ``--repeat`` after a warm-up.
The two graphs' outputs are compared too (worst cosine over every hidden state). Output: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export_dir", type=Path)
    ap.add_argument("--lengths", default="16,128,512")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from layerscope.engines.ort import make_session
    from layerscope.model.manifest import read_manifest

    manifest = read_manifest(args.export_dir)
    gqa = manifest.variant("gqa")
    if gqa is None:
        raise SystemExit(f"{args.export_dir} has no gqa variant: layerscope optimize {args.export_dir} --variant gqa")
    cfg = json.loads((args.export_dir / "config.json").read_text())
    result = {"export": str(args.export_dir), "layers": manifest.num_layers, "hidden": manifest.hidden_size,
              "heads": cfg["num_attention_heads"], "kv_heads": cfg.get("num_key_value_heads"),
              "loadavg_start": os.getloadavg(), "rows": []}
    sessions = {"ort": make_session(args.export_dir / manifest.onnx_file, "CPUExecutionProvider"),
                "ort-gqa": make_session(args.export_dir / gqa.file, "CPUExecutionProvider")}
    rng = np.random.default_rng(0)
    for length in (int(x) for x in args.lengths.split(",")):
        batch = max(1, 2048 // length)
        ids = rng.integers(100, min(int(cfg["vocab_size"]), 30000), size=(batch, length), dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                "position_ids": np.broadcast_to(np.arange(length, dtype=np.int64), ids.shape).copy()}
        row = {"length": length, "batch": batch}
        outs = {}
        for name, session in sessions.items():
            names = [o.name for o in session.get_outputs()]
            feed_n = {i.name: feed[i.name] for i in session.get_inputs()}
            outs[name] = dict(zip(names, session.run(names, feed_n)))
            best = float("inf")
            for _ in range(args.repeat):
                t = time.perf_counter()
                session.run(names, feed_n)
                best = min(best, time.perf_counter() - t)
            row[f"{name} tokens/s"] = round(batch * length / best, 1)
        row["gqa / ort"] = round(row["ort-gqa tokens/s"] / row["ort tokens/s"], 3)
        worst = 1.0
        for key, ref in outs["ort"].items():
            if key.startswith("hidden_states."):
                a = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
                b = outs["ort-gqa"][key].reshape(-1, ref.shape[-1]).astype(np.float64)
                cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
                worst = min(worst, float(cos.min()))
        row["worst cosine gqa vs fp32 graph"] = worst
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    result["loadavg_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
