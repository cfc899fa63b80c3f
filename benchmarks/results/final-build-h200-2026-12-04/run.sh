#!/usr/bin/env bash
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
date
CACHET=/tmp/cachet TOKENIZER=.carry/smollm2-tokenizer.gguf LOAD=1.0 REQUESTS=1200 TTFT_DIR=ttft bash scripts/gpu_ttft.sh > $out/ttft-log.txt 2>&1
tail -12 $out/ttft/report.md
date
OUT=$out RUNS=fp8 TOKENIZER=.carry/smollm2-tokenizer.gguf T=200 bash scripts/gpu_serve_bench.sh 2>&1 | grep -vE "^\s*$" | tail -30
date
