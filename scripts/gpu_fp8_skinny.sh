#!/usr/bin/env bash
# FP8 products of 3–64 rows on our tensor-core kernel (CACHET_FP8_SKINNY=on: fp8_skinny_gemm_*,
# each weight byte streamed once, k split where the weight rows give too few blocks) against
# cuBLASLt (issue 22), one binary: the CUDA test comparing the two (8B projection shapes, 3–65
# rows, a fused gate|up) and the random FP8 model's graph-vs-eager decode test with it on, then
# `bench forward` on the Llama-3-8B shape with FP8 weights + FP8 KV — decode batches 16 / 32 / 64
# at context 1280 (batch 1–2 take the GEMV, 65+ cuBLASLt either way) — the two alternated over
# ROUNDS, and PROFILE=1 a `--profile` run of batch 64 each (the `↳ fp8:` product rows).
# Carry .carry/cachet.xz, .carry/families-tests.xz, .carry/engine-tests.xz.
#   OUT=... [ROUNDS=2] [PROFILE=1] scripts/gpu_fp8_skinny.sh
source "$(dirname "$0")/gpu_common.sh"
echo "== CUDA tests"
/tmp/families-tests --ignored --test-threads 1 --nocapture skinny 2>&1 | tee "$out/families-skinny.txt" \
  | grep -E "^test |test result|panicked|skinny vs"
CACHET_FP8_SKINNY=on /tmp/engine-tests --ignored --test-threads 1 random_fp8_model 2>&1 \
  | tee "$out/engine-random-fp8-skinny.txt" | grep -E "^test |test result|panicked"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for r in $(seq 1 ${ROUNDS:-2}); do
  for v in on off; do
    echo "== round $r, CACHET_FP8_SKINNY=$v"
    CACHET_FP8_SKINNY=$v /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,32,64 \
      --decode-context 1280 --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      --json-out "$out/skinny-$v-$r.json" 2>&1 | grep -v INFO > "$out/skinny-$v-$r.txt"
    grep -E "batch (16|32|64)," "$out/skinny-$v-$r.txt"
  done
done
if [ "${PROFILE:-0}" = 1 ]; then
  for v in on off; do
    CACHET_FP8_SKINNY=$v /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 64 \
      --decode-context 1280 --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile \
      2>&1 | grep -v INFO > "$out/profile-skinny-$v.txt"
    echo "== profile, CACHET_FP8_SKINNY=$v"; grep -E "^\| (gemm|↳|attention)" "$out/profile-skinny-$v.txt" | head -12
  done
fi
