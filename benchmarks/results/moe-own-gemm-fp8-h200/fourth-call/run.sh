#!/usr/bin/env bash
# The CUDA MoE test (every path; the cuBLASLt FP8 path held to its own bar), then the FP8-expert
# table on the default build: decode batch 1 / 16 / 64 / 256 and prefill 512 / 4096 with
# --quantization fp8 (Mixtral: batches to 64, as bf16's table), beside bf16 in the same call.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
timeout 240 /tmp/moe-tests --ignored --test-threads 1 --nocapture moe_layers_on_cuda 2>&1 | tee $out/moe-cuda.txt | grep -E "^test |test result|panicked|cuBLASLt" | tail -24
for cfg in qwen3-30b-a3b mixtral-8x7b; do
  b=16,64,256; [ $cfg = mixtral-8x7b ] && b=16,64
  for q in none fp8; do
    timeout 200 /tmp/cachet bench forward --model examples/configs/$cfg.json --load-format dummy --device cuda --quantization $q \
      --decode-contexts 512,4096 --decode-batches $b --decode-context 2048 --prefill 512,4096 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 2>&1 | grep -v INFO > $out/table-$cfg-$q.txt
    echo "== $cfg weights $q"; grep -E "^\| (decode batch|prefill)" $out/table-$cfg-$q.txt | awk -F'|' '{print $2 "|" $3 "|" $4 "|" $6}'
  done
done
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
