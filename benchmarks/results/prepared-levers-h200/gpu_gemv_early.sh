#!/usr/bin/env bash
# Decode GEMVs warming L2 with their own first weight rows before they wait for the kernel before
# them (gemv.cu's GEMV_EARLY_PREFETCH = 1; prepared in session 35, 0 by default until measured)
# against the default, one binary, kernel sources swapped through CACHET_KERNEL_DIR: `bench
# forward` batch-1 decode at contexts 512 / 4096 (CUDA graphs, programmatic launches as served) on
# the 8B shape with FP8 and with bf16 weights, and on Qwen3-30B-A3B (its attention and router
# GEMVs; the experts are moe.cu's), alternated over ROUNDS (default 2). The results do not change
# (prefetches only); the question is whether blocks placed early by a programmatic launch keep
# DRAM busy across the kernel boundaries that hold batch 1 at 1.2–2.2× its floor.
# Carry .carry/cachet.xz.
#   OUT=... [ROUNDS=2] scripts/gpu_gemv_early.sh
source "$(dirname "$0")/gpu_common.sh"
early=/tmp/kernels-gemv-early
mkdir -p $early
sed 's/^#define GEMV_EARLY_PREFETCH 0$/#define GEMV_EARLY_PREFETCH 1/' kernels/src/gemv.cu > $early/gemv.cu
grep -q '^#define GEMV_EARLY_PREFETCH 1$' $early/gemv.cu || { echo "the switch was not found"; exit 1; }
bench() {  # name, kernel dir (or "" for the embedded sources), then model flags
  local name=$1 dir=$2; shift 2
  echo "== $name"
  env ${dir:+CACHET_KERNEL_DIR=$dir} /tmp/cachet bench forward "$@" --device cuda --decode-contexts 512,4096 \
    --decode-batches 16 --decode-context 2048 --prefill 512 --cached-prefix none --sampling-batches 1 \
    --graph-batches 1 --json-out "$out/$name.json" 2>&1 | grep -v " INFO " > "$out/$name.txt"
  grep -E "^\| decode batch 1," "$out/$name.txt"
}
m8=(--model examples/configs/llama3-8b.json --load-format dummy)
mq=(--model examples/configs/qwen3-30b-a3b.json --load-format dummy)
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in default early; do
    dir=""; [ $v = early ] && dir=$early
    bench "8b-fp8-$v-$r" "$dir" "${m8[@]}" --quantization fp8
    bench "8b-bf16-$v-$r" "$dir" "${m8[@]}"
    bench "qwen3-30b-a3b-$v-$r" "$dir" "${mq[@]}"
  done
done
