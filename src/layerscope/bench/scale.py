"""Scale run: N short synthetic texts through the real ``extract`` path, peak memory at checkpoints.

Run as ``python -m layerscope.bench.scale --model EXPORT --n 1000000 --engine ort --variant int8 --out DIR``.
The corpus is streamed to a text file first (never held in memory), then
extracted into a LayerStore; host RSS and anonymous RSS (RSS without the
memory-mapped store pages) are sampled on a thread, and the peaks so far are
recorded when the run passes 10k, 100k, 1M, ... rows.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def scale_run(model: str, n: int, out: Path, *, engine: str = "ort", variant: str | None = None,
              layers: str = "all", pooling: str = "mean", profile: str = "short", seed: int = 0,
              dtype: str = "float16", batch_tokens: int | None = None, threads: int | None = None) -> dict[str, Any]:
    from layerscope.bench.machine import PeakMemory, current_rss, describe_machine
    from layerscope.data.synthetic import iter_synthetic
    from layerscope.extraction.pipeline import extract

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / f"synthetic-{profile}-{n}.txt"
    t0 = time.perf_counter()
    with open(corpus, "w", encoding="utf-8") as fh:
        for text in iter_synthetic(n, seed=seed, profile=profile):
            fh.write(text + "\n")
    write_s = time.perf_counter() - t0
    checkpoints = [c for c in (10_000, 100_000, 250_000, 500_000, 1_000_000, 10_000_000) if c <= n] or [n]
    if checkpoints[-1] != n:
        checkpoints.append(n)
    marks: list[dict[str, Any]] = []
    mem = PeakMemory(interval=0.05)
    head = {"kind": "layerscope-scale", "model": model, "engine": engine, "variant": variant, "texts": n,
            "profile": profile, "layers": layers, "pooling": pooling, "store_dtype": dtype,
            "corpus_write_s": round(write_s, 2)}

    def save_partial():  # a run stopped early still leaves its checkpoints on disk
        (out / "scale.json").write_text(json.dumps({**head, "complete": False, "checkpoints": marks}, indent=2)
                                        + "\n", encoding="utf-8")

    class Bar:
        def __init__(self, total_rows, total_tokens):
            self.rows = 0
            self.t0 = time.perf_counter()

        def advance(self, rows, tokens):
            self.rows += rows
            while len(marks) < len(checkpoints) and self.rows >= checkpoints[len(marks)]:
                mem.sample()
                marks.append({"rows": checkpoints[len(marks)], "rows_done": self.rows,
                              "seconds": round(time.perf_counter() - self.t0, 2),
                              "peak_rss_mib": round(mem.peak_rss / 2**20, 1),
                              "peak_anon_rss_mib": None if mem.peak_anon is None else round(mem.peak_anon / 2**20, 1),
                              "current_rss_mib": round(current_rss() / 2**20, 1)})
                save_partial()

        def close(self):
            pass

    options = {k: v for k, v in {"variant": variant, "threads": threads}.items() if v}
    with mem:
        report = extract(model, str(corpus), out / "store", engine=engine, layers=layers, poolings=[pooling],
                         dtype=dtype, batch_tokens=batch_tokens, force=True, progress=Bar,
                         engine_options=options or None)
    result = {
        **head, "complete": True, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "tokens": report.tokens,
        "batch_tokens": report.store.spec.batch_tokens,
        "seconds": round(report.seconds, 2), "texts_per_s": report.n / report.seconds,
        "checkpoints": marks, "peak_rss_mib": round(mem.peak_rss / 2**20, 1),
        "peak_anon_rss_mib": None if mem.peak_anon is None else round(mem.peak_anon / 2**20, 1),
        "machine": describe_machine(),
    }
    (out / "scale.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", default="ort")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--layers", default="all")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    result = scale_run(args.model, args.n, Path(args.out), engine=args.engine, variant=args.variant,
                       layers=args.layers, dtype=args.dtype, threads=args.threads)
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))


if __name__ == "__main__":
    main()
