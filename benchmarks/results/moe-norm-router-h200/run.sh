#!/usr/bin/env bash
# This session's H200 call: MoE tests (incl. the norm fused into the router's GEMV), families
# tests, Qwen3-30B-A3B / 8B forward with CACHET_MOE_NORM=fused|separate alternated, then the
# seed TTFT experiment with SmolLM2's tokenizer (metadata-only GGUF).
source scripts/gpu_common.sh
echo "== CUDA tests"
timeout 240 /tmp/moe-tests --ignored --test-threads 1 2>&1 | tee "$out/moe-cuda.txt" | grep -E "^test |test result|panicked"
timeout 240 /tmp/families-tests --ignored --test-threads 1 --skip qwen25 --skip gemma3_270m 2>&1 | tee "$out/families-cuda.txt" | grep -E "test result|panicked"
for round in 1 2; do
  for v in fused separate; do
    f="$out/forward-qwen3-moe-$v-r$round"
    CACHET_MOE_NORM=$v timeout 120 /tmp/cachet bench forward --model examples/configs/qwen3-30b-a3b.json --load-format dummy --device cuda \
      --decode-contexts 512,4096 --decode-batches 2,4 --decode-context 512 --prefill 512 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --json-out "$f.json" 2>&1 | grep -v " INFO " > "$f.txt"
    echo "qwen3-moe MOE_NORM=$v r$round: $(grep -E '^\| decode batch' "$f.txt" | awk -F'|' '{printf "%s %s %s %s;", $2, $3, $5, $6}')"
  done
done | tee "$out/summary.txt"
echo "== seed TTFT experiment"
CACHET=/tmp/cachet TOKENIZER=.carry/smollm2-tokenizer.gguf LOAD=1.0 REQUESTS=1200 OUT=$out timeout 420 bash scripts/gpu_ttft.sh 2>&1 | tail -30
