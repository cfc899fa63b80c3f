#!/usr/bin/env bash
# Session 7, call 1: attention split granularity (CACHET_ATTENTION_SPLIT=keys,n,waves,step) vs the default, batch 1.
set -u
OUTD=$1
o=/tmp/o30; mkdir -p $o
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CACHET_CACHE_DIR=/tmp/cachet-cache
B=.carry/cachet; M=examples/configs/llama3-8b.json
save(){ tar czf $OUTD/all30.tgz -C /tmp o30; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $o/gpu.txt 2>&1
for rep in 1 2 3; do for v in default 64,64,1,16 32,128,2,16 16,256,3,16; do
  if [ $v = default ]; then unset CACHET_ATTENTION_SPLIT; else export CACHET_ATTENTION_SPLIT=$v; fi
  s=$(date +%s)
  timeout 45 $B bench forward --model $M --load-format dummy --device cuda --decode-batches 1 \
    --decode-contexts 512,4096 --prefill 512 --cached-prefix none --graph-batches 1 > $o/dec-$v-$rep.txt 2>&1
  echo "$v $rep $(( $(date +%s) - s )) s" >> $o/times.txt
done; save; done
unset CACHET_ATTENTION_SPLIT
for f in $o/dec-*; do echo "$(basename $f) $(grep -h 'decode batch 1, ctx' $f | awk -F'|' '{printf "%s %s", $3, $6}')"; done | tee $o/summary.txt
save
