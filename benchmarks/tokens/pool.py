"""Tokenizing alone against the engine: tokens/s at 1, 2 and 4 tokenizer processes, and the engine's own.

    python benchmarks/tokens/pool.py EXPORT_DIR [--sts STS_CSV | --synthetic N] [--engine ort]
                                     [--counts 1,2,4] [--passes 3] [--record] [--out OUT_JSON]

The texts are cut into the extraction's length-sorted token-budget batches (the engine's own budget). Then:
tokenizing them alone, in this process (what the background thread does) and in a pool of 2 and 4 spawned
processes (started and warmed before the clock); and the engine alone on the batches tokenized beforehand
(every layer, mean pooling, as an extraction of every layer runs). Best of ``passes`` each. ``--record``
writes the figures to ``<LAYERSCOPE_HOME>/tokenizer-pool.json`` for this CPU, model and engine: from then on
an extraction on this machine starts the fewest processes recorded to keep up with the engine, where one
tokenizer does not (model/tokenize_pool.py). Records the CPU model and flags and the load average before and
after. Run it on a quiet machine: figures taken beside other jobs say little.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import add_text_options, texts_of, timed_passes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_text_options(ap, synthetic=5000)
    ap.add_argument("--engine", default="ort")
    ap.add_argument("--counts", default="1,2,4", help="tokenizer processes to time")
    ap.add_argument("--record", action="store_true", help="record the figures for this CPU (switches the pool on "
                                                          "where one tokenizer is measured slower than the engine)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from layerscope.engines.speed_order import cpu_identity
    from layerscope.export.open import open_engine
    from layerscope.model.tokenize_pool import measure, record
    from layerscope.extraction.batching import plan_batches

    texts = texts_of(args)
    load_before = os.getloadavg()[0]
    eng = open_engine(args.export, args.engine)
    enc = eng.encoder()
    lengths = enc.token_lengths(texts)
    plan = plan_batches(lengths, batch_tokens=eng.preferred_batch_tokens, max_length=enc.max_length)
    jobs = [([texts[i] for i in rows], rows, lengths[rows]) for rows in plan]
    counts = [int(c) for c in args.counts.split(",")]
    tokenize = {c: max(measure(enc, jobs, counts=(c,))[c] for _ in range(args.passes)) for c in counts}
    batches = [enc(t, index=i, lengths=n) for t, i, n in jobs]
    layers, tokens = eng.layer_names, sum(b.n_tokens for b in batches)
    for b in batches[:4]:  # warm-up
        eng.run(b, layers, ["mean"])
    walls, _, _ = timed_passes(args.passes, lambda: sum(1 for _ in eng.run_stream(batches, layers, ["mean"])))
    engine_rate = tokens / min(walls)
    key, cpu = cpu_identity()
    result = {"export": args.export, "engine": args.engine, "engine_notes": eng.info.notes, "texts": len(texts),
              "tokens": int(tokens), "batches": len(batches), "engine_tokens_per_s": round(engine_rate, 1),
              "tokenize_tokens_per_s": {str(c): round(v, 1) for c, v in tokenize.items()}, "cpu": cpu,
              "load_before": load_before, "load_after": os.getloadavg()[0]}
    if args.record:
        result["recorded"] = str(record(eng.manifest.source.weights_sha256, args.engine, engine_rate, tokenize,
                                        cpu=key))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
