"""Real model shapes end to end: build (random weights), export, extract per engine; one JSON per step.

    python benchmarks/models/run.py qwen2.5-0.5b [--dtype fp32|fp16] [--texts 200] [--engines ort,ort:gqa,torch]
                                                 [--steps build,export,variants,extract] [--variants gqa]

Each step runs in its own process under ``/usr/bin/time -v`` (peak RSS of that process alone):
``build.py`` -> ``inspect export`` -> ``inspect extract`` once per engine, on the first ``--texts``
sentences of the STS Benchmark test set (``$LAYERSCOPE_STS_DIR`` or ../shared/data/stsbenchmark).
Figures go to ``benchmarks/models/results/<shape>-<dtype>.json`` (``--results DIR`` elsewhere; a step run
again replaces its own entry and keeps the others, so an export measured under load can be re-measured
alone); ``--table`` prints the README table from every result file, ``--zoo-table`` the table of the
derived architectures' shapes (build.py ``ZOO_SHAPES``: export time, peak RSS, each layer's parity and its
worst, the files written, tokens/s per engine where extracted). Not part of the test-suite (a 3B shape needs
~12 GiB and hours on 2 cores).

    python benchmarks/models/run.py --zoo [--steps build,export]    # every ZOO_SHAPES shape but mistral-7b
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
from build import ZOO_SHAPES  # noqa: E402

ZOO_RUN = tuple(s for s in ZOO_SHAPES if s != "mistral-7b")  # --zoo: the 7B shape (~30 GB) is run on its own


def _timed(cmd: list[str], log: Path) -> dict:
    t, load_start = time.perf_counter(), open("/proc/loadavg").read().split()[:3]
    with open(log, "w") as f:
        rc = subprocess.call(["/usr/bin/time", "-v", *cmd], stdout=f, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"})
    text = log.read_text(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return {"rc": rc, "seconds": round(time.perf_counter() - t, 1),
            "peak_rss_gib": round(int(rss.group(1)) / 2**20, 2) if rss else None,
            "loadavg_start": load_start, "loadavg": open("/proc/loadavg").read().split()[:3], "cmd": " ".join(cmd),
            "tail": text.strip().splitlines()[-1][:300] if rc else ""}


def _sts_texts(n: int, path: Path) -> Path:
    sts = Path(os.environ.get("LAYERSCOPE_STS_DIR", REPO.parent / "shared" / "data" / "stsbenchmark"))
    texts = []
    with open(sts / "sts-test.csv", encoding="utf-8") as f:
        for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(row) >= 7:
                texts.extend([row[5], row[6]])
            if len(texts) >= n:
                break
    path.write_text("\n".join(texts[:n]) + "\n", encoding="utf-8")
    return path


STEPS = ("build", "export", "variants", "extract")


def run(shape: str, dtype: str, n_texts: int, engines: list[str], work: Path, weights_dtype: str,
        steps: tuple[str, ...] = STEPS, variants: tuple[str, ...] = (), num_layers: int | None = None) -> dict:
    py = sys.executable
    label = f"{shape}-{num_layers}layers" if num_layers else shape  # a shape cut to fewer blocks is its own row
    model_dir, export_dir = work / "models" / label, work / "exports" / f"{label}-{dtype}"
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{label}-{dtype}.json"
    result: dict = json.loads(out.read_text()) if out.exists() else {}
    result.update({"shape": label, "dtype": dtype})
    if "build" in steps and not (model_dir / "config.json").exists():
        result["build"] = _timed([py, str(HERE / "build.py"), shape, str(model_dir), "--dtype", weights_dtype]
                                 + (["--num-layers", str(num_layers)] if num_layers else []),
                                 logs / f"{label}-build.log")
    if "export" in steps:
        result["export"] = _timed([py, "-m", "layerscope", "export", str(model_dir), "--out", str(export_dir),
                                   "--dtype", dtype, "--force"], logs / f"{label}-{dtype}-export.log")
    if "export" in steps and result["export"]["rc"] == 0:
        m = json.loads((export_dir / "manifest.json").read_text())
        outs = m["parity"]["outputs"]
        result["export"].update(_layers_and_files(m))
        result["export"].update({
            "export_seconds": m["export_seconds"], "onnx_gib": round(m["onnx_bytes"] / 2**30, 2),
            "external_data": m["external_data"], "params_layers": m["num_layers"],
            "parity_max_abs": max(v["max_abs"] for v in outs.values()),
            "parity_min_cos": min(v["min_cos"] for v in outs.values()),
            "peak_rss_in_manifest_gib": round(m.get("export_peak_rss_bytes", 0) / 2**30, 2)})
    for kind in variants if "variants" in steps and (export_dir / "manifest.json").exists() else ():
        r = _timed([py, "-m", "layerscope", "optimize", str(export_dir), "--variant", kind, "--force"],
                   logs / f"{label}-{dtype}-variant-{kind}.log")
        if r["rc"] == 0:
            entry = json.loads((export_dir / "manifest.json").read_text())["variants"][kind]
            outs = entry["parity"]["outputs"]
            r.update({"build_seconds": entry["build_seconds"], "details": entry["details"],
                      "fusions": entry["fusions"], "parity_max_abs": max(v["max_abs"] for v in outs.values()),
                      "parity_min_cos": min(v["min_cos"] for v in outs.values())})
        result[f"variant_{kind}"] = r
    if "extract" in steps and (export_dir / "manifest.json").exists():
        result["texts"] = n_texts
        corpus = _sts_texts(n_texts, work / "texts.txt")
        for engine in engines:  # "ort:gqa": the ort engine on the export's gqa variant
            name, _, variant = engine.partition(":")
            store = work / "stores" / f"{label}-{dtype}-{engine.replace(':', '-')}"
            r = _timed([py, "-m", "layerscope", "extract", "--model", str(export_dir), "--input", str(corpus),
                        "--out", str(store), "--engine", name, "--layers", "all", "--force"]
                       + (["--variant", variant] if variant else []),
                       logs / f"{label}-{dtype}-extract-{engine}.log")
            if r["rc"] == 0:
                meta = json.loads((store / "store.json").read_text())
                secs = meta.get("seconds")  # the extract call: engine start, tokenizing, running, writing
                run_secs = meta.get("run_seconds")  # the extraction loop alone: what a long corpus runs at
                r["texts_per_s_with_start"] = round(n_texts / secs, 2) if secs else round(n_texts / r["seconds"], 2)
                if run_secs:
                    r["texts_per_s"] = round(n_texts / run_secs, 2)
                    r["tokens_per_s"] = round(meta["run_tokens"] / run_secs, 1)
                    r["engine_start_s"] = round(secs - run_secs, 1)
                if (store / "lengths.npy").exists():  # tokens per text, as the extraction counted them
                    r["tokens"] = int(np.load(store / "lengths.npy").sum())
            result[f"extract_{engine}"] = r
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _layers_and_files(m: dict) -> dict:
    """Each layer's parity (raw, 0..L: max |ONNX - torch|, its tolerance, min cosine), the worst layer by its
    share of its tolerance, and every file the export wrote (name: bytes) from its manifest."""
    outs = m["parity"]["outputs"]
    names = sorted((n for n in outs if n == "raw_embeddings" or n.startswith("hidden_states.")),
                   key=lambda n: -1 if n == "raw_embeddings" else int(n.rpartition(".")[2]))
    layers = {n: {"max_abs": outs[n]["max_abs"], "tolerance": outs[n].get("tolerance"), "min_cos": outs[n]["min_cos"]}
              for n in names}
    worst = max(layers, key=lambda n: layers[n]["max_abs"] / (layers[n]["tolerance"] or 1e-4))
    files = {name: f["bytes"] for name, f in sorted(m.get("files", {}).items())}
    return {"parity_layers": layers, "worst_layer": worst, "files": files,
            "files_bytes": sum(files.values()), "family": m["family"]}


def zoo_table(results: Path) -> str:
    """The ZOO_SHAPES table: one row per shape with a result file, then each shape's per-layer parity."""
    head = ["| shape | family | export s (manifest) | export peak RSS GiB | worst layer: max abs (tolerance) | "
            "min cos, all outputs | files written | extract tokens/s ort / ov / torch |",
            "|---|---|---|---|---|---|---|---|"]
    detail = []
    paths = [p for shape in ZOO_SHAPES for p in sorted(results.glob(f"{shape}-*.json"))
             if re.fullmatch(re.escape(shape) + r"(-\d+layers)?-fp(32|16)\.json", p.name)]
    for path in paths:
        r = json.loads(path.read_text())
        shape = r["shape"] if r["dtype"] == "fp32" else f"{r['shape']} ({r['dtype']})"
        e = r.get("export", {})
        if e.get("rc") or "parity_layers" not in e:
            head.append(f"| {shape} | | failed or not run: {e.get('tail', '')[:80]} | {e.get('peak_rss_gib')} | | | | |")
            continue
        w = e["parity_layers"][e["worst_layer"]]
        # an fp32 export is held to max |diff| <= its tolerance; a half one to its cosine bar (no tolerance recorded)
        bar = f"{w['tolerance']:.2g}" if w["tolerance"] is not None else f"min cos {w['min_cos']:.7f}"
        files = f"{len(e['files'])} files, {e['files_bytes'] / 2**20:.1f} MiB ({', '.join(e['files'])})"
        tps = " / ".join(str((r.get(f"extract_{k}") or {}).get("tokens_per_s", "-")) for k in ("ort", "ov", "torch"))
        head.append(f"| {shape} | {e['family']} | {e['seconds']} ({e['export_seconds']}) | {e['peak_rss_gib']} | "
                    f"{e['worst_layer']}: {w['max_abs']:.2g} ({bar}) | {e['parity_min_cos']:.7f} | "
                    f"{files} | {tps} |")
        per = ", ".join(f"{n.replace('hidden_states.', '').replace('raw_embeddings', 'raw')}: {v['max_abs']:.1g}"
                        for n, v in e["parity_layers"].items())
        detail.append(f"- {shape}: {per}")
    return "\n".join(head + ["", "Max |ONNX - torch| per layer:", ""] + detail)


