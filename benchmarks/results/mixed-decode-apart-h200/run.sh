#!/usr/bin/env bash
# Call 3 (2026-12-04 session 35): a mixed step's decode tiles in a launch of their own
# (CACHET_MIXED_DECODE=apart|together): the CUDA-vs-CPU mixed-step test, then served FP8 + FP8 KV
# together / apart (one binary), and served bf16 defaults (apart).
rm -f /tmp/cachet /tmp/*-tests; rm -rf "${OUT:?}"/*
export OUT=$OUT
source scripts/gpu_common.sh
echo "== engine test: mixed steps"
timeout 200 /tmp/engine-tests --ignored --test-threads 1 --nocapture mixed_steps 2>&1 | tee $OUT/engine-mixed.txt \
  | grep -E "worst|test result|panicked|rows apart|rel err" | head -20
export TOKENIZER=.carry/smollm2-tokenizer.gguf N=1000 T=150
for v in together apart; do
  CACHET_MIXED_DECODE=$v RUNS=fp8 TAG=$v timeout 230 bash scripts/gpu_serve_bench.sh 2>&1 \
    | grep -E "==|Output token throughput|Median TTFT|P99 TTFT|Median TPOT|Failed|step_gap|step_sec"
done
RUNS=defaults TAG=apart timeout 230 bash scripts/gpu_serve_bench.sh 2>&1 \
  | grep -E "==|Output token throughput|Median TTFT|P99 TTFT|Median TPOT|Failed|step_gap|step_sec"
for f in $OUT/bench-serve-*.json; do python3 -c "
import json; d=json.load(open('$f'))
for r in d.get('requests',[]): r.pop('itl_ms',None)
json.dump(d,open('$f','w'))"; done
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
# Then, on the same warm machine, the seed TTFT experiment (ttft-first-apart/), all on warm at the
# same rate with each setting (ttft-warm-{together,apart}/):
CACHET=/tmp/cachet-x TOKENIZER=.carry/smollm2-tokenizer.gguf LOAD=1.0 REQUESTS=1200 bash scripts/gpu_ttft.sh
for v in together apart; do
  CACHET_MIXED_DECODE=$v CACHET=/tmp/cachet-x TOKENIZER=.carry/smollm2-tokenizer.gguf RATE=81.5 REQUESTS=1200 \
    CONFIGS=all-on MODES=warm TTFT_DIR=ttft-$v bash scripts/gpu_ttft.sh
done
# Then the full experiment once more with CACHET_MIXED_DECODE=together: ../ttft-h200-2026-12-04b/.
# The binary is the build of 3688253 (reverted after these runs).
