#!/usr/bin/env bash
# The request-surface session on a GPU machine (issue 19): the engine, sampling and speculative
# test binaries on CUDA (`--ignored`: the ::cuda variants, incl. the processors, logprobs, seeded
# reproducibility and n-choice prefix sharing), then token selection timed side by side on the
# 8B shape (greedy, sampled, + processors, + logprobs). Binaries and the SmolLM2 GGUF come from
# $CARRY (bins.tgz, smollm2.gguf); logs go to $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
c=${CARRY:-/tmp/c}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CACHET_CACHE_DIR=${CACHET_CACHE_DIR:-/tmp/cachet-cache}
mkdir -p "$CACHET_CACHE_DIR/models/smollm2"
cp "$c/smollm2.gguf" "$CACHET_CACHE_DIR/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
for t in sampling engine speculative; do
  echo "== $t tests on CUDA"
  timeout 200 "$c/$t-tests" --ignored --test-threads 1 2>&1 | tee "$out/$t-cuda.txt" | grep -E "^test |test result"
done
echo "== token selection on the 8B shape (dummy bf16 weights)"
timeout 240 "$c/cachet" bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
  --decode-batches 1,64 --decode-contexts 512 --prefill 512 --cached-prefix none --graph-batches 1,64 \
  --sampling-batches 1,64 --json-out "$out/bench-sampling.json" 2>&1 | grep -v INFO | tee "$out/bench-sampling.txt"
