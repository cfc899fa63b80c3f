#!/usr/bin/env bash
# FP8 experts on cuBLAS's path: cuBLASLt's FP8 GEMM an expert (default) against dequantized for
# cuBLAS (CACHET_MOE_FP8=dequant) and moe.cu's FP8 kernel (CACHET_MOE_OWN_GEMM=off), beside bf16,
# prefill 512 / 4096, two rounds; Qwen3-30B-A3B's FP8 experts also forced onto cuBLASLt (own=1).
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
timeout 240 /tmp/moe-tests --ignored --test-threads 1 --nocapture moe_layers_on_cuda 2>&1 | tee $out/moe-cuda.txt | grep -E "^test |test result|panicked|FP8 true, 1600 rows" | tail -20
fwd() { timeout 150 /tmp/cachet bench forward --load-format dummy --device cuda --cached-prefix none --sampling-batches 1 \
  --decode-contexts 512 --decode-batches 1 --decode-context 512 --prefill 512,4096 --graph-batches 1 "$@" 2>&1 | grep -v INFO; }
show() { echo "== $1: $(grep -E "prefill (512|4096) tokens \|" $2 | awk -F'|' '{printf "%s/", $3}')"; }
for r in 1 2; do
  p=""; [ $r = 1 ] && p=--profile
  fwd --model examples/configs/mixtral-8x7b.json $p > $out/mixtral-bf16-r$r.txt; show "r$r mixtral bf16" $out/mixtral-bf16-r$r.txt
  fwd --model examples/configs/mixtral-8x7b.json --quantization fp8 $p > $out/mixtral-fp8-lt-r$r.txt; show "r$r mixtral FP8 cuBLASLt" $out/mixtral-fp8-lt-r$r.txt
  CACHET_MOE_FP8=dequant fwd --model examples/configs/mixtral-8x7b.json --quantization fp8 $p > $out/mixtral-fp8-dequant-r$r.txt; show "r$r mixtral FP8 dequant" $out/mixtral-fp8-dequant-r$r.txt
  CACHET_MOE_OWN_GEMM=off fwd --model examples/configs/mixtral-8x7b.json --quantization fp8 $p > $out/mixtral-fp8-moecu-r$r.txt; show "r$r mixtral FP8 moe.cu" $out/mixtral-fp8-moecu-r$r.txt
  fwd --model examples/configs/qwen3-30b-a3b.json --quantization fp8 $p > $out/qwen-fp8-moecu-r$r.txt; show "r$r qwen FP8 moe.cu (default)" $out/qwen-fp8-moecu-r$r.txt
  CACHET_MOE_OWN_GEMM=1 fwd --model examples/configs/qwen3-30b-a3b.json --quantization fp8 $p > $out/qwen-fp8-lt-r$r.txt; show "r$r qwen FP8 cuBLASLt (own=1)" $out/qwen-fp8-lt-r$r.txt
done
grep -E "moe grouped gemm|↳ moe|↳ fp8" $out/mixtral-fp8-lt-r1.txt | head -8
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
