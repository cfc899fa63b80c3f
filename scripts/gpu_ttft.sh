#!/usr/bin/env bash
# The seed article's TTFT experiment on the GPU machine, in one call: the Llama-3-8B shape with
# dummy bf16 weights behind `cachet serve`, baseline vs all optimizations, cold and warm, at LOAD
# (default 0.9) × the baseline's capacity measured first in the same run, or at RATE req/s if set.
# With ABLATION=1, each optimization alone instead; with LEAVE_ONE_OUT=1, all on without each one
# (run them as further calls at the first call's rate: the device allows 10 minutes a call; the
# rate of the last run is left in /tmp/ttft-rate).
# Results, report and plots go to $OUT/$TTFT_DIR (default gpu-out/ttft).
# TOKENIZER: SmolLM2's GGUF, or only its tokenizer and chat template (1.8 MB, what the offline GPU
# machine is carried): python3 scripts/gguf_tokenizer_only.py SmolLM2-135M-Instruct.Q4_1.gguf .carry/smollm2-tokenizer.gguf
#   CACHET=.carry/cachet TOKENIZER=.carry/smollm2-tokenizer.gguf LOAD=1.0 REQUESTS=1200 bash scripts/gpu_ttft.sh
#   CACHET=.carry/cachet TOKENIZER=.carry/smollm2-tokenizer.gguf RATE=$(cat /tmp/ttft-rate) ABLATION=1 MODES=warm bash scripts/gpu_ttft.sh
# CONFIGS picks the configurations (default baseline,all-on), e.g. CONFIGS=all-on MODES=warm RATE=... for
# one configuration's A/B between binaries or switches at a fixed rate.
set -euo pipefail
out=${OUT:-gpu-out}/${TTFT_DIR:-ttft}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CACHET_CACHE_DIR=${CACHET_CACHE_DIR:-/tmp/cachet-cache}
bin=${CACHET:-.carry/cachet}
configs=${CONFIGS:-baseline,all-on}
if [ "${ABLATION:-0}" = 1 ]; then
  configs=+prefix-cache,+normalization,+chunked-prefill,+shortest-first,+cuda-graphs,+speculation,+fp8-kv,+fp8-weights
fi
if [ "${LEAVE_ONE_OUT:-0}" = 1 ]; then
  configs=-prefix-cache,-normalization,-chunked-prefill,-shortest-first,-cuda-graphs,-speculation,-fp8-kv,-fp8-weights
fi
rate_args=(--load "${LOAD:-1.0}")
if [ -n "${RATE:-}" ]; then rate_args=(--rate "$RATE"); fi
"$bin" bench ttft --model examples/configs/llama3-8b.json --load-format dummy --tokenizer "${TOKENIZER:-.carry/smollm2.gguf}" \
  --device cuda --requests "${REQUESTS:-1200}" "${rate_args[@]}" --max-tokens "${MAX_TOKENS:-64}" --warmup 32 \
  --configs="$configs" --modes "${MODES:-cold,warm}" --out "$out"
sed -n 's/^Workload: [0-9]* requests, Poisson \([0-9.]*\) req\/s.*/\1/p' "$out/report.md" > /tmp/ttft-rate
echo "rate: $(cat /tmp/ttft-rate) req/s"
