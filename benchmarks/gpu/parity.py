"""Per-layer parity of the GPU engines against PyTorch fp32 on the same GPU, for one export.

    python benchmarks/gpu/parity.py EXPORT_DIR [--engines cuda,torch-fp16,cuda:gqa] [--out FILE.json]
    python benchmarks/gpu/parity.py --table FILE.json...    the per-layer table of saved records, in Markdown

Every token-level state (raw embeddings and every hidden state) of the export's own validation texts, in
its own padded batches, compared over real tokens only: max |diff| and min cosine per layer. An engine is a
bench row's name (``cuda-fp16``: cuda on the fp16 variant) or ``ENGINE:VARIANT`` (``cuda:gqa``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def table(records: list[dict]) -> str:
    """One Markdown table per record: a row per layer, min cosine and max |diff| per engine."""
    out = []
    for rec in records:
        engines = list(rec["engines"])
        ok = [e for e in engines if "layers" in rec["engines"][e]]
        out += [f"**{rec['export']}** (reference: {rec['reference']}; min cosine over real tokens / max |diff|)", "",
                "| layer | " + " | ".join(ok) + " |", "|---|" + "---:|" * len(ok)]
        for layer in rec["engines"][ok[0]]["layers"]:
            cells = [rec["engines"][e]["layers"][layer] for e in ok]
            out.append(f"| {layer} | " + " | ".join(f"{c['min_cos']:.7f} / {c['max_abs']:.2g}" for c in cells) + " |")
        out += [f"- {e}: {rec['engines'][e]['error']}" for e in engines if e not in ok] + [""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export_dir", nargs="?")
    ap.add_argument("--table", nargs="+", metavar="FILE.json", help="print the per-layer table of saved records")
    ap.add_argument("--engines", default="cuda,torch-fp16,torch-bf16")
    ap.add_argument("--device", default="cuda", help="where the torch engines run (cpu: to try this script)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    if a.table:
        print(table([json.loads(Path(f).read_text()) for f in a.table]))
        return 0
    if not a.export_dir:
        ap.error("an export dir, or --table FILE.json...")
    from layerscope.bench.engine_rows import bench_engines
    from layerscope.engines.base import create_engine
    from layerscope.engines.torch import half_parity
    from layerscope.export.validate import VALIDATION_TEXTS, validation_batches
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(a.export_dir)
    ref = create_engine("torch", handle, device=a.device)
    layers = ref.layer_names
    batches = [ref.encoder()(texts) for texts in validation_batches(VALIDATION_TEXTS)]
    want = [ref.run_tokens(b, layers) for b in batches]
    ref.close()
    record = {"export": str(a.export_dir), "reference": f"torch fp32 eager on {a.device}", "engines": {}}
    rows = bench_engines()  # bench row names: an engine and a variant (cuda-fp16 is cuda on model.fp16.onnx)
    for name in a.engines.split(","):
        engine, variant = (rows[name].engine, rows[name].variant) if name in rows else \
            (name.split(":", 1) + [None])[:2]
        options = {"device": a.device} if engine.startswith("torch") else {}
        try:
            eng = create_engine(engine, handle, variant=variant, **options) if variant else \
                create_engine(engine, handle, **options)
        except Exception as exc:  # noqa: BLE001 - reported, the other engines still run
            record["engines"][name] = {"error": str(exc).splitlines()[0]}
            print(f"{name}: {str(exc).splitlines()[0]}")
            continue
        got = [eng.run_tokens(b, layers) for b in batches]
        per_layer = half_parity(want, got, [b.mask for b in batches], layers)
        worst = min(per_layer, key=lambda k: per_layer[k]["min_cos"])
        record["engines"][name] = {"provider": eng.info.provider, "layers": per_layer}
        print(f"{name} ({eng.info.provider}): worst layer {worst} min cosine {per_layer[worst]['min_cos']:.7f}, "
              f"max |diff| over layers {max(v['max_abs'] for v in per_layer.values()):.3g}")
        eng.close()
    text = json.dumps(record, indent=1)
    if a.out:
        Path(a.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