def table() -> str:
    rows = ["| shape | dtype | export s | export peak RSS GiB | ONNX GiB | parity max abs / min cos | "
            "extract ort texts/s (engine start) | extract torch texts/s (model load) | 1-min load before export / ort / torch |",
            "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*.json")):
        r = json.loads(path.read_text())
        if "shape" not in r:  # another script's figures (fusion-counts.json)
            continue
        e = r.get("export", {})
        if e.get("rc"):
            rows.append(f"| {r['shape']} | {r['dtype']} | failed: {e.get('tail', '')[:80]} | {e.get('peak_rss_gib')} "
                        "| | | | | |")
            continue
        tps = {k: "{} ({} s start)".format(r[f"extract_{k}"].get("texts_per_s", "-"),
                                           r[f"extract_{k}"].get("engine_start_s", "?"))
               if f"extract_{k}" in r else "-" for k in ("ort", "torch")}
        load = " / ".join((r.get(step) or {}).get("loadavg_start", ["-"])[0] for step in ("export", "extract_ort", "extract_torch"))
        rows.append(f"| {r['shape']} | {r['dtype']} | {e.get('export_seconds')} | {e.get('peak_rss_gib')} | "
                    f"{e.get('onnx_gib')} | {e.get('parity_max_abs', 0):.2g} / {e.get('parity_min_cos', 0):.6f} | "
                    f"{tps['ort']} | {tps['torch']} | {load} |")
    return "\n".join(rows)


