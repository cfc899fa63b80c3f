#!/usr/bin/env bash
# FP8 GEMMs with cuBLASLt's product written in f32 or in bf16 before the scale epilogue
# (issue 22), one binary, the mode chosen per process by CACHET_FP8_PRODUCT: the FP8-weight test
# on CUDA under each (tiny-qwen3 against transformers on torch's e4m3 weights; its errors
# printed), `bench forward` on the Llama-3-8B shape with FP8 weights f32 / bf16 / f32 / bf16
# (prefill and batched decode, where the cuBLASLt GEMMs run), one profile each, and the CUDA
# engine tests under the bf16 product.
# Carry .carry/cachet.xz, .carry/families-tests.xz, .carry/engine-tests.xz.
#   OUT=... scripts/gpu_fp8_product.sh
source "$(dirname "$0")/gpu_common.sh"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8)
for p in f32 bf16; do
  echo "== FP8-weight test on CUDA, product $p"
  CACHET_FP8_PRODUCT=$p /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_weights 2>&1 \
    | tee "$out/families-fp8-product-$p.txt" | grep -E "^test |test result|panicked|relative error"
done
for round in 1 2; do
  for p in f32 bf16; do
    echo "== round $round, product $p"
    CACHET_FP8_PRODUCT=$p /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,64,256 \
      --decode-context 2048 --prefill 512,2048,4096 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      2>&1 | grep -v INFO > "$out/forward-$p-r$round.txt"
    grep -E "prefill|batch (16|64|256)," "$out/forward-$p-r$round.txt"
  done
done
for p in f32 bf16; do
  CACHET_FP8_PRODUCT=$p /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 256 \
    --decode-context 2048 --prefill 2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile \
    2>&1 | grep -v INFO > "$out/profile-$p.txt"
  echo "== profile, product $p"; grep -E "^\| gemm \|" "$out/profile-$p.txt"
done
echo "== engine tests on CUDA, product bf16"
CACHET_FP8_PRODUCT=bf16 /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "test result|panicked"
