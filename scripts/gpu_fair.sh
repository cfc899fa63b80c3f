#!/usr/bin/env bash
# The noisy-neighbour benchmark on the H200 (8B shape, dummy bf16 weights, SmolLM2's tokenizer)
# in one call, after the CUDA engine and speculative tests of the same build (TESTS=0 skips
# them). Carry .carry/{cachet,engine-tests,speculative-tests}.xz (stripped, xz) and SmolLM2's
# GGUF as /tmp/smollm2.gguf (split across earlier carries). Test binaries find their fixtures
# under the path they were built in: BUILT_IN (default /work/main) is linked to this checkout.
# STEP_MS sets a step-time target (`--max-step-ms`; the GPU has none by default).
#   OUT=... [STEP_MS=20] scripts/gpu_fair.sh
source "$(dirname "$0")/gpu_common.sh"
if [ "${TESTS:-1}" = 1 ]; then
  echo "== engine tests on CUDA"
  /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "^test |test result"
  echo "== speculative tests on CUDA"
  /tmp/speculative-tests --ignored --test-threads 1 2>&1 | tee "$out/speculative-cuda.txt" | grep -E "^test |test result"
fi
echo "== bench fair, 8B shape"
/tmp/cachet bench fair --model examples/configs/llama3-8b.json --load-format dummy --tokenizer smollm2 \
  --device cuda --max-num-seqs ${SEQS:-64} --max-num-batched-tokens ${BUDGET:-2048} --prompt-len ${PROMPT:-512} --output-len ${OUTPUT:-128} \
  --fair-prefill-cap ${CAP:-256} ${STEP_MS:+--max-step-ms $STEP_MS} --duration ${DURATION:-30} \
  --out "$out/fair-8b${TAG:-}" 2>&1 | grep -v " INFO " | tee "$out/fair-8b${TAG:-}.txt"
