#!/usr/bin/env bash
# On the GPU machine (no downloads there), one or more stages per device call. A lease is about 15 minutes
# of device time, start included, so the loads travel while the GPU works: every call carries one load and
# runs a stage, and the slow CPU work (exports) runs in the background across calls.
#   receive K   copy load K (carried as .gpu/loads/load-K) to /var/tmp/layerscope-gpu, which outlives the call
#   base        join and install every piece but ONNX Runtime GPU; the MiniLM-shape model (random weights,
#               MiniLM's own config and tokenizer); start the background exports
#   exports     (background, started by base) export the MiniLM shape, bert-base, GPT-2-medium and
#               Qwen2.5-0.5B shapes with their fp16 variants, on CPUs 8-15
#   knn         alignment on 50,000 pairs (GPU and CPU, to compare) and 1,000,000 pairs on the GPU
#   bench-torch layerscope bench, PyTorch rows and sentence-transformers peers: MiniLM shape on the STS sentences
#   ort         join ONNX Runtime GPU, unpack it over the CPU build, list the providers that start
#   tests       pytest -m gpu (every GPU test of the suite; TESTS_K=EXPR runs those pytest -k selects)
#   parity      cuda, cuda-fp16, torch-fp16, torch-bf16 (or PARITY_ENGINES) against torch fp32 on the same GPU, per layer, every shape
#   bench-cuda  layerscope bench with the ONNX Runtime CUDA rows beside torch fp32: MiniLM shape on STS,
#               bert-base on 256 texts of 512 tokens
# Every foreground stage writes its figures, with the machine's description, into $OUT/<stage>.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
W="${LAYERSCOPE_GPU_DIR:-/var/tmp/layerscope-gpu}"
stage="${1:?usage: run.sh receive K | base | exports | knn | bench-torch | ort | tests | parity | bench-cuda}"
out="$W/out/$stage"
rm -rf "$out" && mkdir -p "$out"
# what comes back from a device call is at most 8 files: each stage packs its folder into one archive
pack() { [ -n "${OUT:-}" ] && tar -czf "$OUT/$stage.tgz" -C "$W/out" "$stage"; }
case "$stage" in receive|exports) ;; *) trap pack EXIT ;; esac
export PYTHONPATH="$W/site:$PWD/src" PYTHONUNBUFFERED=1 LAYERSCOPE_HOME="$W/home" PYTHONDONTWRITEBYTECODE=1
py=python3
# the GPU stages' host threads on CPUs 0-7, the background exports on 8-15 (where there are 16)
if [ "$(nproc)" -ge 16 ]; then fg="taskset -c 0-7"; bg="taskset -c 8-15"; else fg=""; bg=""; fi
describe() { { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv;
               uptime; nproc; grep -m1 'model name' /proc/cpuinfo; grep -m1 -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo;
               $py -c 'import torch; print("torch", torch.__version__)';
               [ -f "$W/exports.log" ] && { echo "background exports:"; cat "$W/exports.log"; };
             } > "$out/machine.txt" 2>&1; }
wait_export() {  # wait (at most $2 s) for the background export of shape $1
  local t=0; while [ ! -f "$W/exports/$1.done" ] && [ $t -lt "$2" ]; do sleep 2; t=$((t + 2)); done
  [ -f "$W/exports/$1.done" ] || { echo "export of $1 not done after $2 s" | tee -a "$out/missing.txt"; return 1; }
}
SHAPES="${LAYERSCOPE_GPU_SHAPES:-minilm-l6 qwen2.5-0.5b bert-base gpt2-medium}"
case "$stage" in
  receive)
    $py benchmarks/gpu/pieces.py receive ".gpu/loads/load-${2:?which load}" --into "$W/pieces" ;;
  base)
    describe
    $py benchmarks/gpu/pieces.py join "$W/pieces" --out "$W/wheels" --skip 'onnxruntime-gpu*' || exit 2
    mkdir -p "$W/data" "$W/shapes/minilm-l6" && mv "$W/wheels/sts-test.csv" "$W/data/" 2>/dev/null
    tar -xf "$W/wheels/minilm-config.tar" -C "$W/shapes/minilm-l6" || exit 2
    $py -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$W/site" "$W"/wheels/*.whl \
      2>&1 | tee "$out/pip.txt" || exit 2
    # MiniLM's config, tokenizer and sentence-transformers modules with seeded random weights: its speed
    $py - "$W/shapes/minilm-l6" <<'PY' 2>&1 | tee "$out/minilm-shape.txt"
