#!/usr/bin/env bash
# The GPU run, on the lent machine (no downloads there): three device calls back to back, each one command,
#   bash benchmarks/gpu/run.sh call1 | call2 | call3      (the plan, its timings and the run(...) calls: README.md)
# Each call runs its stages in order, the cheapest and most important first. Every stage runs under `timeout`,
# cut to what is left of the call's budget (CALL_BUDGET seconds: the timeout_s the call was given, less a
# margin), and a stage that cannot get its least time is skipped and says so. As each stage ends, killed or
# not, its folder goes to $OUT/<stage>.tgz, and its headline lines are appended to $OUT/figures.txt: what a
# call measured comes back even when a later stage or the call itself is cut short. (At most 8 files come
# back from a call: at most 4 stages a call, each one archive, plus figures.txt and calls.txt.)
#   call1  receive load 1; base: install the wheels, the MiniLM shape, the background exports
#          (minilm-l6, bert-base, qwen2.5-0.5b with fp16, and gqa for Qwen, on the CPUs the GPU stages leave);
#          knn: 50,000 pairs on the GPU, held equal to the CPU's figures (knn-cpu-50k.json), then 1,000,000;
#          minilm-torch: bench, MiniLM shape on the STS sentences, torch fp32 eager and torch-fp16
#   call2  receive load 2; ort: ONNX Runtime GPU joined and unpacked over the machine's CPU build;
#          minilm: bench, the same corpus, torch, torch-fp16, cuda, cuda-fp16 (the table of record);
#          bert: bench, bert-base shape at 512 tokens, torch-fp16 and cuda-fp16 over BERT_TEXTS texts
#   call3  extras: Qwen2.5-0.5B parity on CUDA (torch-fp16, cuda, cuda-fp16, cuda with the gqa variant),
#          then pytest -m gpu with junit figures, in what the lease has left
# Stages run by name too (bash run.sh knn); LAYERSCOPE_GPU_DRY=1 runs them on the CPU (see README.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
W="${LAYERSCOPE_GPU_DIR:-/var/tmp/layerscope-gpu}"
OUT="${OUT:-$W/returned}"
DRY="${LAYERSCOPE_GPU_DRY:-}"
mkdir -p "$W/out" "$OUT"
export PYTHONPATH="$W/site:$REPO/src" PYTHONUNBUFFERED=1 LAYERSCOPE_HOME="$W/home" PYTHONDONTWRITEBYTECODE=1
export HF_HUB_OFFLINE=1
py="${PYTHON:-python3}"
call_start=$(date +%s)
CALL_BUDGET="${CALL_BUDGET:-540}"
BERT_TEXTS="${BERT_TEXTS:-54000}"  # bert-base, <= 512 tokens: 2.68 PFLOP a pass, 6.7 s at 40% of the fp16 peak
STS="$W/data/sts-test.csv"
EXTRAS_SHAPE=qwen2.5-0.5b
if [ -n "$DRY" ]; then  # on the CPU: the same stages on small figures, CPU rows for the GPU ones
  BERT_TEXTS="${DRY_BERT_TEXTS:-24}"; GPU=cpu; KNN_BIG="${DRY_KNN_BIG:-20000}"; KNN_SMALL=2000
  EXTRAS_SHAPE=minilm-l6; export LAYERSCOPE_GPU_SHAPES="${LAYERSCOPE_GPU_SHAPES:-minilm-l6 bert-base}"
else
  GPU=gpu; KNN_BIG=1000000; KNN_SMALL=50000
fi

