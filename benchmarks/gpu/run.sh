#!/usr/bin/env bash
# On the GPU machine (no downloads there), one stage per device call, each well inside 10 minutes:
#   receive K   copy load K (carried as .gpu/loads/load-K) to /var/tmp/layerscope-gpu, which outlives the call
#   setup       join and check the wheels, install them into a target dir, list ONNX Runtime's providers
#   tests       pytest -m gpu (every GPU test of the suite)
#   bench       layerscope bench on the GPU: MiniLM on the STS sentences, then bert-base at 512 tokens
#   shapes      cuda vs torch parity per layer on random-weight real shapes (bert-base, GPT-2-medium, Qwen2.5-0.5B)
#   knn         alignment on 50,000 pairs (GPU and CPU, to compare) and 1,000,000 pairs on the GPU
# Every stage writes its figures, with the machine's description, into $OUT/<stage>.tgz (what comes back).
set -uo pipefail
cd "$(dirname "$0")/../.."
W=/var/tmp/layerscope-gpu
stage="${1:?usage: run.sh receive K | setup | tests | bench | shapes | knn}"
out="$W/out/$stage"
rm -rf "$out" && mkdir -p "$out"
# what comes back from a device call is at most 8 files: each stage packs its folder into one archive
pack() { [ -n "${OUT:-}" ] && tar -czf "$OUT/$stage.tgz" -C "$W/out" "$stage"; }
[ "$stage" = receive ] || trap pack EXIT
export PYTHONPATH="$W/site:$PWD/src" PYTHONUNBUFFERED=1 LAYERSCOPE_HOME="$W/home" PYTHONDONTWRITEBYTECODE=1
py=python3
describe() { { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv;
               uptime; nproc; grep -m1 'model name' /proc/cpuinfo; $py -c 'import torch; print("torch", torch.__version__)';
             } > "$out/machine.txt" 2>&1; }
case "$stage" in
  receive)
    $py benchmarks/gpu/pieces.py receive ".gpu/loads/load-${2:?which load}" --into "$W/pieces" ;;
  setup)
    describe
    $py benchmarks/gpu/pieces.py join "$W/pieces" --out "$W/wheels" || exit 2
    mkdir -p "$W/data" && { mv "$W/wheels/sts-test.csv" "$W/data/" 2>/dev/null || true; }
    $py -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$W/site" "$W"/wheels/*.whl \
      2>&1 | tee "$out/pip.txt" || exit 2
    $py - <<'PY' 2>&1 | tee "$out/providers.txt"
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.__file__)
if hasattr(ort, "preload_dlls"):
    ort.preload_dlls()
print("providers", ort.get_available_providers())
PY
    $py -m layerscope engines 2>&1 | tee "$out/engines.txt" ;;
  tests)
    describe
    timeout 560 $py -m pytest -m gpu -q -p no:cacheprovider -rs tests 2>&1 | tee "$out/pytest-gpu.txt" ;;
  bench)
    describe
    $py -m layerscope export minilm --out "$W/exports/minilm" 2>&1 | tail -3 | tee "$out/export.txt"
    timeout 270 $py -m layerscope bench -m "$W/exports/minilm" -e torch,torch-fp16,torch-bf16,cuda,cuda-fp16 \
      --peers st-torch,st-cuda-fp16 --sts "$W/data/sts-test.csv" --sts-texts --rounds 2 --passes 3 \
      --out "$out/minilm-sts" 2>&1 | tee "$out/minilm-sts.txt"
    $py benchmarks/models/build.py bert-base "$W/shapes/bert-base" >/dev/null 2>&1
    $py -m layerscope export "$W/shapes/bert-base" --out "$W/exports/bert-base" 2>&1 | tail -2 | tee "$out/export-bert.txt"
    timeout 240 $py -m layerscope bench -m "$W/exports/bert-base" -e torch,torch-fp16,torch-bf16,cuda,cuda-fp16 \
      --peers none --synthetic 2048 --profile long --rounds 1 --passes 3 \
      --out "$out/bert-base-512" 2>&1 | tee "$out/bert-base-512.txt" ;;
  shapes)
    describe
    for shape in bert-base gpt2-medium qwen2.5-0.5b; do
      [ -d "$W/shapes/$shape" ] || $py benchmarks/models/build.py "$shape" "$W/shapes/$shape" >/dev/null 2>&1
      [ -d "$W/exports/$shape" ] || timeout 170 $py -m layerscope export "$W/shapes/$shape" --out "$W/exports/$shape" \
        2>&1 | tail -2 | tee "$out/export-$shape.txt"
      timeout 120 $py benchmarks/gpu/parity.py "$W/exports/$shape" --out "$out/parity-$shape.json" 2>&1 | tee "$out/parity-$shape.txt"
    done ;;
  knn)
    describe
    $py -m layerscope.index.bench --sizes '' --align 50000 --permutations 10 --device gpu --out "$out/gpu-50k" \
      2>&1 | tail -2 | tee "$out/gpu-50k.txt"
    $py -m layerscope.index.bench --sizes '' --align 50000 --permutations 10 --device cpu --out "$out/cpu-50k" \
      2>&1 | tail -2 | tee "$out/cpu-50k.txt"
    timeout 300 $py -m layerscope.index.bench --sizes '' --align 1000000 --permutations 10 --device gpu \
      --out "$out/gpu-1m" 2>&1 | tail -2 | tee "$out/gpu-1m.txt" ;;
  *) echo "unknown stage '$stage'" >&2; exit 2 ;;
esac
