#!/usr/bin/env bash
# Session 7, call B1: RoPE + K/V write fused into the tensor-core attention (CACHET_ROPE=separate: the rope_kv launch) — correctness on CUDA, then side by side.
set -u
OUTD=$1
o=/tmp/o31; mkdir -p $o
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CACHET_CACHE_DIR=/tmp/cachet-cache
B=.carry/cachet; G=.carry/smollm2.gguf; M=examples/configs/llama3-8b.json
save(){ tar czf $OUTD/all31.tgz -C /tmp o31; }
mkdir -p $CACHET_CACHE_DIR/models/smollm2 && cp $G $CACHET_CACHE_DIR/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
for rep in 1 2 3; do for v in fused separate; do
  if [ $v = separate ]; then export CACHET_ROPE=separate; else unset CACHET_ROPE; fi
  timeout 45 $B bench forward --model $M --load-format dummy --device cuda --decode-batches 1 \
    --decode-contexts 512,4096 --prefill 512 --cached-prefix none --graph-batches 1 > $o/dec-$v-$rep.txt 2>&1
done; done; unset CACHET_ROPE
for f in $o/dec-*; do echo "$(basename $f) $(grep -h 'decode batch 1, ctx' $f | awk -F'|' '{printf "%s %s", $3, $6}')"; done | tee $o/summary.txt
save
CACHET_TEST_DEVICE=cuda timeout 100 .carry/engine-tests --test-threads 1 > $o/engine-cuda.txt 2>&1; save
CACHET_TEST_DEVICE=cuda timeout 80 .carry/speculative-tests --test-threads 1 > $o/speculative-cuda.txt 2>&1; save
grep -h "test result\|FAILED\|panicked" $o/*-cuda.txt | tee -a $o/summary.txt
CACHET=$B KV="auto fp8" timeout 150 bash scripts/gpu_attention_check.sh > $o/attention-check.txt 2>&1; save
echo "attention check: $(grep -c OK $o/attention-check.txt) OK, $(grep -c FAIL $o/attention-check.txt) FAIL" | tee -a $o/summary.txt
for v in fused separate; do
  if [ $v = separate ]; then export CACHET_ROPE=separate; else unset CACHET_ROPE; fi
  timeout 60 $B bench forward --model $M --load-format dummy --device cuda --decode-batches 2,4,16,64 \
    --decode-contexts 4096 --decode-context 4096 --prefill 512 --cached-prefix none --graph-batches 1 > $o/bdec-$v.txt 2>&1
  timeout 100 $B bench spec --model $G --device cuda --max-tokens 96 --high-batch 48 --json-out $o/spec-$v.json 2>&1 | grep -v INFO > $o/spec-$v.txt
done; unset CACHET_ROPE; save
for v in fused separate; do echo "== $v"; grep -h "decode batch" $o/bdec-$v.txt; cat $o/spec-$v.txt | tail -12; done | tee -a $o/summary.txt
save
