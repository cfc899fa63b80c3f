#!/usr/bin/env bash
# (1) the CUDA MoE test (every path against the CPU: cuBLAS grouped, a cuBLAS GEMM an expert,
# moe.cu's bf16 and FP8 grouped kernels); (2) bf16 prefill 512 / 4096 with experts of 512+ / 128+
# rows on a cuBLAS GEMM of their own (CACHET_MOE_OWN_GEMM) against all in the grouped GEMM (off).
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
timeout 200 /tmp/moe-tests --ignored --test-threads 1 --nocapture moe_layers_on_cuda 2>&1 | tee $out/moe-cuda.txt | grep -E "^test |test result|panicked|FP8 true, (64|1600) rows" | tail -14
for cfg in mixtral-8x7b qwen3-30b-a3b; do
  for v in off 512 128; do
    CACHET_MOE_OWN_GEMM=$v timeout 120 /tmp/cachet bench forward --model examples/configs/$cfg.json --load-format dummy --device cuda \
      --decode-contexts 512 --decode-batches 1 --decode-context 512 --prefill 512,4096 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --profile 2>&1 | grep -v INFO > $out/prefill-$cfg-own-$v.txt
    echo "== $cfg own=$v"; grep -E "prefill (512|4096) tokens \||↳ moe|moe grouped" $out/prefill-$cfg-own-$v.txt | head -8
  done
done
