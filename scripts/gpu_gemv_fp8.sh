#!/usr/bin/env bash
# FP8 decode steps of 2-4 rows on the GEMV (CACHET_GEMV_FP8=4, the default) or on cuBLASLt's FP8 GEMM
# (CACHET_GEMV_FP8=2 / 1), one binary, the value per process, two rounds: `bench forward` on the
# Llama-3-8B shape with FP8 weights + FP8 KV at ctx 1280 (batch 1 at ctx 512), batches 2, 3, 4, 8.
# Carry .carry/cachet.xz.
#   OUT=... bash scripts/gpu_gemv_fp8.sh
source "$(dirname "$0")/gpu_common.sh"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8
   --decode-contexts 512 --decode-context 1280 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1
   --decode-batches 2,3,4,8)
for r in 1 2; do for v in ${VALUES:-4 2 1}; do
  CACHET_GEMV_FP8=$v /tmp/cachet bench forward "${m[@]}" 2>&1 | grep -v " INFO " > "$out/gemv-fp8-$v-r$r.txt"
  echo "GEMV up to $v rows, round $r: $(grep -E '^\| decode batch [0-9]+,' "$out/gemv-fp8-$v-r$r.txt" | awk -F'|' '{print $3}' | tr '\n' ' ')"
done; done
