"""What float16 and bfloat16 stores lose against float32, per layer: MiniLM over the STS test sentences.

    python benchmarks/scaleout/half_error.py

Prints, per pooling and layer, the largest absolute error and the smallest row cosine of the vectors read
back from each half-size type (``store/store_dtype.error_stats``), the figures the refusal bar in
``store_dtype.MIN_COSINE`` is set from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from layerscope.extraction.pipeline import embed
from layerscope.store.store_dtype import error_stats

STS = Path(os.environ.get("LAYERSCOPE_STS_DIR", Path(__file__).resolve().parents[3] / "shared" / "data" / "stsbenchmark"))


def main() -> None:
    texts = []
    with open(STS / "sts-test.csv", encoding="utf-8", newline="") as fh:
        for line in fh:
            cols = line.rstrip("\r\n").split("\t")
            texts += [cols[5], cols[6]]
    vecs = embed("minilm", texts, engine="torch", layers="all", poolings=["mean", "cls"])
    worst = {}
    for (pooling, layer), x in sorted(vecs.items(), key=lambda kv: (kv[0][0], kv[0][1] != "raw", kv[0][1])):
        row = {"pooling": pooling, "layer": layer, "max_abs": float(abs(x).max())}
        for name in ("float16", "bfloat16"):
            err, cos = error_stats(x, name)
            row[name] = {"max_abs_error": err, "min_cosine": cos}
            w = worst.setdefault(name, {"max_abs_error": 0.0, "min_cosine": 1.0})
            w["max_abs_error"], w["min_cosine"] = max(w["max_abs_error"], err), min(w["min_cosine"], cos)
        print(json.dumps(row))
    print(json.dumps({"texts": len(texts), "worst": worst}))


if __name__ == "__main__":
    main()
