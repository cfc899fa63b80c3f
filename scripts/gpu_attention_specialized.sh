#!/usr/bin/env bash
# The decode-specialized attention (attention_mma.cu's MMA_DECODE_SPECIALIZED = 1, the default:
# FP8-cache decode blocks run an instantiation of their own, the copies' loops, lookups and
# fragment paths fixed at compile time — 650 instructions of machine code in its tile loop against
# 833, BENCHMARKS.md §12c) against the one body (the switch at 0), one binary, through
# gpu_fp8_decode.sh: the attention check and the CUDA engine tests with the default, `bench
# forward` decode batches 64 / 128 / 256 at context 1280 with FP8 weights + FP8 KV (`fp8-new-*`
# the specialized kernel, `fp8-old-*` the one body), alternated over ROUNDS; SERVE=1 adds the
# served benchmark (FP8 + FP8 KV) with the default.
# Carry .carry/cachet.xz (.carry-e/engine-tests.xz for the engine tests; for SERVE=1 SmolLM2's
# tokenizer, TOKENIZER=.carry/smollm2-tokenizer.gguf).
#   OUT=... [ROUNDS=2] [SERVE=1 TOKENIZER=...] scripts/gpu_attention_specialized.sh
one=/tmp/kernels-one-body
mkdir -p $one
sed 's/^#define MMA_DECODE_SPECIALIZED 1$/#define MMA_DECODE_SPECIALIZED 0/' kernels/src/attention_mma.cu > $one/attention_mma.cu
grep -q '^#define MMA_DECODE_SPECIALIZED 0$' $one/attention_mma.cu || { echo "the switch was not found"; exit 1; }
NEW_KERNELS=$PWD/kernels/src OLD_KERNELS=$one CTX=1280 QUANT=fp8 BF16=0 SERVE_RUNS=fp8 \
  exec bash "$(dirname "$0")/gpu_fp8_decode.sh"
