#!/usr/bin/env bash
# Decode on the H200 (issue 22): `bench forward` on the Llama-3-8B shape (dummy bf16 weights)
# with the projections as loaded and in FP8 (--quantization fp8), batch 1 at contexts 512 / 4096
# and batches 64 / 128 / 256 at context 2048, each row held against its floors — bytes ÷ the
# copy rate and, for the batches, the roofline (the projections at the measured GEMM ceiling
# where they are compute-bound) — then the FP8 KV cache beside bf16 at those batches; FP8 weight
# fidelity (`bench kv-fp8 --compare weights`) on SmolLM2 and the 8B shape; the CUDA tests of the
# build when carried (families: the FP8-weight and tiny-family tests; engine).
# Carry .carry/cachet.xz (and the test binaries); SmolLM2's GGUF as /tmp/smollm2.gguf.
#   OUT=... scripts/gpu_decode.sh
source "$(dirname "$0")/gpu_common.sh"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda)
if [ -x /tmp/families-tests ]; then
  echo "== families tests on CUDA (FP8 weights, tiny families)"
  /tmp/families-tests --ignored --test-threads 1 fp8_weights tiny_families 2>&1 | tee "$out/families-cuda.txt" | grep -E "^test |test result|panicked"
fi
for q in none fp8; do
  echo "== decode, weights $q"
  /tmp/cachet bench forward "${m[@]}" --quantization $q --decode-contexts 512,4096 --decode-batches 64,128,256 \
    --decode-context 2048 --prefill 512,2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
    --profile --json-out "$out/decode-w$q.json" 2>&1 | grep -v INFO | tee "$out/decode-w$q.txt"
done
echo "== decode, FP8 KV"
/tmp/cachet bench forward "${m[@]}" --kv-cache-dtype fp8 --decode-contexts 4096 --decode-batches 64,128,256 \
  --decode-context 2048 --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
  --json-out "$out/decode-kvfp8.json" 2>&1 | grep -v INFO | tee "$out/decode-kvfp8.txt"
echo "== FP8 weight fidelity"
{ /tmp/cachet bench kv-fp8 --compare weights --model /tmp/smollm2.gguf --device cuda --contexts 512,4096 \
    --json-out "$out/fp8w-smollm2.json" 2>&1
  /tmp/cachet bench kv-fp8 --compare weights --model examples/configs/llama3-8b.json --load-format dummy \
    --tokenizer /tmp/smollm2.gguf --device cuda --contexts 512,4096 --json-out "$out/fp8w-8b.json" 2>&1; } \
  | grep -v INFO | tee "$out/fp8w.txt"
/tmp/cachet generate --model /tmp/smollm2.gguf --device cuda --quantization fp8 --chat \
  --prompt "What is the capital of France?" --max-tokens 24 2>&1 | grep -v INFO | tee "$out/generate-fp8.txt"
if [ -x /tmp/engine-tests ]; then
  echo "== engine tests on CUDA"
  /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "^test |test result|panicked"
fi