left() { echo $(( CALL_BUDGET - ($(date +%s) - call_start) - 8 )); }  # 8 s kept to pack the last stage
say() { echo "$*" | tee -a "$OUT/figures.txt"; }
# the host threads of a GPU stage: CPUs 0-7 while the exports run on 8-15, every CPU once they are done
fgcpu() { if [ "$(nproc)" -ge 16 ] && [ ! -f "$W/exports/all.done" ] && [ -z "$DRY" ]; then taskset -c 0-7 "$@"; else "$@"; fi; }
bgcpu() { if [ "$(nproc)" -ge 16 ] && [ -z "$DRY" ]; then taskset -c 8-15 "$@"; else "$@"; fi; }
describe() {  # the machine, beside every stage's figures
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || echo "no GPU";
    cat /proc/loadavg; nproc; grep -m1 'model name' /proc/cpuinfo;
    grep -m1 -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*\|avx2\|fma' /proc/cpuinfo | sort -u | tr '\n' ' '; echo;
    [ -s "$W/torch.txt" ] || $py -c 'import torch; print("torch", torch.__version__)' > "$W/torch.txt" 2>&1;
    cat "$W/torch.txt";
    [ -f "$W/exports.log" ] && { echo "background exports:"; cat "$W/exports.log"; };
  } > "$1/machine.txt" 2>&1
}
wait_for() {  # wait (at most $2 s) for a file the background exports write
  local t=0; while [ ! -f "$1" ] && [ $t -lt "$2" ]; do sleep 2; t=$((t + 2)); done; [ -f "$1" ]
}

# stage NAME WANT_S LEAST_S: run stage_NAME under timeout min(WANT_S, what is left), into $W/out/NAME, then pack
stage() {
  local name=$1 want=$2 least=$3 l t0 rc
  l=$(left)
  if [ "$l" -lt "$least" ]; then say "$name: skipped, $l s left of the call (it needs $least)"; return 0; fi
  local out="$W/out/$name"; rm -rf "$out"; mkdir -p "$out"
  t0=$(date +%s)
  describe "$out"
  STAGE_OUT="$out" STAGE_S=$(( l < want ? l : want )) timeout -k 5 $(( l < want ? l : want )) \
    bash "$REPO/benchmarks/gpu/run.sh" "stage_$name" > "$out/log.txt" 2>&1
  rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && say "$name: cut at its $(( l < want ? l : want )) s (what it measured is in $name.tgz)"
  say "$name: exit $rc after $(( $(date +%s) - t0 )) s ($(cut -d' ' -f1-3 /proc/loadavg) load)"
  # a bench cut short: the rows it finished
  [ ! -s "$out/headline.txt" ] && [ -d "$out/rows" ] && \
    $py benchmarks/gpu/headline.py bench "$out" "$name" > "$out/headline.txt" 2>&1
  [ -f "$out/headline.txt" ] && sed "s/^/  /" "$out/headline.txt" | tee -a "$OUT/figures.txt"
  tar -czf "$OUT/$name.tgz" -C "$W/out" "$name"
}

# a bench stage: layerscope bench into $STAGE_OUT/bench, its table's rows as the headline
bench() {
  local what=$1; shift
  fgcpu $py -m layerscope bench "$@" --rounds 1 --peers none --no-plot --rows-dir "$STAGE_OUT/rows" \
    --out "$STAGE_OUT/bench" 2>&1 | tee "$STAGE_OUT/bench.txt"
  $py "$REPO/benchmarks/gpu/headline.py" bench "$STAGE_OUT" "$what" > "$STAGE_OUT/headline.txt" 2>&1
}

