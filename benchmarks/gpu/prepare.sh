#!/usr/bin/env bash
# On a machine with the package index: fetch what the GPU machine lacks (wheels.txt) for its Python 3.12,
# add the STS test sentences, and cut everything into loads of at most 56 MiB under .gpu/loads/
# (git-ignored), one load per device call.
#   bash benchmarks/gpu/prepare.sh            then, per load K:  carry .gpu/loads/load-K
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-python3}"
rm -rf .gpu/wheels && mkdir -p .gpu/wheels
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .gpu/wheels -r benchmarks/gpu/wheels.txt
sts="${LAYERSCOPE_STS_DIR:-../shared/data/stsbenchmark}/sts-test.csv"
extra=()
[ -f "$sts" ] && extra+=("$sts")
"$py" benchmarks/gpu/pieces.py split .gpu/wheels/*.whl "${extra[@]}" --out .gpu/loads
ls -1 .gpu/loads | grep '^load-' | sed 's/^/  carry .gpu\/loads\//'
