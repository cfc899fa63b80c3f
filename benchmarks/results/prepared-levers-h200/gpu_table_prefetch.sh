#!/usr/bin/env bash
# The FP8 cache's decode warps reading the block table one tile ahead (attention_mma.cu's
# MMA_DEC_TABLE_PREFETCH = 1; prepared in session 35, 0 by default until measured) against the
# default, one binary, kernel sources swapped through CACHET_KERNEL_DIR, through gpu_fp8_decode.sh:
# the attention check with the prefetch (both caches), `bench forward` decode batches 64 / 128 /
# 256 at context 1280 with FP8 weights + FP8 KV (`fp8-new-*` the prefetch, `fp8-old-*` the
# default), alternated over ROUNDS; SERVE=1 adds the served benchmark (FP8 + FP8 KV) with it.
# Carry .carry/cachet.xz (for SERVE=1 a tokenizer: TOKENIZER=.carry/smollm2-tokenizer.gguf).
#   OUT=... [ROUNDS=2] [SERVE=1 TOKENIZER=...] scripts/gpu_table_prefetch.sh
pre=/tmp/kernels-table-prefetch
mkdir -p $pre
sed 's/^#define MMA_DEC_TABLE_PREFETCH 0$/#define MMA_DEC_TABLE_PREFETCH 1/' kernels/src/attention_mma.cu > $pre/attention_mma.cu
grep -q '^#define MMA_DEC_TABLE_PREFETCH 1$' $pre/attention_mma.cu || { echo "the switch was not found"; exit 1; }
NEW_KERNELS=$pre OLD_KERNELS=$PWD/kernels/src CTX=1280 QUANT=fp8 BF16=0 SERVE_RUNS=fp8 \
  exec bash "$(dirname "$0")/gpu_fp8_decode.sh"
