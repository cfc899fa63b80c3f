#!/usr/bin/env bash
# The MoE router of a decode step, its variants side by side in one call (issue 24): the CUDA MoE
# tests (the layer against the CPU reference token by token on every path; the fused router
# against the two-launch one), then `bench forward` on the Qwen3-30B-A3B shape (dummy bf16
# weights), decode batch 1 at contexts 512 and 4096 and batch 2, for each CACHET_MOE_ROUTER in
# ROUTERS (gemv: the GEMV, then the routing kernel, the default; fused: logits GEMV and routing
# in one launch; gemm: cuBLAS, then the routing kernel) and each CACHET_PDL in PDLS, ROUNDS
# rounds taken in turn. Carry .carry/{cachet,moe-tests}.xz.
#   OUT=... [MODEL=qwen3-30b-a3b] [ROUTERS="gemv fused"] [PDLS="early"] [ROUNDS=1] scripts/gpu_moe_router.sh
source "$(dirname "$0")/gpu_common.sh"
if [ -x /tmp/moe-tests ]; then
  echo "== MoE tests on CUDA"
  /tmp/moe-tests --ignored --test-threads 1 2>&1 | tee "$out/moe-cuda.txt" | grep -E "^test |test result|panicked"
fi
model=${MODEL:-qwen3-30b-a3b}
for r in $(seq 1 "${ROUNDS:-1}"); do
  for router in ${ROUTERS:-gemv fused}; do
    for pdl in ${PDLS:-early}; do
      name=$model-router-$router-pdl-$pdl-r$r
      echo "== bench forward, $model, router $router, PDL $pdl, round $r"
      CACHET_MOE_ROUTER=$router CACHET_PDL=$pdl timeout 120 /tmp/cachet bench forward \
        --model examples/configs/$model.json --load-format dummy --device cuda --decode-contexts 512,4096 \
        --decode-batches 2 --decode-context 2048 --prefill 512 --cached-prefix none --sampling-batches 1 \
        --graph-batches 1 --json-out "$out/forward-$name.json" 2>&1 | grep -v " INFO " \
        | tee "$out/forward-$name.txt" | grep -E "^\| decode batch|^CUDA graphs"
    done
  done
done
