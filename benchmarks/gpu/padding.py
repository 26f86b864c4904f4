"""How much of a batch is padding: the tokens an engine runs against the texts' own, and the FLOPs of both.

    python benchmarks/gpu/padding.py MODEL_DIR (--sts STS_CSV | --synthetic N [--profile long])
                                     [--max-length 512] [--batch-tokens 16384] [--max-batch 256]
                                     [--hf-batch 64] [--out FILE.json]

MODEL_DIR: a model or export dir with its tokenizer and config.json. Tokenizes the texts (nothing runs a model)
and plans their batches three ways: layerscope's (length-sorted, at most ``--batch-tokens`` padded tokens and
``--max-batch`` texts a batch: what every layerscope engine runs), the plain Hugging Face loop's (corpus order,
``--hf-batch`` texts a batch: the bench's hf-eager row), and one text a batch (no padding: what packed,
unpadded attention would run). For each: padded tokens, padding's share, and the FLOPs of matmuls and attention
over the padded batches against the texts' own (bench/peak.py ``corpus_flops``). Standard output and --out:
one JSON record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import print_and_save  # noqa: E402


def plans(lengths: np.ndarray, *, batch_tokens: int, max_batch: int, hf_batch: int) -> dict[str, list[np.ndarray]]:
    """Batches of row indices: layerscope's plan, corpus order in ``hf_batch``, one text each."""
    from layerscope.extraction.batching import plan_batches

    n = len(lengths)
    return {"layerscope (sorted, token budget)": plan_batches(lengths, batch_tokens=batch_tokens, max_batch=max_batch),
            f"corpus order, {hf_batch} a batch (hf-eager)": [np.arange(i, min(n, i + hf_batch))
                                                             for i in range(0, n, hf_batch)],
            "one text a batch (unpadded)": [np.array([i]) for i in range(n)]}


def padding(lengths: np.ndarray, batches: list[np.ndarray], shapes: dict[str, int] | None) -> dict[str, float]:
    """Real and padded tokens (and FLOPs, with the model's ``shapes``) of ``batches`` over texts of ``lengths``."""
    from layerscope.bench.peak import corpus_flops

    widths = np.concatenate([np.full(len(b), lengths[b].max()) for b in batches])
    real, padded = int(lengths.sum()), int(widths.sum())
    out = {"batches": len(batches), "tokens": real, "padded_tokens": padded, "padding_share": 1 - real / padded}
    if shapes:
        useful, run = corpus_flops(shapes, lengths), corpus_flops(shapes, widths)
        out.update(gflop=useful / 1e9, padded_gflop=run / 1e9, padded_flops_share=1 - useful / run)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export")
    ap.add_argument("--sts", help="STS Benchmark csv: both sentences of each pair, as bench --sts-texts reads them")
    ap.add_argument("--synthetic", type=int, help="N seeded synthetic texts instead (bench --synthetic)")
    ap.add_argument("--profile", default="mixed", help="their length profile: mixed, short, long")
    ap.add_argument("--max-length", type=int, default=None, help="default: the model's own (config.json)")
    ap.add_argument("--batch-tokens", type=int, default=16384, help="the GPU engines' own budget")
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from layerscope.bench.peak import model_shapes
    from layerscope.bench.texts import bench_texts

    texts, corpus = bench_texts(synthetic=a.synthetic, sts_texts=a.sts is not None, sts=a.sts, profile=a.profile)
    config = json.loads((Path(a.export) / "config.json").read_text())
    max_length = int(a.max_length or config.get("max_position_embeddings") or 512)
    tok = AutoTokenizer.from_pretrained(a.export)
    ids = tok(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
    lengths = np.fromiter((max(len(x), 1) for x in ids), dtype=np.int64, count=len(texts))
    shapes = model_shapes(a.export)
    record = {"model": str(a.export), "corpus": corpus, "texts": len(texts), "max_length": max_length, "shapes": shapes,
              "mean_tokens": float(lengths.mean()), "texts_at_max_length": int((lengths >= max_length).sum()),
              "batch_tokens": a.batch_tokens, "max_batch": a.max_batch,
              "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
              "plans": {name: padding(lengths, b, shapes) for name, b in
                        plans(lengths, batch_tokens=a.batch_tokens, max_batch=a.max_batch, hf_batch=a.hf_batch).items()}}
    if shapes:
        record["gflop_per_text"] = record["plans"]["one text a batch (unpadded)"]["gflop"] / len(texts)
    print_and_save(record, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
