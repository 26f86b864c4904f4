"""Token-level vs pooled extraction: texts/s, tokens/s and disk bytes per token (benchmarks/tokens/README.md).

    python benchmarks/tokens/run.py EXPORT_DIR STS_CSV OUT_JSON [--long N]

EXPORT_DIR: an export (layerscope export minilm --out ...). Runs, each into a fresh store (wall and process CPU seconds: the CPU
seconds per token are the figure a loaded machine distorts least), engine ort, every
layer, mean pooling: pooled only; --tokens in float32, float16 and bfloat16. Corpora: the STS test
sentences, and --long N texts of ~512 tokens (STS sentences joined). Records `uptime` beside each figure.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def sts_sentences(path: Path) -> list[str]:
    out = []
    with open(path, encoding="utf-8", newline="") as fh:
        for row in csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(row) >= 7:
                out += [row[5], row[6]]
    return out


def long_texts(sentences: list[str], n: int, words: int = 380) -> list[str]:
    out, cur = [], []
    for s in sentences * 10:
        cur.append(s)
        if sum(len(x.split()) for x in cur) >= words:
            out.append(" ".join(cur))
            cur = []
            if len(out) == n:
                break
    return out


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(export: str, texts: list[str], label: str, tmp: Path) -> list[dict]:
    from layerscope.extraction.pipeline import extract

    rows = []
    for name, kw in (("pooled", {}), ("tokens-float32", {"tokens": True}),
                     ("tokens-float16", {"tokens": True, "store_dtype": "float16"}),
                     ("tokens-bfloat16", {"tokens": True, "store_dtype": "bfloat16"})):
        out = tmp / f"{label}-{name}"
        load = os.getloadavg()
        t, cpu = time.perf_counter(), time.process_time()
        rep = extract(export, texts, out, engine="ort", layers="all", poolings=["mean"], **kw)
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        meta = rep.store.meta
        tok_bytes = du(out / "tokens") if (out / "tokens").exists() else 0
        total = meta["token_arrays"]["total_tokens"] if "token_arrays" in meta else int(meta["tokens"])
        rows.append({"corpus": label, "run": name, "texts": rep.n, "tokens": total,
                     "texts_per_s": round(rep.texts_per_s, 1), "tokens_per_s": round(rep.tokens_per_s, 0),
                     "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                     "tokens_per_cpu_s": round(total / cpu, 0), "store_bytes": du(out), "token_bytes": tok_bytes,
                     "bytes_per_token": round(tok_bytes / total, 1) if tok_bytes else None,
                     "layers": len(rep.store.layers), "hidden": rep.store.meta["hidden_size"],
                     "loadavg_1_5_15": [round(x, 2) for x in load],
                     "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()})
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(out)
    return rows


def main() -> None:
    export, sts, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    n_long = int(sys.argv[sys.argv.index("--long") + 1]) if "--long" in sys.argv else 0
    sentences = sts_sentences(sts)
    tmp = Path(tempfile.mkdtemp(prefix="tokens-bench-"))
    try:
        rows = run(export, sentences, "sts-test", tmp)
        if n_long:
            rows += run(export, long_texts(sentences, n_long), f"long-{n_long}", tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out.write_text(json.dumps({"cpu": os.cpu_count(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
