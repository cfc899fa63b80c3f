#!/usr/bin/env bash
# The seed article's TTFT experiment on the GPU machine, in one call: the Llama-3-8B shape with
# dummy bf16 weights behind `cachet serve`, baseline vs all optimizations, cold and warm (then, with
# ABLATION=1, each optimization alone: run it as a second call, the device allows 10 minutes a call).
# Results, report and plots go to $OUT/ttft (or ./gpu-out/ttft).
#   CACHET=.carry/cachet TOKENIZER=.carry/smollm2.gguf RATE=40 REQUESTS=800 bash scripts/gpu_ttft.sh
set -euo pipefail
out=${OUT:-gpu-out}/ttft
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CACHET_CACHE_DIR=${CACHET_CACHE_DIR:-/tmp/cachet-cache}
bin=${CACHET:-.carry/cachet}
configs=baseline,all-on
if [ "${ABLATION:-0}" = 1 ]; then
  configs=+prefix-cache,+normalization,+chunked-prefill,+shortest-first,+cuda-graphs,+speculation,+fp8-kv
fi
"$bin" bench ttft --model examples/configs/llama3-8b.json --load-format dummy --tokenizer "${TOKENIZER:-.carry/smollm2.gguf}" \
  --device cuda --requests "${REQUESTS:-800}" --rate "${RATE:-40}" --max-tokens "${MAX_TOKENS:-64}" --warmup 32 \
  --configs "$configs" --modes "${MODES:-cold,warm}" --out "$out"
