#!/usr/bin/env bash
# The token hand-out thread against the engine-thread hand-out: served benchmark, FP8 weights +
# FP8 KV, 512 × 750 / 1,000 tokens, 256 in flight, the two binaries alternated twice; then the
# CUDA engine tests on the new build.
rm -f /tmp/cachet /tmp/*-tests /tmp/cachet-base
source scripts/gpu_common.sh
xz -dc .carry/cachet-base.xz > /tmp/cachet-base && chmod +x /tmp/cachet-base
for round in 1 2; do
  for b in base new; do
    bin=/tmp/cachet-base; [ $b = new ] && bin=/tmp/cachet
    BIN=$bin TAG=$b-$round RUNS=fp8 N=512 T=150 TOKENIZER=.carry/smollm2-tokenizer.gguf bash scripts/gpu_serve_bench.sh 2>&1 | grep -E "==|throughput|Median|P99|Failed|step_gap|step_sec|engine_steps"
  done
done
timeout 200 /tmp/engine-tests --ignored --test-threads 1 > "$out/engine-cuda.txt" 2>&1; echo "engine tests rc=$?"; tail -4 "$out/engine-cuda.txt"
(cd "$out" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
