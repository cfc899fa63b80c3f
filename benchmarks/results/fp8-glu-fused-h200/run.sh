#!/usr/bin/env bash
# FP8 gate|up scales + gated activation in one pass (CACHET_FP8_GLU=fused|separate), one binary:
# the CUDA FP8 tests, bench forward alternated, logits identity on a random model.
rm -f /tmp/cachet /tmp/*-tests
export OUT=$OUT
source scripts/gpu_common.sh
echo "== CUDA FP8 tests (families)"
timeout 60 /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_gate_up fp8_weights_quantized 2>&1 | tee $OUT/families-fp8.txt \
  | grep -E "^test |test result|panicked|differ|relative error|fast vs" | head -40
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for r in 1; do for v in separate fused; do
  echo "== $v round $r"
  CACHET_FP8_GLU=$v timeout 40 /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 64,256 \
    --decode-context 1280 --prefill 2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
    --json-out $OUT/glu-$v-$r.json 2>&1 | grep -v INFO > $OUT/glu-$v-$r.txt
  grep -E "decode batch (64|256)|prefill" $OUT/glu-$v-$r.txt
done; done
echo "== logits, random d128 model, FP8 weights, 300 tokens"
/tmp/cachet model random --config examples/configs/small-gqa-d128.json --out /tmp/m128 --seed 4 2>/dev/null
ids=$(python3 -c "print(','.join(str((i * 37 + 5) % 250) for i in range(300)))")
for v in separate fused; do
  CACHET_FP8_GLU=$v /tmp/cachet logits --model /tmp/m128 --device cuda --quantization fp8 --ids "$ids" --dump /tmp/l-$v.f32 --top 3 > $OUT/logits-$v.json 2>$OUT/logits-$v.err
done
cmp /tmp/l-separate.f32 /tmp/l-fused.f32 && echo "logits identical ($(stat -c %s /tmp/l-fused.f32) bytes)" | tee $OUT/logits-cmp.txt
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
