#!/usr/bin/env bash
# The final build (hand-out thread, kv heads first): the served workload, FP8 + FP8 KV then bf16 defaults.
rm -f /tmp/cachet /tmp/*-tests /tmp/cachet-base
source scripts/gpu_common.sh
RUNS="fp8 defaults" N=1000 T=150 TOKENIZER=.carry/smollm2-tokenizer.gguf bash scripts/gpu_serve_bench.sh 2>&1 | grep -E "==|throughput|Median|P99|Failed|step_gap|step_sec|engine_steps"
(cd "$out" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