case "${1:?usage: run.sh call1 | call2 | call3 | receive K | <stage>}" in
  call1)
    echo "call1 $(date -u)" >> "$OUT/calls.txt"
    bash "$0" receive 1 || exit 2
    stage base 60 30
    stage knn 120 40
    stage minilm-torch 100 60 ;;
  call2)
    echo "call2 $(date -u)" >> "$OUT/calls.txt"
    bash "$0" receive 2 || exit 2
    stage ort 60 20
    stage minilm 160 60
    stage bert 300 90 ;;
  call3)
    echo "call3 $(date -u)" >> "$OUT/calls.txt"
    stage extras 600 60 ;;
  receive)
    [ -n "$DRY" ] && [ ! -d ".gpu/loads/load-$2" ] && { echo "dry run: no load-$2 to receive"; exit 0; }
    $py benchmarks/gpu/pieces.py receive ".gpu/loads/load-${2:?which load}" --into "$W/pieces" ;;

  stage_base)
    $py benchmarks/gpu/pieces.py join "$W/pieces" --out "$W/wheels" --skip 'onnxruntime-gpu*' || exit 2
    mkdir -p "$W/data" "$W/shapes/minilm-l6"
    [ -f "$W/wheels/sts-test.csv" ] && cp "$W/wheels/sts-test.csv" "$STS"
    [ -f "$STS" ] || cp "${LAYERSCOPE_STS_DIR:-../shared/data/stsbenchmark}/sts-test.csv" "$STS" || exit 2
    [ -n "$DRY" ] && { head -n "${DRY_STS_LINES:-151}" "$STS" > "$STS.cut" && mv "$STS.cut" "$STS"; }
    tar -xf "$W/wheels/minilm-config.tar" -C "$W/shapes/minilm-l6" || exit 2
    if ls "$W"/wheels/*.whl > /dev/null 2>&1; then
      $py -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$W/site" "$W"/wheels/*.whl \
        2>&1 | tee "$STAGE_OUT/pip.txt" || exit 2
    fi
    # MiniLM's config, tokenizer and sentence-transformers modules with seeded random weights: its speed
    $py - "$W/shapes/minilm-l6" <<'PY' 2>&1 | tee "$STAGE_OUT/minilm-shape.txt"
import sys, torch, transformers
torch.manual_seed(0)
model = transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(sys.argv[1]))
model.save_pretrained(sys.argv[1], safe_serialization=True)
print("transformers", transformers.__version__, type(model).__name__, sum(p.numel() for p in model.parameters()))
PY
    setsid nohup bash benchmarks/gpu/run.sh exports > "$W/exports.log" 2>&1 < /dev/null &
    echo "background exports started" | tee "$STAGE_OUT/headline.txt" ;;
  exports)  # in the background, across calls: each shape exported, then its variants
    mkdir -p "$W/exports"
    for shape in ${LAYERSCOPE_GPU_SHAPES:-minilm-l6 bert-base qwen2.5-0.5b}; do
      src="$W/shapes/$shape"; t0=$(date +%s)
      [ -d "$src" ] || bgcpu $py benchmarks/models/build.py "$shape" "$src" > /dev/null 2>&1
      bgcpu $py -m layerscope export "$src" --out "$W/exports/$shape" --no-cpu-precisions 2>&1 | tail -2
      variants=fp16; case $shape in qwen*) variants=fp16,gqa ;; esac
      bgcpu $py -m layerscope optimize "$W/exports/$shape" --variant "$variants" 2>&1 | tail -2
      echo "$shape exported with $variants in $(( $(date +%s) - t0 )) s"; touch "$W/exports/$shape.done"
    done
    touch "$W/exports/all.done" ;;

  stage_knn)  # alignment figures: 50,000 pairs equal to the CPU's, then the 1M-pair run's time
    fgcpu $py -m layerscope.index.bench --sizes '' --align "$KNN_SMALL" --permutations 10 --device "$GPU" \
      --out "$STAGE_OUT/small" 2>&1 | tail -2
    ref="benchmarks/gpu/knn-cpu-50k.json"
    [ -n "$DRY" ] && { $py -m layerscope.index.bench --sizes '' --align "$KNN_SMALL" --permutations 10 --device cpu \
      --out "$STAGE_OUT/small-cpu" > /dev/null 2>&1; ref="$STAGE_OUT/small-cpu/results.json"; }
    $py benchmarks/gpu/headline.py knn "$STAGE_OUT/small/results.json" --reference "$ref" \
      > "$STAGE_OUT/headline.txt" 2>&1
    cat "$STAGE_OUT/headline.txt"
    fgcpu $py -m layerscope.index.bench --sizes '' --align "$KNN_BIG" --permutations 10 --device "$GPU" \
      --out "$STAGE_OUT/big" 2>&1 | tail -2
    $py benchmarks/gpu/headline.py knn "$STAGE_OUT/big/results.json" >> "$STAGE_OUT/headline.txt" 2>&1 ;;

  stage_minilm-torch|stage_minilm)  # stage 1: the MiniLM shape on the STS sentences, every layer
    wait_for "$W/exports/minilm-l6.done" 90 || { echo "minilm-l6 export not done" > "$STAGE_OUT/headline.txt"; exit 3; }
    rows=torch,torch-fp16; [ "$1" = stage_minilm ] && rows=torch,torch-fp16,cuda,cuda-fp16
    [ -n "$DRY" ] && rows=torch,ort
    bench "stage 1, MiniLM shape, STS sentences" -m "$W/exports/minilm-l6" -e "$rows" --sts "$STS" --sts-texts \
      --passes 2 ;;

  stage_ort)  # ONNX Runtime GPU over the machine's CPU build; the providers that start
    $py benchmarks/gpu/pieces.py join "$W/pieces" --out "$W/wheels" --only 'onnxruntime-gpu*' || exit 2
    if [ -n "$DRY" ]; then  # its module is for Python 3.12: unpacked aside, its CUDA kernels listed
      rm -rf "$W/ort-check" && mkdir -p "$W/ort-check" && tar -xJf "$W"/wheels/onnxruntime-gpu*.tar.xz -C "$W/ort-check" || exit 2
      $py benchmarks/gpu/fatbin.py list "$W/ort-check/onnxruntime/capi/libonnxruntime_providers_cuda.so" \
        | tee "$STAGE_OUT/headline.txt"; ls "$W/ort-check/onnxruntime/capi" >> "$STAGE_OUT/headline.txt"; exit 0
    fi
    tar -xJf "$W"/wheels/onnxruntime-gpu*.tar.xz -C "$W/site" || exit 2
    $py - <<'PY' 2>&1 | tee "$STAGE_OUT/providers.txt" "$STAGE_OUT/headline.txt"
import onnxruntime as ort
if hasattr(ort, "preload_dlls"):
    ort.preload_dlls()
print("onnxruntime", ort.__version__, "providers", ort.get_available_providers())
PY
    $py -m layerscope engines 2>&1 | tee "$STAGE_OUT/engines.txt" ;;

  stage_bert)  # stage 2: bert-base shape at 512 tokens, enough texts to fill the GPU
    wait_for "$W/exports/bert-base.done" 120 || { echo "bert-base export not done" > "$STAGE_OUT/headline.txt"; exit 3; }
    rows=torch-fp16,cuda-fp16; [ -n "$DRY" ] && rows=torch,ort
    bench "stage 2, bert-base shape, ${BERT_TEXTS} synthetic texts at <= 512 tokens" -m "$W/exports/bert-base" \
      -e "$rows" --synthetic "$BERT_TEXTS" --profile long --passes 2 --reference-texts 32 ;;

  stage_extras)  # stage 4: Qwen2.5-0.5B and its gqa variant on CUDA, then the suite's GPU tests
    engines=torch-fp16,cuda,cuda-fp16,cuda:gqa; [ -n "$DRY" ] && engines=ort,ort:fp16
    if wait_for "$W/exports/$EXTRAS_SHAPE.done" 60; then
      fgcpu timeout 150 $py benchmarks/gpu/parity.py "$W/exports/$EXTRAS_SHAPE" --engines "$engines" \
        ${DRY:+--device cpu} --out "$STAGE_OUT/parity-$EXTRAS_SHAPE.json" 2>&1 | tee "$STAGE_OUT/headline.txt"
    else
      echo "$EXTRAS_SHAPE export not done" | tee "$STAGE_OUT/headline.txt"
    fi
    [ -n "$DRY" ] && exit 0
    fgcpu $py -m pytest -m gpu -v -p no:cacheprovider -p no:xdist -rs --junitxml "$STAGE_OUT/pytest-gpu.xml" tests \
      2>&1 | tee "$STAGE_OUT/pytest-gpu.txt" | tail -3 >> "$STAGE_OUT/headline.txt" ;;
  *) echo "unknown stage '$1'" >&2; exit 2 ;;
esac
