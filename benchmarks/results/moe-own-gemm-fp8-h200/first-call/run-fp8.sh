#!/usr/bin/env bash
# FP8 experts (--quantization fp8): moe.cu's FP8 grouped kernel from 8 rows (default) against
# the expert GEMVs at every batch (CACHET_MOE_GEMM=off, the path FP8 experts took before).
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
for cfg in qwen3-30b-a3b mixtral-8x7b; do
  for v in default off; do
    if [ $v = off ]; then pf=512; else pf=512,4096; fi
    CACHET_MOE_GEMM=$([ $v = off ] && echo off || echo 8) timeout 200 /tmp/cachet bench forward --model examples/configs/$cfg.json --load-format dummy --device cuda \
      --quantization fp8 --decode-contexts 512 --decode-batches 16,64 --decode-context 2048 --prefill $pf --cached-prefix none \
      --sampling-batches 1 --graph-batches 1,16 2>&1 | grep -v INFO > $out/fp8-$cfg-$v.txt
    echo "== $cfg FP8 experts, grouped=$v"; grep -E "^\| (decode|prefill)" $out/fp8-$cfg-$v.txt | head -8
  done
done
