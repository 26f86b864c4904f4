"""Tokenizing alone, as a GPU engine is fed: one thread against a pool of processes sized from the host's cores.

    python benchmarks/tokens/feed.py MODEL_DIR (--sts STS_CSV | --synthetic N [--profile long])
                                     [--max-length 256] [--batch-tokens 16384] [--processes 0,2]
                                     [--passes 3] [--out OUT_JSON]

MODEL_DIR: a model or export dir with ``tokenizer.json`` (the engines' ``tokenizers``-only path,
model/fast_tokenizer.py). One pass is what ``iter_pooled`` does before and around the engine: count every text's
tokens (the plan sorts by them), plan the length-sorted batches under ``--batch-tokens``, and tokenize each batch
into padded arrays. ``--processes``: 0 is one thread in this process (a CPU row); N >= 2 a ``TokenizerPool`` of N
spawned processes (started and warmed before the clock), counting and tokenizing in them as a GPU row does;
``gpu`` is the count ``processes_for_gpu`` gives this host. Best of ``--passes``; texts/s and tokens/s (the
texts' tokens, padding not counted), the load average before and after, the CPU's model and vector flags.
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
from bench_common import print_and_save  # noqa: E402


def encoder_for(model_dir: str, max_length: int | None):
    from transformers import AutoTokenizer

    from layerscope.model.fast_tokenizer import FastTokenizer, special_ids
    from layerscope.model.tokenize import Encoder

    hf = AutoTokenizer.from_pretrained(model_dir)
    fast = FastTokenizer(Path(model_dir) / "tokenizer.json", special_ids(hf))
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if "token_type_ids" in hf.model_input_names else [])
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return Encoder(fast, names, int(max_length or min(config.get("max_position_embeddings") or 512, 512)))


def one_pass(encoder, texts: list[str], batch_tokens: int, pool=None) -> int:
    """Count, plan and tokenize ``texts`` as ``iter_pooled`` does; the texts' tokens."""
    from layerscope.extraction.batching import encode_plan

    lengths = pool.lengths(texts) if pool is not None else encoder.token_lengths(texts)
    tokens = 0
    for batch in encode_plan(encoder, texts, lengths, batch_tokens=batch_tokens, max_batch=256, pool=pool):
        tokens += batch.n_tokens
    return tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--sts")
    ap.add_argument("--synthetic", type=int)
    ap.add_argument("--profile", default="mixed")
    ap.add_argument("--max-length", type=int)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--processes", default="0,gpu")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    from layerscope.bench.machine import describe_machine
    from layerscope.bench.texts import bench_texts
    from layerscope.model.tokenize_pool import TokenizerPool, host_cores, processes_for_gpu

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread in this process; the pool is the parallelism
    texts, corpus = bench_texts(synthetic=a.synthetic, sts_texts=a.sts is not None, sts=a.sts, profile=a.profile)
    encoder = encoder_for(a.model_dir, a.max_length)
    machine = describe_machine()
    record = {"model_dir": a.model_dir, "corpus": corpus, "texts": len(texts), "max_length": encoder.max_length,
              "batch_tokens": a.batch_tokens, "host_cores": host_cores(), "cpu": machine.get("cpu_model"),
              "cpu_flags": machine.get("cpu_flags"), "load_before": os.getloadavg()[0], "runs": {}}
    for spec in a.processes.split(","):
        count = processes_for_gpu(host_cores())[0] if spec == "gpu" else int(spec)
        pool = TokenizerPool(encoder, count) if count >= 2 else None
        try:
            if pool is not None:
                one_pass(encoder, texts[: 4 * count * 64], a.batch_tokens, pool)  # every worker started and warm
            best, tokens = float("inf"), 0
            for _ in range(a.passes):
                t = time.perf_counter()
                tokens = one_pass(encoder, texts, a.batch_tokens, pool)
                best = min(best, time.perf_counter() - t)
        finally:
            if pool is not None:
                pool.close()
        key = f"{count} processes" if count >= 2 else "1 thread"
        record["runs"][key] = {"seconds": round(best, 4), "texts_per_s": round(len(texts) / best, 1),
                               "tokens_per_s": round(tokens / best, 1), "tokens": int(tokens)}
        print(key, record["runs"][key], flush=True)
    record["load_after"] = os.getloadavg()[0]
    print_and_save(record, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
