#!/usr/bin/env bash
# The decode-specialized attention (attention_mma.cu with MMA_DECODE_SPECIALIZED = 1: FP8-cache
# decode blocks run an instantiation of their own, the copies' loops, lookups and fragment paths
# fixed at compile time — 650 instructions of machine code in its tile loop against 833, read
# with cuobjdump, BENCHMARKS.md §12c) against the default sources, one binary, through
# gpu_fp8_decode.sh: the attention check and the CUDA engine tests with it, `bench forward`
# decode batches 64 / 128 / 256 at context 1280 with FP8 weights + FP8 KV (`fp8-new-*` the
# specialized kernel, `fp8-old-*` the default), alternated over ROUNDS; SERVE=1 adds the served
# benchmark (FP8 + FP8 KV) with it.
# Carry .carry/cachet.xz (.carry-e/engine-tests.xz for the engine tests; for SERVE=1 SmolLM2's
# tokenizer, TOKENIZER=.carry/smollm2-tokenizer.gguf).
#   OUT=... [ROUNDS=2] [SERVE=1 TOKENIZER=...] scripts/gpu_attention_specialized.sh
spec=/tmp/kernels-specialized
mkdir -p $spec
sed 's/^#define MMA_DECODE_SPECIALIZED 0$/#define MMA_DECODE_SPECIALIZED 1/' kernels/src/attention_mma.cu > $spec/attention_mma.cu
grep -q '^#define MMA_DECODE_SPECIALIZED 1$' $spec/attention_mma.cu || { echo "the switch was not found"; exit 1; }
NEW_KERNELS=$spec OLD_KERNELS=$PWD/kernels/src CTX=1280 QUANT=fp8 BF16=0 SERVE_RUNS=fp8 \
  exec bash "$(dirname "$0")/gpu_fp8_decode.sh"
