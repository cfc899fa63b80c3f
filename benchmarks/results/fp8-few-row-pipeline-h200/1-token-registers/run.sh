#!/usr/bin/env bash
# FP8 products of a few rows on our cp.async pipeline (CACHET_FP8_SKINNY=on) against cuBLASLt: the
# CUDA tests, then bench forward (8B shape, FP8 weights + FP8 KV, ctx 1280) alternated over two
# rounds, then the seed TTFT experiment's all on (warm, 78 req/s) with each.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
timeout 150 /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_products_of_a_few_rows 2>&1 | tee $out/families-skinny.txt | grep -E "^test |test result|panicked|ours vs" | tail -30
CACHET_FP8_SKINNY=on timeout 150 /tmp/families-tests --ignored --test-threads 1 tiny_families fp8 2>&1 | tee $out/families-fp8-on.txt | grep -E "^test |test result|panicked"
CACHET_FP8_SKINNY=on timeout 100 /tmp/engine-tests --ignored --test-threads 1 fp8 2>&1 | tee $out/engine-fp8-on.txt | grep -E "^test |test result|panicked"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for r in 1 2; do
  for v in off on; do
    CACHET_FP8_SKINNY=$v timeout 120 /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,32,48,64,128 \
      --decode-context 1280 --prefill 2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile \
      --json-out "$out/fwd-$v-$r.json" 2>&1 | grep -v " INFO " > "$out/fwd-$v-$r.txt"
    echo "== round $r skinny $v"; grep -E "^\| (prefill|decode batch)" "$out/fwd-$v-$r.txt" | awk -F'|' '{print $2 "|" $3 "|" $6}'
  done
done
if [ "${TTFT:-1}" = 1 ]; then
  for v in off on; do
    CACHET_FP8_SKINNY=$v CACHET=/tmp/cachet TOKENIZER=.carry/smollm2-tokenizer.gguf RATE=78 REQUESTS=1200 MODES=warm TTFT_DIR=ttft-$v CONFIGS=all-on,-fp8-weights \
      OUT=$out bash scripts/gpu_ttft.sh > $out/ttft-$v.log 2>&1
    echo "== TTFT skinny $v"; grep -E "^\| (all-on|-fp8)" $out/ttft-$v/report.md
    rm -rf $out/ttft-$v/logs
  done
fi
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
