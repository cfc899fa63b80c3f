#!/usr/bin/env bash
# FP8 GEMMs with timed algorithm choice (CACHET_FP8_GEMM_TUNE=timed: the fastest of cuBLASLt's
# candidates per shape, timed on first use) against the heuristic's first pick (issue 22), one
# binary: the CUDA test comparing the two products (8B projection shapes, 40 / 256 / 2,048 rows)
# and the random FP8 model's graph-vs-eager decode test under each value, then `bench forward` on
# the Llama-3-8B shape with FP8 weights + FP8 KV — decode batches 64 / 128 / 256 at context 1280
# and a 2,048-token prefill — the two alternated over ROUNDS (the timed runs log each choice:
# tune-choices-*.txt); SERVE=1 adds the served benchmark (FP8 weights + FP8 KV) with each.
# Carry .carry/cachet.xz, .carry/families-tests.xz, .carry/engine-tests.xz (and for SERVE=1
# .carry/smollm2-tokenizer.gguf).
#   OUT=... [ROUNDS=2] [SERVE=1] scripts/gpu_fp8_gemm_tune.sh
source "$(dirname "$0")/gpu_common.sh"
for v in heuristic timed; do
  echo "== CUDA tests, CACHET_FP8_GEMM_TUNE=$v"
  CACHET_FP8_GEMM_TUNE=$v /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_gemms_with_timed 2>&1 \
    | tee "$out/families-tune-$v.txt" | grep -E "^test |test result|panicked|timed vs"
  CACHET_FP8_GEMM_TUNE=$v /tmp/engine-tests --ignored --test-threads 1 random_fp8_model 2>&1 \
    | tee "$out/engine-random-fp8-$v.txt" | grep -E "^test |test result|panicked"
done
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for r in $(seq 1 ${ROUNDS:-2}); do
  for v in heuristic timed; do
    echo "== round $r, CACHET_FP8_GEMM_TUNE=$v"
    CACHET_FP8_GEMM_TUNE=$v RUST_LOG=info,cachet_backend::device::cuda::gemm_fp8=debug /tmp/cachet bench forward "${m[@]}" \
      --decode-contexts 512 --decode-batches 64,128,256 --decode-context 1280 --prefill 2048 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --json-out "$out/tune-$v-$r.json" > "$out/tune-$v-$r.log" 2>&1
    grep -v -E " INFO | DEBUG " "$out/tune-$v-$r.log" > "$out/tune-$v-$r.txt"
    grep "FP8 GEMM tuned" "$out/tune-$v-$r.log" > "$out/tune-choices-$v-$r.txt"
    grep -E "prefill|batch (64|128|256)," "$out/tune-$v-$r.txt"
    [ $v = heuristic ] || echo "$(wc -l < "$out/tune-choices-$v-$r.txt") shapes tuned, $(grep -vc 'best=0 ' "$out/tune-choices-$v-$r.txt") not the heuristic's pick"
  done
done
if [ "${SERVE:-0}" = 1 ]; then
  for v in heuristic timed; do
    CACHET_FP8_GEMM_TUNE=$v TAG=$v RUNS=fp8 TOKENIZER=${TOKENIZER:-.carry/smollm2-tokenizer.gguf} bash scripts/gpu_serve_bench.sh 2>&1 \
      | grep -E "Output token|Median TTFT|P99 TTFT|Median TPOT|Failed|engine_step"
  done
fi
