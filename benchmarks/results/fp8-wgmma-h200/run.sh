#!/usr/bin/env bash
# FP8 products of 16-64 padded rows on wgmma_fp8.cu's warpgroup kernel (CACHET_FP8_WGMMA=on) against
# cuBLASLt's (off), issue 22: the CUDA test comparing the two products (8B projection shapes, 5-64
# rows), the random FP8 model's graph-vs-eager decode test under each value, then `bench forward`
# on the Llama-3-8B shape with FP8 weights + FP8 KV at ctx 1280 (batches 8-64; batch 1 at ctx 512),
# the two alternated over ROUNDS, and an eager profile of batch 64 under each.
# Carry .carry/cachet.xz, .carry/families-tests.xz, .carry/engine-tests.xz.
#   OUT=... [ROUNDS=2] [BATCHES=8,16,32,48,64] [VARIANTS="off on"] [PROFILE="off on"] [PROFILE_BATCHES="16 64"] [TESTS=0] [ROUNDS=0] scripts/gpu_fp8_wgmma.sh
source "$(dirname "$0")/gpu_common.sh"
[ "${TESTS:-1}" = 1 ] && echo "== CUDA test: warpgroup products against cuBLASLt's" && /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_products_on_the_warpgroup 2>&1 \
  | tee "$out/families-wgmma.txt" | grep -E "^test |test result|panicked|vs cuBLASLt" | tail -60
[ "${TESTS:-1}" = 1 ] && for v in off on; do
  CACHET_FP8_WGMMA=$v /tmp/engine-tests --ignored --test-threads 1 random_fp8_model 2>&1 \
    | tee "$out/engine-random-fp8-$v.txt" | grep -E "^test |test result|panicked"
done
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8
   --decode-contexts 512 --decode-context 1280 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1)
wg() { echo "CACHET_FP8_WGMMA=$1"; }
for r in $(seq 1 ${ROUNDS:-2}); do for v in ${VARIANTS:-off on}; do
  env $(wg $v) /tmp/cachet bench forward "${m[@]}" --decode-batches ${BATCHES:-8,16,32,48,64} 2>&1 \
    | grep -v " INFO " > "$out/wgmma-$v-r$r.txt"
  echo "wgmma $v, round $r: $(grep -E '^\| decode batch [0-9]+,' "$out/wgmma-$v-r$r.txt" | awk -F'|' '{print $3}' | tr '\n' ' ')"
done; done
for v in ${PROFILE:-}; do for b in ${PROFILE_BATCHES:-16 64}; do
  env $(wg $v) /tmp/cachet bench forward "${m[@]}" --decode-batches $b --profile 2>&1 \
    | grep -v " INFO " > "$out/profile-wgmma-$v-b$b.txt"
  echo "profile, wgmma $v, batch $b:"
  awk "/decode batch $b, ctx/ && /where the time goes/ {on=1} on && /^\| ↳/ {print} /prefill/ && /where the time goes/ {on=0}" "$out/profile-wgmma-$v-b$b.txt"
done; done
