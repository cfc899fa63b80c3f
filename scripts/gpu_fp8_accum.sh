#!/usr/bin/env bash
# FP8 GEMMs with and without cuBLASLt's fast accumulation (issue 22), one binary, the mode
# chosen per process by CACHET_FP8_FAST_ACCUM: the FP8-weight tests on CUDA under each mode
# (tiny-qwen3 against transformers on torch's e4m3 weights), then `bench forward` on the
# Llama-3-8B shape with FP8 weights — batched decode at context 2048 and prefill, where the
# cuBLASLt GEMMs run — off / on / off / on, then the FP8-weight logits against bf16 under each
# mode (`bench kv-fp8 --compare weights`, 8B shape, dummy weights) and, with SERVE=1, the
# serving benchmark with FP8 weights and cache under the mode FAST (default 1).
# Carry .carry/cachet.xz and .carry/families-tests.xz; SmolLM2's GGUF as /tmp/smollm2.gguf.
#   OUT=... scripts/gpu_fp8_accum.sh
source "$(dirname "$0")/gpu_common.sh"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda)
if [ -x /tmp/families-tests ]; then
  for a in 0 1; do
    echo "== FP8-weight tests on CUDA, fast accumulation $a"
    CACHET_FP8_FAST_ACCUM=$a /tmp/families-tests --ignored --test-threads 1 fp8 2>&1 \
      | tee "$out/families-fp8-accum$a.txt" | grep -E "^test |test result|panicked|error"
  done
fi
for round in 1 2; do
  for a in 0 1; do
    echo "== round $round, fast accumulation $a"
    CACHET_FP8_FAST_ACCUM=$a /tmp/cachet bench forward "${m[@]}" --quantization fp8 --decode-contexts 512 \
      --decode-batches 16,64,256 --decode-context 2048 --prefill 512,2048,4096 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --json-out "$out/forward-accum$a-r$round.json" 2>&1 \
      | grep -v INFO | tee "$out/forward-accum$a-r$round.txt"
  done
done
for a in 0 1; do
  echo "== FP8 weights against bf16, fast accumulation $a"
  CACHET_FP8_FAST_ACCUM=$a /tmp/cachet bench kv-fp8 --compare weights "${m[@]}" --tokenizer /tmp/smollm2.gguf \
    --contexts 512,2048 --json-out "$out/fp8w-8b-accum$a.json" 2>&1 | grep -v INFO | tee "$out/fp8w-8b-accum$a.txt"
done
if [ -n "${SERVE:-}" ]; then
  echo "== served, FP8 weights + FP8 KV, fast accumulation ${FAST:-1}"
  CACHET_FP8_FAST_ACCUM=${FAST:-1} OUT=$out/serve RUNS=fp8 bash scripts/gpu_serve_bench.sh
fi
