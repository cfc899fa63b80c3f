#!/usr/bin/env bash
# 2026-12-04 (session 40), two calls on the H200, one binary (the build of 9c2b2fa).
# Call 1: the review mend's MoE kernels on CUDA (moe-cuda.txt); where batch-16 / 64 steps go
# (bf16 and FP8 + FP8 KV, eager profiles, prof-*.txt); PyTorch's products at the same row counts
# (gemm-peer.txt: torch.matmul bf16 and torch._scaled_mm row-wise FP8, CUDA graphs of 32 layers'
# 128 products, each product's weights a fresh copy).
cd "$(dirname "$0")/../../.." && source scripts/gpu_common.sh
timeout 200 /tmp/moe-tests --ignored --test-threads 1 > $out/moe-cuda.txt 2>&1
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --decode-contexts 512 --decode-context 1280 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile)
for b in 16 64; do
  /tmp/cachet bench forward "${m[@]}" --decode-batches $b --quantization fp8 --kv-cache-dtype fp8 2>&1 | grep -v " INFO " > $out/prof-fp8-b$b.txt
  /tmp/cachet bench forward "${m[@]}" --decode-batches $b 2>&1 | grep -v " INFO " > $out/prof-bf16-b$b.txt
done
python3 scripts/gemm_peer.py --rows 16,32,64,128,256 > $out/gemm-peer.txt 2>&1
# Call 2 (splits/): the waves a decode step's attention splits may fill, W = 2 (the default), 3, 4, 12,
# bf16 and FP8 + FP8 KV, batches 16-256 at ctx 1280, two rounds.
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --decode-contexts 512 --decode-context 1280 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 --decode-batches 16,32,64,128,256)
for r in 1 2; do for w in 2 3 4 12; do for q in bf16 fp8; do
  x=(); [ $q = fp8 ] && x=(--quantization fp8 --kv-cache-dtype fp8)
  CACHET_ATTENTION_SPLIT=64,64,$w /tmp/cachet bench forward "${m[@]}" "${x[@]}" 2>&1 | grep -v " INFO " > $out/splits/split-$q-w$w-r$r.txt
done; done; done
