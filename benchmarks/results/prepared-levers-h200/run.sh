#!/usr/bin/env bash
# Next session's first call (prepared 2026-12-04, session 35, the build of the closing commit):
# two prepared FP8 levers, each checked and A/B'd — the dense MLP's activation into the down
# product's codes (CACHET_FP8_GLU_CODES, its bit-for-bit CUDA test) and the decode attention's
# block table read a tile ahead (MMA_DEC_TABLE_PREFETCH through CACHET_KERNEL_DIR, with the
# attention check). The second call is .carry/run2.sh.
rm -f /tmp/cachet /tmp/*-tests
bash scripts/gpu_fp8_glu_codes.sh 2>&1 | grep -vE " INFO " | tail -40
bash scripts/gpu_table_prefetch.sh 2>&1 | grep -vE " INFO " | tail -40
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
