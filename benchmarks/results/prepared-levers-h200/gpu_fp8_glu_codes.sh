#!/usr/bin/env bash
# The FP8 dense MLP's gated activation straight into the down product's input codes (issue 22;
# BENCHMARKS.md §12c), prepared in session 35 and off by default: CACHET_FP8_GLU_CODES=separate|fused
# per process, one binary. First its CUDA test (bit for bit against the activation's launch then
# the quantization's, with .carry/families-tests.xz), then `bench forward` on the 8B shape with FP8
# weights + FP8 KV — decode batches 64 / 256 at context CTX (default 1280) and a 2,048-token
# prefill — separate and fused alternated over ROUNDS (default 2). SERVE=1 adds the served
# benchmark (FP8 + FP8 KV) with it fused. NCU=1 adds Nsight Compute on the FP8 cache's decode
# attention kernel of a batch-256 step (scripts/gpu_kv_fp8_profile.sh, KVS=fp8; SOURCE=1 with its
# source page: each instruction's executed count and sampled stalls).
# Carry .carry/cachet.xz (and .carry/families-tests.xz); SERVE=1 needs TOKENIZER.
# TEST=0 skips the CUDA test, ROUNDS=0 the A/B.
#   OUT=... [TEST=0] [ROUNDS=2] [CTX=1280] [SERVE=1 TOKENIZER=...] [NCU=1 [SOURCE=1]] scripts/gpu_fp8_glu_codes.sh
source "$(dirname "$0")/gpu_common.sh"
if [ "${TEST:-1}" = 1 ] && [ -x /tmp/families-tests ]; then
  echo "== CUDA test: the activation into codes against the two launches"
  /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_glu_into_codes 2>&1 \
    | tee "$out/families-glu-codes.txt" | grep -E "^test |test result|panicked|differ" | tail -40
fi
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in separate fused; do
    echo "== $v round $r"
    CACHET_FP8_GLU_CODES=$v /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 64,256 \
      --decode-context "${CTX:-1280}" --prefill 2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      --json-out "$out/glu-codes-$v-$r.json" 2>&1 | grep -v INFO > "$out/glu-codes-$v-$r.txt"
    grep -E "decode batch (64|256),|prefill 2048" "$out/glu-codes-$v-$r.txt"
  done
done
if [ "${SERVE:-0}" = 1 ]; then
  CACHET_FP8_GLU_CODES=fused RUNS=fp8 TAG=glu-codes bash scripts/gpu_serve_bench.sh
fi
if [ "${NCU:-0}" = 1 ]; then
  NCU_ONLY=1 KVS=fp8 CTX="${CTX:-1280}" QUANT=fp8 SOURCE="${SOURCE:-0}" bash scripts/gpu_kv_fp8_profile.sh
fi
