#!/usr/bin/env bash
# Decode-specialized attention A/B: check, no-download engine tests with it, bench forward alternated, served FP8.
rm -f /tmp/cachet /tmp/*-tests
export OUT=$OUT
source scripts/gpu_common.sh
xz -dc .carry/et.xz > /tmp/et && chmod +x /tmp/et
spec=/tmp/kernels-specialized; mkdir -p $spec
sed 's/^#define MMA_DECODE_SPECIALIZED 0$/#define MMA_DECODE_SPECIALIZED 1/' kernels/src/attention_mma.cu > $spec/attention_mma.cu
grep -c '^#define MMA_DECODE_SPECIALIZED 1$' $spec/attention_mma.cu
echo "== engine tests (no download) with specialized kernels"
for t in a_dropped bad_requests kv_events shortest_first the_waiting a_full_queue; do
  CACHET_KERNEL_DIR=$spec timeout 120 /tmp/et --ignored --test-threads 1 $t 2>&1 | grep -E "test result|panicked|FAILED"
done 2>&1 | tee $OUT/engine-spec.txt
ROUNDS=2 SERVE=1 TOKENIZER=.carry/smollm2-tokenizer.gguf N=1000 T=150 timeout 420 bash scripts/gpu_attention_specialized.sh 2>&1 | grep -E "==|OK$|FAIL|decode|floor|throughput|Median|P99|Failed|step_gap|step_sec|^[0-9]+$" | head -150
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