def main() -> None:
    global RESULTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="?")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"])
    ap.add_argument("--weights-dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--texts", type=int, default=200)
    ap.add_argument("--engines", default="ort,torch", help="comma list; engine:variant runs a variant, e.g. ort:gqa")
    ap.add_argument("--variants", default="", help="variants the variants step makes (layerscope optimize), e.g. gqa")
    ap.add_argument("--work", type=Path, default=Path("/tmp/layerscope-shapes"))
    ap.add_argument("--steps", default=",".join(STEPS), help="which of build,export,variants,extract to run")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--zoo", action="store_true", help="run every ZOO_SHAPES shape but mistral-7b, one at a time")
    ap.add_argument("--zoo-table", action="store_true", help="print the ZOO_SHAPES table from the result files")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the result files go (default: results/)")
    ap.add_argument("--num-layers", type=int, help="the shape's width with this many blocks (a shape too large "
                    "for the machine); its figures go to <shape>-<N>layers-<dtype>.json")
    args = ap.parse_args()
    RESULTS = args.results
    if args.table:
        print(table())
        return
    if args.zoo_table:
        print(zoo_table(RESULTS))
        return
    steps = tuple(args.steps.split(","))
    if unknown := set(steps) - set(STEPS):
        ap.error(f"unknown step(s) {sorted(unknown)}: choose from {','.join(STEPS)}")
    shapes = ZOO_RUN if args.zoo else (args.shape,)
    if not all(shapes):
        ap.error("name a shape, or --zoo, --table or --zoo-table")
    for shape in shapes:
        print(json.dumps(run(shape, args.dtype, args.texts, args.engines.split(","), args.work, args.weights_dtype,
                             steps, tuple(v for v in args.variants.split(",") if v), args.num_layers), indent=1))


if __name__ == "__main__":
    main()
