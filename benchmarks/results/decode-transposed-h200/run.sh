#!/usr/bin/env bash
# The FP8 cache's transposed decode kernel (S^T = K Q^T, 4 blocks an SM) against the 16-row decode,
# one binary (CACHET_DECODE_ATTENTION=rows|transposed): attention check, no-download engine tests,
# bench forward alternated, a profile of a batch-256 step, served FP8 + FP8 KV.
rm -f /tmp/cachet /tmp/*-tests
export OUT=$OUT
source scripts/gpu_common.sh
xz -dc .carry/et.xz > /tmp/et && chmod +x /tmp/et
echo "== attention check (transposed decode: the default)"
CACHET=/tmp/cachet KV="auto fp8" bash scripts/gpu_attention_check.sh > $OUT/attention-check.txt 2>&1
grep -c OK $OUT/attention-check.txt; grep -E "FAIL|rror" $OUT/attention-check.txt | head -5 || true
echo "== engine tests (no download)"
for t in a_dropped bad_requests kv_events shortest_first the_waiting a_full_queue; do
  timeout 120 /tmp/et --ignored --test-threads 1 $t 2>&1 | grep -E "test result|panicked|FAILED"
done 2>&1 | tee $OUT/engine.txt
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for r in 1 2; do for v in rows transposed; do
  echo "== $v round $r"
  CACHET_DECODE_ATTENTION=$v timeout 100 /tmp/cachet bench forward "${m[@]}" --decode-contexts 512,4096 --decode-batches 64,128,256 \
    --decode-context 1280 --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
    --json-out $OUT/fp8-$v-$r.json 2>&1 | grep -v INFO > $OUT/fp8-$v-$r.txt
  grep -E "decode batch" $OUT/fp8-$v-$r.txt
done; done
echo "== profile, batch 256 ctx 1280 (transposed)"
timeout 100 /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 256 --decode-context 1280 \
  --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile 2>&1 | grep -v INFO > $OUT/profile-b256.txt
grep -A14 "decode batch 256, ctx 1280 (device" $OUT/profile-b256.txt | head -16
RUNS=fp8 TOKENIZER=.carry/smollm2-tokenizer.gguf N=1000 T=150 timeout 200 bash scripts/gpu_serve_bench.sh 2>&1 \
  | grep -E "==|throughput|Median|P99|Failed|step_gap|step_sec"
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
