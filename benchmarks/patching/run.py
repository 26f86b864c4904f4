"""Activation patching's cost: each layer's suffix once per position batch (resume graphs) against the naive count,
one whole-model run per (pair, layer, position).

    python benchmarks/patching/run.py EXPORT_DIR [--pairs 4] [--tokens 16] [--engines ort,torch] [--naive torch]
                                      [--out OUT_JSON]

EXPORT_DIR: an export (``layerscope export minilm``; a decoder shape: ``python benchmarks/models/build.py gpt2
DIR`` then ``layerscope export DIR --out EXPORT_DIR``). The pairs are made from seeded synthetic texts cut to
``--tokens`` tokens, the corrupted text the clean one with its middle token swapped for another id, so every
tokenizer gives pairs of one length. For every pair, layer and position the script patches the clean state into
the corrupted run and reads the mean-pooled final embedding's cosine with the clean run's
(decoding/patching.py), three ways:

* ``resume`` on each of ``--engines``: the engine's ``resume`` (ort/ov: the resume graphs; torch: a block hook),
  a pair's copies for one layer in one batch (its positions), so each layer's suffix runs once per position
  batch;
* ``naive``: PyTorch with a hook, one whole-model run per (pair, layer, position): the naive count.

Each way's metrics are checked against the naive run's (max |diff| printed) before its time counts. It prints and
records wall and process-CPU seconds (best of ``--passes``; the first resume pass also makes the derived graphs
and is timed apart as ``first_s``), runs and block applications of each way, the 1-minute load before and after
and the CPU's flags. Run it under /work/bin/quiet: figures taken beside other jobs say little.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import timed_passes  # noqa: E402


def make_pairs(engine, n: int, tokens: int):
    """``n`` pairs of ``tokens`` tokens each (a synthetic text's first tokens; the corrupted one with its middle
    token replaced by the next text's token at that place)."""
    from layerscope.data.synthetic import synthetic_texts
    from layerscope.decoding.patching import PairRun

    enc = engine.encoder(max_length=tokens)
    texts = [t for t in synthetic_texts(20 * n, seed=0) if len(t.split()) > 2 * tokens][:n + 1]
    batch = enc(texts)
    runs = []
    for i in range(n):
        clean = enc([texts[i]])
        corrupted = enc([texts[i]])
        mid = tokens // 2
        other = int(batch.input_ids[i + 1, mid])
        corrupted.inputs["input_ids"][0, mid] = other if other != int(clean.input_ids[0, mid]) else other + 1
        ids = clean.input_ids[0].tolist()
        runs.append(PairRun(i, i + 1, clean, corrupted, [str(x) for x in ids], [str(x) for x in ids]))
    return runs


def naive(model_dir: str, manifest, runs, layers: list[int]) -> tuple[np.ndarray, float, float]:
    """One whole-model PyTorch run per (pair, layer, position), the clean state written by a hook: the metric, and
    the wall and CPU seconds of those runs (the model's load not counted)."""
    import torch

    from layerscope.engines.truncate import block_slot
    from layerscope.model.handle import ModelHandle
    from layerscope.model.source import load_torch_model

    handle = ModelHandle.resolve(model_dir)
    net = load_torch_model(handle.source(), handle.family(), attn_implementation="eager").eval()
    parent, attr = block_slot(net, manifest.num_layers, "for the naive runs")
    blocks = getattr(parent, attr)
    num_layers = manifest.num_layers
    out = np.zeros((len(runs), len(layers), runs[0].length))

    def forward(inputs, layer=None, state=None):
        hook = None
        if layer is not None and layer < num_layers:
            def swap(module, args, kwargs):
                return ((state, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": state})

            hook = blocks[layer].register_forward_pre_hook(swap, with_kwargs=True)
        try:
            with torch.inference_mode():
                got = net(**{k: torch.from_numpy(v) for k, v in inputs.items()}, output_hidden_states=True,
                          **({"use_cache": False} if manifest.kind == "decoder" else {}))
        finally:
            if hook is not None:
                hook.remove()
        return got.hidden_states

    c0, w0 = time.process_time(), time.perf_counter()
    for p, run in enumerate(runs):
        clean = forward(run.clean.inputs)
        corrupted = forward(run.corrupted.inputs)
        ref = clean[num_layers][0].double().mean(0)
        for li, layer in enumerate(layers):
            for t in range(run.length):
                if layer < num_layers:
                    state = corrupted[layer].clone()
                    state[0, t] = clean[layer][0, t]
                    final = forward(run.corrupted.inputs, layer, state)[num_layers]
                else:
                    final = corrupted[num_layers].clone()
                    final[0, t] = clean[num_layers][0, t]
                emb = final[0].double().mean(0)
                out[p, li, t] = float(emb @ ref / (emb.norm() * ref.norm()))
    return out, time.perf_counter() - w0, time.process_time() - c0


def resume(export: str, engine_name: str, runs, layers: list[int], passes: int) -> dict:
    from layerscope.decoding.patching import Similarity, columns, patch, run_pairs
    from layerscope.decoding.readout import pooled
    from layerscope.export.open import open_engine

    engine = open_engine(export, engine_name)
    num_layers = engine.manifest.num_layers

    def once():
        run_pairs(engine, runs)
        refs = np.stack([pooled(engine.manifest, r.clean, r.clean_states[num_layers][None], "mean")[0] for r in runs])
        return patch(engine, runs, Similarity(engine.manifest, "mean", refs, ""), layers, columns(runs, "position"),
                     rows=runs[0].length)

    t0 = time.perf_counter()
    first = once()  # makes (or finds) the derived graphs
    first_s = time.perf_counter() - t0
    walls, cpus, got = timed_passes(passes, once)
    engine.close()
    return {"first_s": first_s, "walls": walls, "cpus": cpus, "result": got, "provider": engine.info.provider,
            "first": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--engines", default="ort,torch")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from layerscope.bench.machine import describe_machine
    from layerscope.export.open import open_engine

    machine = describe_machine()
    load0 = os.getloadavg()
    print(f"machine: {machine.get('cpu_model')} | flags {' '.join(machine.get('cpu_flags', []))} | load {load0}",
          flush=True)
    probe = open_engine(args.export, "ort")
    manifest = probe.manifest
    runs = make_pairs(probe, args.pairs, args.tokens)
    probe.close()
    num_layers = manifest.num_layers
    layers = list(range(num_layers + 1))
    cells = len(runs) * len(layers) * runs[0].length
    print(f"{manifest.source.alias or manifest.source.path_or_id}: {num_layers} layers, {len(runs)} pairs of "
          f"{runs[0].length} tokens: {cells} cells", flush=True)
    want, wall, cpu = naive(args.export, manifest, runs, layers)
    naive_row = {"way": "naive", "engine": "torch", "runs": cells + 2 * len(runs),
                 "block_applications": (cells - len(runs) * runs[0].length) * num_layers, "wall_s": wall,
                 "cpu_s": cpu}
    print(f"naive  torch: {naive_row['runs']} whole-model runs, {naive_row['block_applications']:,} block "
          f"applications (a block on one copy), {naive_row['wall_s']:.2f} s wall, {naive_row['cpu_s']:.2f} s CPU",
          flush=True)
    rows = [naive_row]
    for name in args.engines.split(","):
        got = resume(args.export, name, runs, layers, args.passes)
        res = got["result"]
        worst = float(np.max(np.abs(res.patched - want)))
        row = {"way": "resume", "engine": name, "provider": got["provider"],
               "runs": res.suffix_runs + 2 * len(runs), "suffix_runs": res.suffix_runs, "copies": res.suffix_rows,
               "block_applications": res.block_rows, "wall_s": min(got["walls"]), "cpu_s": min(got["cpus"]),
               "first_s": got["first_s"], "max_abs_vs_naive": worst}
        rows.append(row)
        print(f"resume {name:5}: {row['runs']} runs ({res.suffix_runs} suffix runs of {res.suffix_rows} copies, "
              f"{res.block_rows:,} block applications), "
              f"{row['wall_s']:.2f} s wall best of {args.passes}, {row['cpu_s']:.2f} s CPU, first pass "
              f"{row['first_s']:.2f} s; max |diff| vs naive {worst:.2g}", flush=True)
    for row in rows[1:]:
        row["speedup_wall_vs_naive"] = round(naive_row["wall_s"] / row["wall_s"], 2)
        row["speedup_cpu_vs_naive"] = round(naive_row["cpu_s"] / row["cpu_s"], 2)
    load1 = os.getloadavg()
    print(f"load before {load0[0]:.2f}, after {load1[0]:.2f}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine, "model": manifest.source.path_or_id,
                                        "layers": num_layers, "pairs": len(runs), "tokens": runs[0].length,
                                        "cells": cells, "load_before": load0, "load_after": load1, "rows": rows},
                                       indent=2, default=float))


if __name__ == "__main__":
    main()
