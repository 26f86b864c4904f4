"""Peak RSS of extract --tokens against corpus size: each run in its own process (benchmarks/tokens/README.md).

    python benchmarks/tokens/rss.py EXPORT_DIR STS_CSV N [N ...]

The corpus is the STS test sentences repeated (numbered, so every text is distinct) to N texts; layers
0,3,6, float16 token arrays. Prints one JSON line per N with ru_maxrss of the child.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, time
from layerscope.extraction.pipeline import extract
t = time.perf_counter()
rep = extract(sys.argv[1], sys.argv[2], sys.argv[3], engine="ort", layers="0,3,6", poolings=["mean"], tokens=True,
              store_dtype="float16", window=4096)
print(rep.n, rep.store.meta["token_arrays"]["total_tokens"], round(time.perf_counter() - t, 1))
"""


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import sts_sentences

    export, sts = sys.argv[1], Path(sys.argv[2])
    base = sts_sentences(sts)
    for n in map(int, sys.argv[3:]):
        with tempfile.TemporaryDirectory(prefix="tokens-rss-") as tmp:
            corpus = Path(tmp) / "c.txt"
            corpus.write_text("\n".join(f"{i}: {base[i % len(base)]}" for i in range(n)) + "\n", encoding="utf-8")
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            out = subprocess.run([sys.executable, "-c", CHILD, export, str(corpus), str(Path(tmp) / "s")],
                                 capture_output=True, text=True, check=True).stdout.split()
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            print(json.dumps({"texts": int(out[0]), "tokens": int(out[1]), "seconds": float(out[2]),
                              "peak_rss_mib": round(peak / 1024, 1), "children_peak_before_mib": round(before / 1024, 1),
                              "loadavg": [round(x, 2) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
