#!/usr/bin/env bash
# The INT8 KV cache on the H200 (issue 22): CUDA against the CPU reference of the same format
# (random GQA models with head_dim 64 and 128 — the tensor-core kernel, with and without sliding
# windows — and Gemma's 256, the CUDA-core one), the CUDA runner tests of the INT8 and FP8 caches
# and the engine tests, the INT8 and FP8 caches' fidelity against bf16 on SmolLM2 (`bench kv-fp8`),
# and the 8B shape's decode steps with the three caches side by side (`bench forward`); with
# SERVE=1 the serving benchmark with the INT8 cache, then FP8's and bf16's.
# Carry .carry/cachet.xz, .carry/kv-int8-tests.xz, .carry/kv-fp8-tests.xz, .carry/engine-tests.xz;
# SmolLM2's GGUF as /tmp/smollm2.gguf (earlier carries).
#   OUT=... [SERVE=1] scripts/gpu_kv_int8.sh
source "$(dirname "$0")/gpu_common.sh"
for b in kv-int8-tests kv-fp8-tests; do
  [ -x /tmp/$b ] || [ ! -f .carry/$b.xz ] || { xz -dc .carry/$b.xz > /tmp/$b && chmod +x /tmp/$b; }
done
echo "== attention check, INT8 cache: CUDA against the CPU's INT8 reference"
MODELS="/tmp/m64 /tmp/m128 /tmp/w128 /tmp/g256 tests/fixtures/tiny-gqa-llama3" MODES="prefill decode verify" \
  CACHET=/tmp/cachet KV=int8 bash scripts/gpu_attention_check.sh > "$out/attention-check-int8.txt" 2>&1
echo "$(grep -c ' OK' "$out/attention-check-int8.txt") OK"; grep -E "FAIL|skipped" "$out/attention-check-int8.txt" | head -5
echo "== CUDA tests (the Qwen test needs its GGUF: not here)"
/tmp/kv-int8-tests --ignored --test-threads 1 --skip qwen 2>&1 | tee "$out/kv-int8-tests-cuda.txt" | grep -E "^test |test result|Diff|Agreement"
/tmp/kv-fp8-tests --ignored --test-threads 1 2>&1 | tee "$out/kv-fp8-tests-cuda.txt" | grep -E "test result|FAILED"
/tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "test result|FAILED|panicked"
echo "== fidelity against the bf16 cache, SmolLM2 (real weights)"
for c in kv-int8 kv; do
  /tmp/cachet bench kv-fp8 --compare $c --model /tmp/smollm2.gguf --device cuda --contexts 512,4096 \
    --json-out "$out/fidelity-$c-smollm2.json" 2>&1 | grep -v INFO | tee "$out/fidelity-$c-smollm2.txt" | grep -E "^\||blocks|greedy"
done
echo "== 8B shape, decode steps with each cache"
for kv in int8 fp8 auto; do
  /tmp/cachet bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
    --kv-cache-dtype $kv --decode-batches 1,64,256 --decode-contexts 512,2048 --decode-context 2048 --prefill 2048 \
    --cached-prefix none --sampling-batches 1 --graph-batches 1 --json-out "$out/forward-$kv.json" 2>&1 \
    | grep -v INFO | tee "$out/forward-$kv.txt" | grep -E "^\| (decode|prefill)"
done
if [ "${SERVE:-0}" = 1 ]; then
  RUNS="kv-int8 kv-fp8 defaults" bash scripts/gpu_serve_bench.sh
fi
