#!/usr/bin/env bash
# Session 7, call B8: the fused RoPE for the FP8 cache too — correctness on CUDA, then side by side (CACHET_ROPE=separate).
set -u
OUTD=$1
o=/tmp/o38; mkdir -p $o
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CACHET_CACHE_DIR=/tmp/cachet-cache
B=.carry/cachet; G=.carry/smollm2.gguf; M=examples/configs/llama3-8b.json
save(){ tar czf $OUTD/all38.tgz -C /tmp o38; }
mkdir -p $CACHET_CACHE_DIR/models/smollm2 && cp $G $CACHET_CACHE_DIR/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
{ CACHET_TEST_DEVICE=cuda timeout 80 .carry/kv_fp8-tests --test-threads 1 --skip e4m3_codec_matches_ml_dtypes 2>&1
  CACHET_ATTENTION=simt CACHET_TEST_DEVICE=cuda timeout 80 .carry/kv_fp8-tests --test-threads 1 --skip e4m3_codec_matches_ml_dtypes 2>&1; } > $o/kv-fp8-cuda.txt; save
CACHET_TEST_DEVICE=cuda timeout 90 .carry/engine-tests --test-threads 1 > $o/engine-cuda.txt 2>&1; save
[ -x .carry/speculative-tests ] && CACHET_TEST_DEVICE=cuda timeout 60 .carry/speculative-tests --test-threads 1 > $o/speculative-cuda.txt 2>&1; save
grep -h "test result\|FAILED\|panicked" $o/*-cuda.txt | tee $o/summary.txt
CACHET=$B KV="auto fp8" timeout 150 bash scripts/gpu_attention_check.sh > $o/attention-check.txt 2>&1; save
echo "attention check: $(grep -c OK $o/attention-check.txt) OK, $(grep -c FAIL $o/attention-check.txt) FAIL" | tee -a $o/summary.txt
for rep in 1 2 3; do for v in fused separate; do for dt in fp8 auto; do
  if [ $v = separate ]; then export CACHET_ROPE=separate; else unset CACHET_ROPE; fi
  timeout 45 $B bench forward --model $M --load-format dummy --device cuda --kv-cache-dtype $dt --decode-batches 1 \
    --decode-contexts 512,4096 --prefill 512 --cached-prefix none --graph-batches 1 > $o/dec-$dt-$v-$rep.txt 2>&1
done; done; done; unset CACHET_ROPE; save
for f in $o/dec-*; do echo "$(basename $f) $(grep -h 'decode batch 1, ctx\|prefill' $f | awk -F'|' '{printf "%s %s", $3, $6}')"; done | tee -a $o/summary.txt
for v in fused separate; do
  if [ $v = separate ]; then export CACHET_ROPE=separate; else unset CACHET_ROPE; fi
  timeout 60 $B bench forward --model $M --load-format dummy --device cuda --kv-cache-dtype fp8 --decode-batches 64,256 \
    --decode-contexts 4096 --decode-context 2048 --prefill 512 --cached-prefix none --graph-batches 1 > $o/bdec-fp8-$v.txt 2>&1
done; unset CACHET_ROPE; save
for v in fused separate; do echo "== fp8 $v"; grep -h "decode batch" $o/bdec-fp8-$v.txt; done | tee -a $o/summary.txt
