"""Ray extraction with 1 and 2 workers against the plain single-process extract, on one machine.

    PYTHONPATH=src python benchmarks/ray_scaling.py --model EXPORT_DIR --input CORPUS --out DIR [--workers 1,2]

Each configuration runs in its own fresh process state (the Ray run starts and stops its own local
cluster), writes its store under DIR, and the script prints one markdown table plus where the
workers' time went (read, tokenize, engine, shard write) and the driver's merge time, from the
store's own ``store.json``. Every figure is measured; the load average is recorded next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def loadavg() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--layers", default="all")
    ap.add_argument("--pooling", default="mean")
    args = ap.parse_args()

    import numpy as np

    from layerscope.extraction.pipeline import extract
    from layerscope.extraction.ray_extract import extract_ray

    out = Path(args.out)
    rows = []
    before = loadavg()
    t = time.perf_counter()
    rep = extract(args.model, args.input, out / "plain", engine="ort", layers=args.layers,
                  poolings=args.pooling.split(","), force=True)
    rows.append({"run": "plain extract", "seconds": time.perf_counter() - t, "run_s": rep.run_seconds,
                 "n": rep.n, "load": f"{before} -> {loadavg()}", "ray": None})
    plain = rep.store
    for w in (int(x) for x in args.workers.split(",")):
        before = loadavg()
        t = time.perf_counter()
        rep = extract_ray(args.model, args.input, out / f"ray{w}", address="local", workers=w, engine="ort",
                          layers=args.layers, poolings=args.pooling.split(","), force=True)
        seconds = time.perf_counter() - t
        worst = max(float(np.abs(np.asarray(plain[p, layer], np.float64) - rep.store[p, layer]).max())
                    for p in plain.poolings for layer in plain.layers)
        assert rep.store.ids() == plain.ids(), "ids differ from the plain run"
        rows.append({"run": f"--ray local --ray-workers {w}", "seconds": seconds, "run_s": rep.run_seconds,
                     "n": rep.n, "load": f"{before} -> {loadavg()}", "ray": rep.store.meta["ray"],
                     "max_abs_vs_plain": worst})
    print(f"cores: {os.cpu_count()}; corpus: {args.input} ({rows[0]['n']:,} texts); layers {args.layers}, "
          f"pooling {args.pooling}\n")
    print("| run | wall s | cluster start s | extract s (after start) | texts/s (extract) | read s | tokenize s "
          "| engine s | shard write s | driver merge s | max abs vs plain | load 1/5/15 before -> after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        s = (r["ray"] or {}).get("seconds", {})
        cell = lambda k: f"{s[k]:.2f}" if k in s else "-"  # noqa: E731
        print(f"| {r['run']} | {r['seconds']:.1f} | {cell('start_s')} | {r['run_s']:.1f} | "
              f"{r['n'] / r['run_s']:,.0f} | {cell('read_s')} | {cell('tokenize_s')} | {cell('engine_s')} | "
              f"{cell('write_s')} | {cell('merge_s')} | "
              f"{r.get('max_abs_vs_plain', 0.0):.1e} | {r['load']} |")
    (out / "ray_scaling.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
