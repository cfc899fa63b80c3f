#!/usr/bin/env bash
# The decode GEMVs' L2 warm-up of the next projection's weights (CACHET_L2_PREFETCH_MB; gemv.cu's
# prefetch_next, moe.cu's expert down blocks), side by side in one call (issues 22 and 24): the
# CUDA tests on the tiny fixtures with it on (families against transformers, MoE against the CPU
# reference; a hint must not change a result), then `bench forward` at batch 1 (ctx 512 / 4096)
# and batches 2 / 4 (ctx 512: the GEMV paths) for each of MODELS, the values of VALUES in turn,
# ROUNDS times (one binary; the value chosen per process).
# Carry .carry/{cachet,families-tests,moe-tests}.xz.
#   OUT=... [VALUES="off 16 32"] [ROUNDS=2] [MODELS="8b 8b-fp8 qwen3-moe"] [TESTS=1] scripts/gpu_l2_prefetch.sh
source "$(dirname "$0")/gpu_common.sh"
values=${VALUES:-off 16 32}
if [ "${TESTS:-1}" = 1 ]; then
  echo "== CUDA tests, default warm-up"
  [ ! -x /tmp/families-tests ] || timeout 240 /tmp/families-tests --ignored --test-threads 1 --skip qwen25 --skip gemma3_270m 2>&1 \
    | tee "$out/families-cuda.txt" | grep -E "test result|panicked"
  [ ! -x /tmp/moe-tests ] || timeout 200 /tmp/moe-tests --ignored --test-threads 1 2>&1 \
    | tee "$out/moe-cuda.txt" | grep -E "test result|panicked"
fi
args() {
  case $1 in
    8b) echo --model examples/configs/llama3-8b.json ;;
    8b-fp8) echo --model examples/configs/llama3-8b.json --quantization fp8 ;;
    qwen3-moe) echo --model examples/configs/qwen3-30b-a3b.json ;;
    mixtral) echo --model examples/configs/mixtral-8x7b.json ;;
  esac
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for m in ${MODELS:-8b 8b-fp8 qwen3-moe}; do
    for v in $values; do
      f="$out/forward-$m-$v-r$round"
      CACHET_L2_PREFETCH_MB=$v timeout 150 /tmp/cachet bench forward $(args "$m") --load-format dummy --device cuda \
        --decode-contexts 512,4096 --decode-batches 2,4 --decode-context 512 --prefill 512 --cached-prefix none \
        --sampling-batches 1 --graph-batches 1 --json-out "$f.json" 2>&1 | grep -v " INFO " > "$f.txt"
      echo "$m L2=$v r$round: $(grep -E '^\| decode batch' "$f.txt" | awk -F'|' '{printf "%s %s;", $2, $3}')"
    done
  done
done | tee "$out/summary.txt"
