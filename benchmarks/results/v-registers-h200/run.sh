#!/usr/bin/env bash
# V fragments from registers (decode-specialized FP8 attention) vs the decode-specialized kernel measured first:
# attention check, no-download engine tests, bench forward alternated, served FP8 + FP8 KV.
rm -f /tmp/cachet /tmp/*-tests
export OUT=$OUT
source scripts/gpu_common.sh
xz -dc .carry/et.xz > /tmp/et && chmod +x /tmp/et
new=$PWD/.carry/knew; old=$PWD/.carry/kold
echo "== engine tests (no download) with the new kernels"
for t in a_dropped bad_requests kv_events shortest_first the_waiting a_full_queue; do
  CACHET_KERNEL_DIR=$new timeout 120 /tmp/et --ignored --test-threads 1 $t 2>&1 | grep -E "test result|panicked|FAILED"
done 2>&1 | tee $OUT/engine-new.txt
NEW_KERNELS=$new OLD_KERNELS=$old CTX=1280 QUANT=fp8 BF16=0 SERVE_RUNS=fp8 ROUNDS=2 SERVE=1 \
  TOKENIZER=.carry/smollm2-tokenizer.gguf N=1000 T=150 timeout 440 bash scripts/gpu_fp8_decode.sh 2>&1 \
  | grep -E "==|OK$|FAIL|decode batch|throughput|Median|P99|Failed|step_gap|step_sec|^[0-9]+$" | head -150
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
