"""Long texts: texts/s and peak RSS at 4k-32k tokens, pooled and --tokens, each run in its own process.

    python benchmarks/models/build.py qwen3-0.6b /tmp/shapes/qwen3-0.6b
    layerscope export /tmp/shapes/qwen3-0.6b --out /tmp/shapes/qwen3-0.6b-onnx
    python benchmarks/long_texts/run.py /tmp/shapes/qwen3-0.6b-onnx [--lengths 4096,8192,16384,32768]
                                        [--texts 2] [--engine ort] [--modes pooled,tokens] [--out OUT_JSON]
                                        [--attention whole|blocked|sdpa|eager]

For each length and mode, a fresh process extracts ``--texts`` texts of that many tokens (words of the
model's own vocabulary, so the count is exact up to the special tokens) with every layer and mean pooling
(``tokens``: also every token's vector of the last layer, float16), and reports its peak resident set
(``VmHWM`` as it exits), the texts/s of the extraction loop, and the floor engines/memory.py puts on one such
text's activations beside the weights' size (with ``--engine torch``, past 1,024 tokens, attention in slices
is charged nothing; ``ort`` computing attention in blocks of query rows, engines/blocked.py, is charged those
rows' scores: compare with ``--attention whole`` to see what it saves), so the target (peak within 1.5x of the
weights plus one layer's activations, pooled-only) can be read off. A length the memory check refuses is
recorded with its line. Records the CPU model and flags and the load average around each run. Take figures on a
quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, re, sys
from layerscope.errors import LayerscopeError
from layerscope.extraction.pipeline import extract
export, corpus, out, engine, mode, attention = sys.argv[1:7]
try:
    rep = extract(export, corpus, out, engine=engine, layers="all", poolings=["mean"], tokens=mode == "tokens",
                  store_dtype="float16" if mode == "tokens" else "float32",
                  engine_options={"attention": attention} if attention else None)
    res = {"texts_per_s": rep.texts_per_s, "tokens_per_s": rep.tokens_per_s, "tokens": rep.tokens,
           "run_seconds": rep.run_seconds, "engine": rep.engine}
except LayerscopeError as exc:
    res = {"refused": str(exc)}
res["peak_rss_mib"] = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) / 1024
print(json.dumps(res))
"""


def text_of(tokenizer, tokens: int) -> str:
    """A text of about ``tokens`` tokens: words of the tokenizer's vocabulary that are one token each after a
    space, repeated. Words come from decoding single ids, so byte-level vocabularies (``Ġword``) serve as well
    as WordPiece ones."""
    words = []
    for i in range(min(len(tokenizer), 20000)):
        word = tokenizer.decode([i]).strip()
        if word.isalpha() and word.isascii() and len(word) > 2 and len(tokenizer.tokenize(" " + word)) == 1:
            words.append(word)
            if len(words) == 200:
                break
    if not words:
        raise SystemExit("no single-token words found in this tokenizer's vocabulary")
    return " ".join(words[n % len(words)] for n in range(max(tokens - 4, 1)))


def weights_bytes(export: Path) -> int:
    """The exported graph's size: ``model.onnx`` and its external data (``model.onnx_data``, ``*.data``), the
    weights an engine loads; side files such as the lens head are not loaded by an extraction."""
    return sum(f.stat().st_size for f in export.iterdir()
               if f.name.startswith("model.onnx") or f.suffix in (".onnx", ".data"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("--lengths", default="4096,8192,16384,32768")
    ap.add_argument("--texts", type=int, default=2)
    ap.add_argument("--engine", default="ort")
    ap.add_argument("--modes", default="pooled,tokens")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--attention", default="", help="the engine's attention option (default: its own rule)")
    args = ap.parse_args()

    from layerscope.bench.machine import describe_machine
    from layerscope.engines.memory import attention_heads, text_cost
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(args.export)
    m = handle.manifest
    tok = handle.tokenizer()
    weights = weights_bytes(Path(args.export))
    heads = attention_heads(Path(args.export), m.hidden_size)
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        text = text_of(tok, length)
        for mode in args.modes.split(","):
            with tempfile.TemporaryDirectory(prefix="long-texts-") as tmp:
                corpus = Path(tmp) / "c.txt"
                corpus.write_text("\n".join(f"{i} {text}" for i in range(args.texts)) + "\n", encoding="utf-8")
                load = os.getloadavg()[0]
                proc = subprocess.run([sys.executable, "-c", CHILD, args.export, str(corpus), str(Path(tmp) / "s"),
                                       args.engine, mode, args.attention], capture_output=True, text=True)
                res = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
                    {"failed": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
            # an engine that computes attention in slices or blocks says so in its notes (torch past 1,024 tokens:
            # slices; ort on a decoder past 1,024 tokens: blocks of query rows)
            notes = (res.get("engine") or {}).get("notes", [])
            sliced = any("in slices" in n for n in notes)
            block_rows = next((int(found.group(1)) for n in notes
                         for found in [re.search(r"attention in blocks of (\d+) query rows", n)] if found), None)
            floor = text_cost(length, hidden_size=m.hidden_size, heads=heads, depth=m.num_layers,
                              layer_at_a_time=mode == "pooled", attention_scores=not sliced,
                              attention_rows=block_rows)  # pooled runs: torch's hooks, ort/ov's pooled-only graphs
            row = dict(res, length=length, mode=mode, texts=args.texts, weights_mib=round(weights / 2 ** 20, 1),
                       activation_floor_mib=round(floor.bytes / 2 ** 20, 1), sliced_attention=sliced,
                       attention_block_rows=block_rows, attention_option=args.attention or None,
                       one_layer_mib=round(length * m.hidden_size * 4 / 2 ** 20, 1),
                       load_before=load, load_after=os.getloadavg()[0])
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"export": args.export, "engine": args.engine, "machine": describe_machine(), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
