"""Where a graph's memory goes on short texts: one ONNX Runtime session per fresh process, RSS only.

    python benchmarks/long_texts/short_text_rss.py EXPORT GRAPH [GRAPH ...] [--texts 200] [--arena on,off]
        [--corpus ../shared/data/stsbenchmark/sts-test.csv] [--out OUT_JSON]

Each GRAPH (a file name inside EXPORT, e.g. ``model.upto-28.pooled.onnx`` and its
``model.upto-28.pooled.blocked.onnx``) is opened in a fresh process as the ``ort`` engine opens it (CPU provider,
physical cores, every graph optimization, no spinning; ``--arena off`` also tries ONNX Runtime's CPU memory arena
off), and the first ``--texts`` sentences of the STS test split are run through it in batches of about 2,048
padded tokens, shortest first, fetching the graph's first pooled output. Each process reports, from
``/proc/self/status``: the resident set after the session is made (``load_*``, split into anonymous memory and
file pages mapped, ``RssAnon``/``RssFile``) and after the run (``run_*``), and its peak (``VmHWM``). Nothing is
written beside the export. RSS figures hold on a loaded machine; take no time from it.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
import numpy as np
export, graph, arena, corpus, n = sys.argv[1], sys.argv[2], sys.argv[3] == "on", sys.argv[4], int(sys.argv[5])

def status():
    got = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            got[key] = int(value.split()[0]) // 1024
    return got

from pathlib import Path
from layerscope.engines.ort_session import _session_options, make_session, ort_module, physical_cores
from layerscope.model.handle import ModelHandle
from layerscope.model.tokenize import Encoder

handle = ModelHandle.resolve(export)
encoder = Encoder(handle.encoding_tokenizer(), list(handle.manifest.inputs), int(handle.manifest.max_length), "")
texts = json.loads(open(corpus).read())[:n]
ort = ort_module()
so = _session_options(ort, physical_cores(), "all", {"session.intra_op.allow_spinning": "0",
                                                     "session.inter_op.allow_spinning": "0"})
so.enable_cpu_mem_arena = arena
before = status()
session = make_session(Path(export) / graph, "CPUExecutionProvider", options=so)
load = status()
inputs = {i.name: i.type for i in session.get_inputs()}
name = session.get_outputs()[0].name
lengths = encoder.token_lengths(texts)
order = np.argsort(lengths, kind="stable")
batches, cur = [], []
for i in order:
    if cur and (len(cur) + 1) * int(lengths[i]) > 2048:
        batches.append(cur)
        cur = []
    cur.append(int(i))
batches.append(cur)
for rows in batches:
    feed = encoder([texts[i] for i in rows]).inputs
    session.run([name], {k: (v.astype(np.int32) if inputs[k] == "tensor(int32)" else v) for k, v in feed.items()
                         if k in inputs})
run = status()
print(json.dumps({"graph": graph, "arena": arena, "batches": len(batches), "before": before, "load": load,
                  "run": run}))
"""


def sts_texts(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r[5] for r in rows[:n]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--texts", type=int, default=200)
    ap.add_argument("--arena", default="on")
    ap.add_argument("--corpus", type=Path, default=ROOT.parent / "shared/data/stsbenchmark/sts-test.csv")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "texts.json"
        corpus.write_text(json.dumps(sts_texts(args.corpus, args.texts)))
        for arena in args.arena.split(","):
            for graph in args.graphs:
                out = subprocess.run([sys.executable, "-c", CHILD, args.export, graph, arena, str(corpus),
                                      str(args.texts)], capture_output=True, text=True, check=False)
                if out.returncode:
                    raise SystemExit(f"{graph} (arena {arena}) failed:\n{out.stderr[-2000:]}")
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
