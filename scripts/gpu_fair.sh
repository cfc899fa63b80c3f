#!/usr/bin/env bash
# The noisy-neighbour benchmark on the H200 (8B shape, dummy bf16 weights, SmolLM2's tokenizer),
# in one call. Carry the stripped, xz-compressed binary in .carry/cachet.xz and SmolLM2's GGUF as
# /tmp/smollm2.gguf (split across carries: see the session notes in BENCHMARKS.md §6).
#   OUT=... scripts/gpu_fair.sh
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CACHET_CACHE_DIR=${CACHET_CACHE_DIR:-/tmp/cachet-cache}
bin=/tmp/cachet
[ -x "$bin" ] || { xz -dc .carry/cachet.xz > "$bin" && chmod +x "$bin"; }
mkdir -p "$CACHET_CACHE_DIR/models/smollm2"
cp /tmp/smollm2.gguf "$CACHET_CACHE_DIR/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
"$bin" bench fair --model examples/configs/llama3-8b.json --load-format dummy --tokenizer smollm2 \
  --device cuda --max-num-seqs ${SEQS:-64} --max-num-batched-tokens ${BUDGET:-2048} --prompt-len ${PROMPT:-512} --output-len ${OUTPUT:-128} \
  --duration ${DURATION:-30} --out "$out/fair-8b${TAG:-}" 2>&1 | grep -v " INFO " | tee "$out/fair-8b${TAG:-}.txt"
