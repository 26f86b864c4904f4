"""Early exit: per-text cost against the deepest layer asked, each engine and depth in its own process.

    python benchmarks/early_exit/run.py EXPORT_DIR [--sts STS_CSV | --synthetic N] [--engines torch,ort,ov]
                                        [--depths raw,0,1,3,all] [--passes 3] [--out OUT_JSON]

EXPORT_DIR: an export (layerscope export ...; the shapes of issue 37: python benchmarks/models/build.py
qwen2.5-1.5b DIR, or bert-base, then layerscope export DIR --out EXPORT_DIR). For each engine and each
deepest layer d, a fresh process opens the engine as an extraction with --layers 0..d does (depth=d: a
pruned graph for ort/ov, the first d blocks for torch), warms it up, and times ``passes`` passes over the
texts (mean pooling of every layer up to d). It prints and records per text: best and median wall ms,
process CPU ms (what a loaded machine distorts least), the engine's start (the first start at a depth also
builds and checks its derived graph: see ``start_s`` and ``first_start``), and the 1-minute load average
before and after, with the CPU model and flags. Target (issue 37): time linear in depth; layers 0-3 of 28
at least 4x faster than all layers. Run it on a quiet machine: figures taken beside other jobs say little.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import add_text_options, texts_of, timed_passes  # noqa: E402


def child(args) -> dict:
    """One engine at one depth, in this process."""
    from layerscope.export.open import open_engine
    from layerscope.extraction.pipeline import iter_pooled

    texts = texts_of(args)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    eng = open_engine(args.export, args.engine, **({} if args.depth == "all" else {"depth": int(args.depth)}))
    start_s = time.perf_counter() - t0
    top = eng.manifest.num_layers if args.depth == "all" else int(args.depth)
    layers = (["raw"] if top < 0 else []) + [str(i) for i in range(top + 1)]
    for _ in iter_pooled(eng, texts[:64], layers, ["mean"], background=False):
        pass
    walls, cpus, tokens = timed_passes(
        args.passes, lambda: sum(batch.n_tokens for batch, _, _ in iter_pooled(eng, texts, layers, ["mean"])))
    n = len(texts)
    return {"engine": args.engine, "depth": args.depth, "layers": len(layers), "texts": n, "tokens": tokens,
            "start_s": round(start_s, 3), "notes": eng.info.notes, "provider": eng.info.provider,
            "best_ms_per_text": round(1000 * min(walls) / n, 4),
            "median_ms_per_text": round(1000 * statistics.median(walls) / n, 4),
            "cpu_ms_per_text": round(1000 * min(cpus) / n, 4),
            "load_before": load_before, "load_after": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_text_options(ap, synthetic=2000)
    ap.add_argument("--engines", default="torch,ort,ov")
    ap.add_argument("--depths", default="raw,0,1,3,all", help="comma list of deepest layers: raw, N or all")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--depth", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    from layerscope.bench.machine import describe_machine

    machine = describe_machine()
    print(f"machine: {machine.get('cpu_model')} | flags {' '.join(machine.get('cpu_flags', []))} | "
          f"load {os.getloadavg()}", flush=True)
    rows, seen = [], set()
    for engine in args.engines.split(","):
        for depth in args.depths.split(","):
            depth = "-1" if depth == "raw" else depth
            cmd = [sys.executable, __file__, args.export, "--child", "--engine", engine, "--depth", depth,
                   "--passes", str(args.passes)] + (["--sts", args.sts] if args.sts else []) + \
                  (["--synthetic", str(args.synthetic)] if args.synthetic else [])
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                print(f"{engine} depth {depth}: failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["first_start"] = (engine, depth) not in seen  # a first start at a depth builds its derived graph
            seen.add((engine, depth))
            rows.append(row)
            print(f"{engine:6} deepest {depth:>4} ({row['layers']:>2} layers): {row['best_ms_per_text']:.3f} ms/text "
                  f"best, {row['median_ms_per_text']:.3f} median, {row['cpu_ms_per_text']:.3f} CPU ms; start "
                  f"{row['start_s']:.2f} s; load {row['load_before']:.2f} -> {row['load_after']:.2f}", flush=True)
    for engine in {r["engine"] for r in rows}:
        full = next((r for r in rows if r["engine"] == engine and r["depth"] == "all"), None)
        for r in (r for r in rows if r["engine"] == engine and full):
            r["speedup_vs_all"] = round(full["best_ms_per_text"] / r["best_ms_per_text"], 3)
    if args.out:
        args.out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
