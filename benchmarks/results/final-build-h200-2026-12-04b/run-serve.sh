#!/usr/bin/env bash
# Session 40, call 4: the final build served (the issue's workload: 1,000 x 750 / 1,000 tokens,
# 256 in flight), bf16 defaults then FP8 weights + FP8 KV.
cd "$(dirname "$0")/.." && rm -f /tmp/cachet && source scripts/gpu_common.sh
OUT=$out/serve RUNS="fp8 defaults" TOKENIZER=.carry/smollm2-tokenizer.gguf T=280 bash scripts/gpu_serve_bench.sh 2>&1 | grep -E "Output token throughput|Failed|Successful|P99 TTFT|Median TPOT|step limits|^=="
cat $out/serve/steps-*.txt
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
