#!/usr/bin/env bash
# Session 7, call B4: the committed GPU script on the final build (fused rope + prefill one wave): the final table.
set -u
OUTD=$1
o=/tmp/o34; mkdir -p $o
save(){ tar czf $OUTD/all34.tgz -C /tmp o34; }
OUT=$o FIDELITY=1 PEER=0 SIMT=0 SPEC=1 KVFP8=0 GEMVAB=0 ATTN=1 NCU=1 FP8FORWARD=1 timeout 540 bash scripts/gpu_run.sh > $o/gpu_run.log 2>&1
save
grep -h "test result" $o/*-cuda.txt; grep -c OK $o/attention-check.txt
grep -h "decode batch\|prefill\|TTFT" $o/bench.txt | head -20
grep -h "copy-heavy\|free chat" $o/spec.txt | head -8
