#!/usr/bin/env bash
# The MoE router of a decode step through the f32-output GEMV against cuBLAS, side by side in one
# call (issue 24): the CUDA MoE tests (the layer against the CPU reference token by token, both
# expert paths), then `bench forward` on the Qwen3-30B-A3B shape (dummy bf16 weights), decode
# batch 1 and 2 at contexts 512 and 4096, with CACHET_MOE_ROUTER=gemm (cuBLAS, as before) and the
# default (GEMV), each with its per-kernel profile. Carry .carry/{cachet,moe-tests}.xz.
#   OUT=... [MODEL=qwen3-30b-a3b] scripts/gpu_moe_router.sh
source "$(dirname "$0")/gpu_common.sh"
if [ -x /tmp/moe-tests ]; then
  echo "== MoE tests on CUDA"
  /tmp/moe-tests --ignored --test-threads 1 2>&1 | tee "$out/moe-cuda.txt" | grep -E "^test |test result|panicked"
fi
model=${MODEL:-qwen3-30b-a3b}
for router in gemm gemv; do
  echo "== bench forward, $model, router $router"
  CACHET_MOE_ROUTER=$router /tmp/cachet bench forward --model examples/configs/$model.json --load-format dummy \
    --device cuda --decode-contexts 512,4096 --decode-batches 2 --decode-context 2048 --prefill 512 \
    --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile \
    --json-out "$out/forward-$model-router-$router.json" 2>&1 | grep -v " INFO " \
    | tee "$out/forward-$model-router-$router.txt" | grep -E "^\| (decode|prefill)|moe router"
done
