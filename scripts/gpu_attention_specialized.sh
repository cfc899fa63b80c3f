#!/usr/bin/env bash
# The decode-specialized attention (attention_mma.cu with MMA_DECODE_SPECIALIZED = 1: FP8-cache
# decode blocks run an instantiation of their own, the copies' loops, lookups and fragment paths
# fixed at compile time — 650 instructions of machine code in its tile loop against 833, read
# with cuobjdump, BENCHMARKS.md §12c) against the default, one binary, the sources swapped in
# through CACHET_KERNEL_DIR: the CUDA-vs-CPU attention check and the engine tests that need no
# downloads with it, then `bench forward` decode batches 64 / 256 at context 1280 with FP8
# weights + FP8 KV, alternated over ROUNDS; with SERVE=1 the served benchmark (FP8 + FP8 KV) with it.
# Carry .carry/cachet.xz (and .carry/engine-tests.xz, .carry/smollm2-tokenizer.gguf for SERVE=1).
#   OUT=... [ROUNDS=2] [SERVE=1] scripts/gpu_attention_specialized.sh
source "$(dirname "$0")/gpu_common.sh"
spec=/tmp/kernels-specialized
mkdir -p $spec && sed 's/^#define MMA_DECODE_SPECIALIZED 0$/#define MMA_DECODE_SPECIALIZED 1/' kernels/src/attention_mma.cu > $spec/attention_mma.cu
grep -q '^#define MMA_DECODE_SPECIALIZED 1$' $spec/attention_mma.cu || { echo "the switch was not found"; exit 1; }
echo "== attention check, specialized"
CACHET_KERNEL_DIR=$spec CACHET=/tmp/cachet KV="auto fp8" MODES="prefill decode verify" bash scripts/gpu_attention_check.sh > "$out/attention-check.txt" 2>&1
echo "OK $(grep -c OK "$out/attention-check.txt") FAIL $(grep -c FAIL "$out/attention-check.txt")"
if [ -x /tmp/engine-tests ]; then
  CACHET_KERNEL_DIR=$spec timeout 200 /tmp/engine-tests --ignored --test-threads 1 > "$out/engine-cuda.txt" 2>&1
  grep -E "test result" "$out/engine-cuda.txt"
fi
fwd() {  # name, kernel dir or "default"
  local dir=(); [ "$2" = default ] || dir=(env CACHET_KERNEL_DIR=$2)
  "${dir[@]}" /tmp/cachet bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
    --quantization fp8 --kv-cache-dtype fp8 --decode-contexts 512 --decode-batches 64,256 --decode-context 1280 --prefill 512 \
    --cached-prefix none --sampling-batches 1 --graph-batches 1 --json-out "$out/$1.json" 2>&1 | grep -v INFO > "$out/$1.txt"
  echo "$1: $(grep -E '^\| decode batch' "$out/$1.txt" | cut -d'|' -f2,3 | tr '\n' ' ')"
}
for r in $(seq 1 ${ROUNDS:-2}); do fwd default-$r default; fwd specialized-$r $spec; done
if [ "${SERVE:-0}" = 1 ]; then
  CACHET_KERNEL_DIR=$spec RUNS=fp8 N=512 T=150 TAG=specialized TOKENIZER=.carry/smollm2-tokenizer.gguf bash scripts/gpu_serve_bench.sh 2>&1 \
    | grep -E "==|throughput|Median|Failed|step_gap|step_sec"
fi
