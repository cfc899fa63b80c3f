#!/usr/bin/env bash
# Programmatic dependent launch of the decode GEMVs (CACHET_PDL, issue 22's batch-1 decode): the
# engine tests on CUDA with it on (GEMV outputs against the CPU reference, graphs against eager
# steps), then the 8B shape's decode steps at batch 1–4 with bf16 and FP8 weights, PDL off and on
# alternated over ROUNDS, one binary. Carry .carry/cachet.xz and .carry/engine-tests.xz; SmolLM2's
# GGUF as /tmp/smollm2.gguf (earlier carries).
#   OUT=... [ROUNDS=2] scripts/gpu_pdl.sh
source "$(dirname "$0")/gpu_common.sh"
echo "== engine tests on CUDA, CACHET_PDL=on"
CACHET_PDL=on /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda-pdl.txt" | grep -E "test result|FAILED|panicked"
for r in $(seq 1 ${ROUNDS:-2}); do
  for q in none fp8; do
    for pdl in off on; do
      echo "== round $r, weights $q, PDL $pdl"
      CACHET_PDL=$pdl /tmp/cachet bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
        --quantization $q --decode-batches 1,4 --decode-contexts 512 --decode-context 512 --prefill 512 \
        --cached-prefix none --sampling-batches 1 --graph-batches 1 --json-out "$out/forward-$q-pdl-$pdl-$r.json" 2>&1 \
        | grep -v INFO > "$out/forward-$q-pdl-$pdl-$r.txt"
      grep -E "^\| decode batch (1|4), ctx 512 \| [0-9.]+ ms/(token|step)" "$out/forward-$q-pdl-$pdl-$r.txt"
    done
  done
done
