#!/usr/bin/env bash
# Session 36, call 2: the bf16 cache's transposed decode (row sums across lanes once) old vs new at
# batch 256, one round, then the served benchmark (FP8 weights + FP8 KV) with the new kernels.
source scripts/gpu_common.sh
for k in new old; do
  CACHET_KERNEL_DIR=$PWD/.carry/k$k /tmp/cachet bench forward --model examples/configs/llama3-8b.json --load-format dummy \
    --device cuda --decode-contexts 512 --decode-batches 64,256 --decode-context 1280 --prefill 512 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 --json-out "$out/bf16-$k.json" 2>&1 | grep -v INFO | tee "$out/bf16-$k.txt" | grep -E "decode batch (64|256)"
done
CACHET_KERNEL_DIR=$PWD/.carry/knew RUNS=fp8 TOKENIZER=.carry/smollm2-tokenizer.gguf bash scripts/gpu_serve_bench.sh 2>&1 | grep -vE " INFO " | tail -30
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
