"""``layerscope run`` pays for the layers it asks: the first layers against every layer, and the cache growing by layer.

    python benchmarks/early_exit/run_layers.py EXPORT_DIR --data PAIRS --engines ort,ov --few 0,1,2 \
        [--analysis sts] [--rounds 1] [--work DIR] [--out OUT_JSON]

Each ``layerscope run`` is its own process under ``/usr/bin/time -v`` (wall seconds and peak RSS of the whole
command: Python start, engine start, tokenizing, extraction, the analysis, the report), with a layerscope home of
its own so the vector cache starts empty. Per engine and round:

- ``few``: ``run ANALYSIS --layers FEW`` in a fresh home;
- ``all``: ``run ANALYSIS --layers all`` in another fresh home;
- ``grow``: ``run ANALYSIS --layers all`` in the home ``few`` left (its cache holds FEW's layers): what it
  extracts is read from the stores it adds.

Before the timed runs, one untimed run per engine and depth (on ``--warm-data``) makes the derived graphs the engine runs (early
exit's ``model.upto-<d>[.pooled].onnx``, kept beside the export), so a timed run finds them as a user's second run
does; that first-use time is recorded apart (``first_use``). Figures of the layers the runs share are compared
(Spearman and Pearson of each layer and pooling). Recorded beside every run: the 1-minute load average at its
start and end, and the machine's CPU model and vector flags. Run it under /work/bin/quiet (nothing else heavy).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYERSCOPE = str(Path(sys.executable).with_name("layerscope"))


def run_once(args, engine: str, layers: str, home: Path, out: Path, data: str | None = None) -> dict:
    """One ``layerscope run`` in its own process; what it took and what it extracted."""
    before = {p.name for p in (home / "stores").iterdir()} if (home / "stores").exists() else set()
    cmd = ["/usr/bin/time", "-v", LAYERSCOPE, "run", args.analysis, "--model", args.export, "--engine", engine,
           "--layers", layers, "--data", data or args.data, "--out", str(out), "--recompute", *args.extra]
    env = {**os.environ, "LAYERSCOPE_HOME": str(home)}
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    results = json.loads((out / "results.json").read_text())
    (meta,) = results["models"].values()
    added = []
    for path in sorted((home / "stores").iterdir()):
        if path.name in before:
            continue
        doc = json.loads((path / "store.json").read_text())
        added.append({"store": path.name, "layers": doc["settings"]["layers"], "poolings": doc["settings"]["poolings"],
                      "extract_run_s": doc.get("run_seconds"), "extract_s": doc.get("seconds"),
                      "rows": doc["n"], "tokens": doc.get("run_tokens")})
    (per_model,) = results["per_model"].values()
    figures = {f"{r['pooling']}@{r['layer']}": {k: r.get(k) for k in ("spearman", "pearson")}
               for r in per_model["tables"]["layers"]}
    return {"engine": engine, "layers": layers, "wall_s": round(wall, 2), "results_s": results.get("seconds"),
            "peak_rss_mib": round(int(rss.group(1)) / 1024) if rss else None,
            "load_start": load0, "load_end": load1, "engine_notes": meta["engine"]["notes"],
            "stores_added": added, "figures": figures,
            "said": [line for line in proc.stdout.splitlines() if "extracting" in line or "reusing" in line]}


def compare(a: dict, b: dict) -> dict:
    """The largest difference of each figure over the (pooling, layer) pairs both runs hold."""
    shared = sorted(set(a["figures"]) & set(b["figures"]))

    def diff(x, y) -> float:  # a figure a layer cannot have (a constant vector: no correlation) is None in both
        return 0.0 if x is None and y is None else float("inf") if x is None or y is None else abs(x - y)

    worst = {k: max((diff(a["figures"][s][k], b["figures"][s][k]) for s in shared), default=None)
             for k in ("spearman", "pearson")}
    return {"shared": shared, "max_abs_diff": worst,
            "identical": all(a["figures"][s] == b["figures"][s] for s in shared)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("--data", required=True)
    ap.add_argument("--analysis", default="sts")
    ap.add_argument("--engines", default="ort,ov")
    ap.add_argument("--few", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warm-data", default=None, help="pairs for the untimed first runs that make the derived "
                    "graphs (default: --data); a few pairs suffice, the graphs do not depend on the data")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more options for every run")
    args = ap.parse_args()
    from layerscope.bench.machine import describe_machine

    machine = describe_machine()
    work = args.work or Path(tempfile.mkdtemp(prefix="layerscope-run-layers-"))
    work.mkdir(parents=True, exist_ok=True)
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    say(f"machine: {machine.get('cpu_model')}, {machine.get('physical_cores')} cores | flags "
        f"{' '.join(machine.get('cpu_flags', []))} | load {os.getloadavg()}")
    doc = {"command": " ".join([sys.executable, *sys.argv]), "machine": machine, "export": args.export,
           "data": args.data, "warm_data": args.warm_data, "analysis": args.analysis, "few": args.few, "first_use": [], "rounds": []}
    for engine in args.engines.split(","):
        for layers in (args.few, "all"):  # the derived graphs made once, as a user's first run makes them
            n = len(doc["first_use"])
            row = run_once(args, engine, layers, work / f"first-{engine}-{n}", work / f"out-first-{engine}-{n}",
                           data=args.warm_data)
            doc["first_use"].append(row)
            say(f"first use {engine} --layers {layers}: {row['wall_s']} s (load {row['load_start']:.2f})")
    for r in range(args.rounds):
        for engine in args.engines.split(","):
            order = ["few", "all"] if r % 2 == 0 else ["all", "few"]
            got = {}
            for kind in order:
                home = work / f"home-{engine}-{r}-{kind}"
                got[kind] = run_once(args, engine, args.few if kind == "few" else "all", home,
                                     work / f"out-{engine}-{r}-{kind}")
                say(f"round {r} {engine} {kind}: {got[kind]['wall_s']} s (load {got[kind]['load_start']:.2f})")
            got["grow"] = run_once(args, engine, "all", work / f"home-{engine}-{r}-few", work / f"out-{engine}-{r}-grow")
            say(f"round {r} {engine} grow: {got['grow']['wall_s']} s (load {got['grow']['load_start']:.2f}); "
                f"added {[s['layers'] for s in got['grow']['stores_added']]}")
            doc["rounds"].append({
                "round": r, "engine": engine, **got,
                "all_over_few": round(got["all"]["wall_s"] / got["few"]["wall_s"], 2),
                "grow_over_all": round(got["grow"]["wall_s"] / got["all"]["wall_s"], 2),
                "few_vs_all": compare(got["few"], got["all"]), "grow_vs_all": compare(got["grow"], got["all"]),
                "grow_vs_few": compare(got["grow"], got["few"])})
            last = doc["rounds"][-1]
            say(f"  all/few {last['all_over_few']}x; grow/all {last['grow_over_all']}; shared figures identical: "
                f"few-all {last['few_vs_all']['identical']}, grow-few {last['grow_vs_few']['identical']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
        say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
