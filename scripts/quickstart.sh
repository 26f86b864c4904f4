#!/usr/bin/env bash
# Install layerscope, export the bundled all-MiniLM-L6-v2 to ONNX (checked against PyTorch) into the cache,
# extract every layer's mean and CLS vectors of the STS Benchmark test sentences, print a summary.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$here/scripts/setup_env.sh")"
bin="$(dirname "$py")"
work="$here/.quickstart"
mkdir -p "$work"
sts="${LAYERSCOPE_STS_DIR:-$here/../shared/data/stsbenchmark}/sts-test.csv"
if [ -f "$sts" ]; then
  # the two sentence columns of the original tab-separated file, one sentence per line
  "$py" - "$sts" "$work/corpus.txt" <<'PY'
import sys
with open(sys.argv[1], encoding="utf-8", newline="") as src, open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in src:
        cols = line.rstrip("\r\n").split("\t")
        out.write(cols[5] + "\n" + cols[6] + "\n")
PY
else
  echo "STS Benchmark not found at $sts; using the bundled example sentences" >&2
  "$py" -c "from layerscope.data import example_sentences as e; print('\n'.join(e()))" > "$work/corpus.txt"
fi
"$bin/layerscope" engines
# into layerscope's cache, where the next `layerscope run ... --model minilm` finds it (made again only when
# the model's files or the library versions change)
"$bin/layerscope" export minilm --cache
"$bin/layerscope" extract --model minilm --engine auto --input "$work/corpus.txt" \
  --out "$work/stores/sts-test" --layers all --pooling mean,cls --force
