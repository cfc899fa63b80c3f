#!/usr/bin/env bash
# Session 36, call 3: the served benchmark (FP8 weights + FP8 KV), HEAD's attention kernels then
# the new ones, side by side in one call (the same binary, CACHET_KERNEL_DIR).
for k in old new; do
  CACHET_KERNEL_DIR=$PWD/.carry/k$k TAG=$k RUNS=fp8 TOKENIZER=.carry/smollm2-tokenizer.gguf bash scripts/gpu_serve_bench.sh 2>&1 \
    | grep -E "Output token|Median TTFT|P99 TTFT|Median TPOT|failed|Successful|engine_step"
done
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