import sys, torch, transformers
torch.manual_seed(0)
model = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(sys.argv[1]))
model.save_pretrained(sys.argv[1], safe_serialization=True)
print("transformers", transformers.__version__, type(model).__name__, sum(p.numel() for p in model.parameters()))
PY
    setsid nohup bash benchmarks/gpu/run.sh exports > "$W/exports.log" 2>&1 < /dev/null &
    echo "background exports started" ;;
  exports)
    mkdir -p "$W/exports"
    for shape in $SHAPES; do
      src="$W/shapes/$shape"; t0=$(date +%s)
      [ -d "$src" ] || $bg $py benchmarks/models/build.py "$shape" "$src" >/dev/null 2>&1
      $bg $py -m layerscope export "$src" --out "$W/exports/$shape" --no-cpu-precisions 2>&1 | tail -2
      $bg $py -c "import sys; from layerscope.export.variants import make_variant; e = make_variant(sys.argv[1], 'fp16'); print('fp16 variant', {k: e[k] for k in list(e)[:4]})" "$W/exports/$shape" 2>&1 | tail -1
      echo "$shape exported in $(( $(date +%s) - t0 )) s"; touch "$W/exports/$shape.done"
    done ;;
  knn)
    describe
    $fg $py -m layerscope.index.bench --sizes '' --align 50000 --permutations 10 --device gpu --out "$out/gpu-50k" \
      2>&1 | tail -3 | tee "$out/gpu-50k.txt"
    $fg $py -m layerscope.index.bench --sizes '' --align 50000 --permutations 10 --device cpu --out "$out/cpu-50k" \
      2>&1 | tail -3 | tee "$out/cpu-50k.txt"
    timeout 150 $fg $py -m layerscope.index.bench --sizes '' --align 1000000 --permutations 10 --device gpu \
      --out "$out/gpu-1m" 2>&1 | tail -3 | tee "$out/gpu-1m.txt" ;;
  bench-torch)
    describe
    wait_export minilm-l6 120 || exit 3
    timeout 270 $fg $py -m layerscope bench -m "$W/exports/minilm-l6" -e torch,torch-fp16,torch-bf16 \
      --peers st-torch,st-cuda-fp16 --sts "$W/data/sts-test.csv" --sts-texts --rounds 1 --passes 2 \
      --out "$out/minilm-sts" 2>&1 | tee "$out/minilm-sts.txt" ;;
  ort)
    describe
    $py benchmarks/gpu/pieces.py join "$W/pieces" --out "$W/wheels" --only 'onnxruntime-gpu*' || exit 2
    tar -xJf "$W"/wheels/onnxruntime-gpu*.tar.xz -C "$W/site" || exit 2
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
    timeout 200 $fg $py -m pytest -m gpu -q -p no:cacheprovider -rs --junitxml "$out/pytest-gpu.xml" ${TESTS_K:+-k "$TESTS_K"} tests 2>&1 | tee "$out/pytest-gpu.txt" ;;
  parity)
    describe
    for shape in $SHAPES; do
      wait_export "$shape" 60 || continue
      timeout 90 $fg $py benchmarks/gpu/parity.py "$W/exports/$shape" --engines "${PARITY_ENGINES:-cuda,cuda-fp16,torch-fp16,torch-bf16}" \
        --out "$out/parity-$shape.json" 2>&1 | tee "$out/parity-$shape.txt"
    done ;;
  bench-cuda)
    describe
    timeout 200 $fg $py -m layerscope bench -m "$W/exports/minilm-l6" -e torch,cuda,cuda-fp16 \
      --peers none --sts "$W/data/sts-test.csv" --sts-texts --rounds 1 --passes 2 \
      --out "$out/minilm-sts" 2>&1 | tee "$out/minilm-sts.txt"
    wait_export bert-base 30 && timeout 200 $fg $py -m layerscope bench -m "$W/exports/bert-base" \
      -e torch,torch-fp16,cuda,cuda-fp16 --peers none --synthetic 256 --profile long --rounds 1 \
      --passes 2 --out "$out/bert-base-512" 2>&1 | tee "$out/bert-base-512.txt" ;;
  *) echo "unknown stage '$stage'" >&2; exit 2 ;;
esac
