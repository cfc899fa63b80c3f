#!/usr/bin/env bash
# The transposed decode attention on the H200 (issue 22; BENCHMARKS.md §12c), one binary, each
# cache's decode kernel chosen per process: bf16 cache CACHET_DECODE_ATTENTION_BF16=rows|transposed
# (default transposed since session 35's measurement), FP8 cache
# CACHET_DECODE_ATTENTION=rows|transposed (default transposed). First the CUDA-vs-CPU attention
# check with both transposed kernels on (bf16 and FP8 caches, GQA groups 4 and 8, windows, split
# keys), then `bench forward` decode batches 64 / 128 / 256 at context CTX (default 1280), bf16
# weights + bf16 KV and FP8 weights + FP8 KV, rows and transposed alternated over ROUNDS (default
# 2); SERVE=1 adds the served benchmark with the default flags (bf16) and the bf16 transposed kernel.
# Also the FP8 sub-layer norm straight into the GEMM's codes (CACHET_FP8_NORM=separate|fused,
# default fused since the same measurement): its CUDA test against the two launches, bit for bit (with the
# gate|up epilogue's), when .carry/families-tests.xz is carried, and a third A/B row, FP8 weights
# + FP8 KV with the two launches (CACHET_FP8_NORM=separate).
# Carry .carry/cachet.xz; SERVE=1 needs a tokenizer (TOKENIZER=.carry/smollm2-tokenizer.gguf).
#   OUT=... [ROUNDS=2] [CTX=1280] [SERVE=1 TOKENIZER=...] scripts/gpu_decode_attention.sh
source "$(dirname "$0")/gpu_common.sh"
echo "== attention check, transposed decode kernels on (bf16 and FP8 caches)"
CACHET_DECODE_ATTENTION_BF16=transposed CACHET_DECODE_ATTENTION=transposed CACHET=/tmp/cachet KV="auto fp8" \
  bash scripts/gpu_attention_check.sh > "$out/attention-check.txt" 2>&1
echo "$(grep -c OK "$out/attention-check.txt") OK"; grep FAIL "$out/attention-check.txt" || echo "no FAIL"
if [ -x /tmp/families-tests ]; then
  echo "== CUDA tests: FP8 norm into codes, gate|up epilogue (bit for bit against the separate launches)"
  /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_norm_into_codes fp8_gate_up 2>&1 \
    | tee "$out/families-fp8-fused.txt" | grep -E "^test |test result|panicked|differ" | tail -12
fi
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda)
bench() {  # name, switch, value, then model flags
  local name=$1 var=$2 v=$3; shift 3
  echo "== $name"
  env "$var=$v" /tmp/cachet bench forward "${m[@]}" "$@" --decode-contexts 512 --decode-batches 64,128,256 \
    --decode-context "${CTX:-1280}" --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
    --json-out "$out/$name.json" 2>&1 | grep -v INFO > "$out/$name.txt"
  grep -E "decode batch (64|128|256)," "$out/$name.txt"
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in rows transposed; do
    bench "bf16-$v-$r" CACHET_DECODE_ATTENTION_BF16 $v
    bench "fp8-$v-$r" CACHET_DECODE_ATTENTION $v --quantization fp8 --kv-cache-dtype fp8
  done
  bench "fp8-norm-separate-$r" CACHET_FP8_NORM separate --quantization fp8 --kv-cache-dtype fp8
done
if [ "${SERVE:-0}" = 1 ]; then
  CACHET_DECODE_ATTENTION_BF16=transposed RUNS=defaults TAG=bf16-transposed bash scripts/gpu_serve_bench.sh
fi
