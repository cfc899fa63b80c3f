#!/usr/bin/env bash
# Session 7, call 5: the TTFT experiment (issue 9) on the final build.
set -u
OUTD=$1
o=/tmp/o35; mkdir -p $o
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CACHET_CACHE_DIR=/tmp/cachet-cache
save(){ tar czf $OUTD/all35.tgz -C /tmp o35; }
OUT=$o CACHET=.carry/cachet TOKENIZER=.carry/smollm2.gguf LOAD=1.0 REQUESTS=1200 timeout 260 bash scripts/gpu_ttft.sh > $o/ttft.txt 2>&1; save
tail -12 $o/ttft.txt
