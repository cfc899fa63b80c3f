#!/usr/bin/env bash
# Session 36, call 1: the FP8 decode attention with fewer instructions a tile (the high half of a
# code word converted without a shift, the warp's refill copies addressed from per-lane constants,
# the transposed kernels' row sums added across lanes once at the end) against HEAD's, same binary
# (session 35's build; only attention_mma.cu swapped through CACHET_KERNEL_DIR): the attention
# check (bf16 and FP8 caches) and the CUDA engine tests with the new kernels, then decode batches
# 64 / 128 / 256 at ctx 1280 with FP8 weights + FP8 KV, alternated twice.
NEW_KERNELS=$PWD/.carry/knew OLD_KERNELS=$PWD/.carry/kold CTX=1280 QUANT=fp8 BF16=0 ROUNDS=2 \
  bash scripts/gpu_fp8_decode.sh 2>&1 | grep -vE " INFO " | tail -60
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
