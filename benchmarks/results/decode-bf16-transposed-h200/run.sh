#!/usr/bin/env bash
# 2026-12-04 (session 35), two calls on the H200, one binary (the build of 10f1e9d):
# 1) the prepared bf16 transposed decode and FP8 norm into codes, checked and A/B'd, and served bf16
#    with the transposed kernel:
SERVE=1 TOKENIZER=.carry/smollm2-tokenizer.gguf bash scripts/gpu_decode_attention.sh
# 2) with both on by default (the build of 0f9de73): where the time goes in a batch-256 step at ctx
#    1280, each cache, and Nsight Compute on the bf16 cache's decode kernel (ncu-bf16-dec-b256.txt):
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --decode-contexts 512 --decode-batches 64,256
   --decode-context 1280 --prefill 2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile)
/tmp/cachet bench forward "${m[@]}" --quantization fp8 --kv-cache-dtype fp8 > profile-fp8.txt
/tmp/cachet bench forward "${m[@]}" > profile-bf16.txt
CACHET_DECODE_ATTENTION_BF16=transposed NCU_ONLY=1 CTX=1280 bash scripts/gpu_kv_fp8_profile.sh
