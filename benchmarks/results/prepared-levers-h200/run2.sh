#!/usr/bin/env bash
# Next session's second call: the batch-1 GEMVs prefetching their own rows before the dependency
# wait (GEMV_EARLY_PREFETCH, two rounds), then Nsight Compute with the source page on the FP8
# cache's decode attention (3.1 TB/s against bf16's 3.9: where its stalls are). Serve whatever
# paid in a third call (SERVE=1 in the scripts).
bash scripts/gpu_gemv_early.sh 2>&1 | tail -30
TEST=0 NCU=1 SOURCE=1 ROUNDS=0 bash scripts/gpu_fp8_glu_codes.sh 2>&1 | grep -vE " INFO " | tail -20
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
