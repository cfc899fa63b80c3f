#!/usr/bin/env bash
# The final build (the session's two kernel experiments reverted): the CUDA MoE and family tests on
# the tiny fixtures, then the seed experiment's ablation (each optimization alone, warm) at the
# rate of this session's first run (75.6 req/s), SmolLM2's tokenizer from its metadata-only GGUF.
source scripts/gpu_common.sh
echo "== CUDA tests"
timeout 240 /tmp/moe-tests --ignored --test-threads 1 2>&1 | tee "$out/moe-cuda.txt" | grep -E "test result|panicked"
timeout 240 /tmp/families-tests --ignored --test-threads 1 --skip qwen25 --skip gemma3_270m 2>&1 | tee "$out/families-cuda.txt" | grep -E "test result|panicked"
echo "== seed TTFT experiment: ablation"
CACHET=/tmp/cachet TOKENIZER=.carry/smollm2-tokenizer.gguf RATE=75.6 ABLATION=1 MODES=warm REQUESTS=1200 TTFT_DIR=ablation OUT=$out \
  timeout 500 bash scripts/gpu_ttft.sh 2>&1 | tail -25
