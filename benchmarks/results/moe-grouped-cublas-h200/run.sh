#!/usr/bin/env bash
# MoE grouped products: moe.cu's sorted grouped kernel against cuBLAS's grouped GEMM
# (CACHET_MOE_GROUPED=cublas), one binary: the CUDA MoE test (every path against the CPU), then
# prefill 512 / 4096 on the Qwen3-30B-A3B and Mixtral-8x7B shapes with --profile.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
/tmp/moe-tests --ignored --test-threads 1 --nocapture moe_layers_on_cuda 2>&1 | tee $out/moe-cuda.txt | grep -E "^test |test result|panicked|cuBLAS" | tail -14
for cfg in qwen3-30b-a3b mixtral-8x7b; do
  for v in ours cublas; do
    CACHET_MOE_GROUPED=$v /tmp/cachet bench forward --model examples/configs/$cfg.json --load-format dummy --device cuda \
      --decode-contexts 512 --decode-batches 1 --decode-context 512 --prefill 512,4096 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --profile 2>&1 | grep -v INFO > $out/prefill-$cfg-$v.txt
    echo "== $cfg $v"; grep -E "prefill (512|4096) tokens|↳ moe|moe grouped" $out/prefill-$cfg-$v.txt | head -12
  done
done
