#!/usr/bin/env bash
# Session 7, call 3: two-wave splits for decode-like launches only (new) vs everywhere (old: the fused-rope build).
set -u
OUTD=$1
o=/tmp/o33; mkdir -p $o
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CACHET_CACHE_DIR=/tmp/cachet-cache
M=examples/configs/llama3-8b.json
save(){ tar czf $OUTD/all33.tgz -C /tmp o33; }
for rep in 1 2 3; do for v in new old; do
  timeout 60 .carry/cachet-$v bench forward --model $M --load-format dummy --device cuda --decode-batches 1 \
    --decode-contexts 512,4096 --prefill 128,512,2048 --cached-prefix none --graph-batches 1 > $o/dec-$v-$rep.txt 2>&1
done; save; done
for f in $o/dec-*; do echo "$(basename $f) $(grep -h 'decode batch 1, ctx\|prefill' $f | awk -F'|' '{printf "%s %s", $3, $6}')"; done | tee $o/summary.txt
CACHET=.carry/cachet-new KV="auto fp8" timeout 150 bash scripts/gpu_attention_check.sh > $o/attention-check.txt 2>&1; save
echo "attention check: $(grep -c OK $o/attention-check.txt) OK, $(grep -c FAIL $o/attention-check.txt) FAIL" | tee -a $o/summary.txt
timeout 60 .carry/cachet-new bench forward --model $M --load-format dummy --device cuda --decode-batches 2,4,16,64 \
    --decode-contexts 4096 --decode-context 4096 --prefill 8192 --cached-prefix 8192:6144 --graph-batches 1 > $o/bdec-new.txt 2>&1; save
grep -h "decode batch\|prefill\|TTFT" $o/bdec-new.txt | tee -a $o/summary.txt
