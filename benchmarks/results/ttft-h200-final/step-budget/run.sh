#!/usr/bin/env bash
# Session 7, call B7: all-on's step token budget (2048 default, 1024, 512) at run 36's rate, warm, plus the baseline.
set -u
OUTD=$1
o=/tmp/o37; mkdir -p $o
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CACHET_CACHE_DIR=/tmp/cachet-cache
save(){ tar czf $OUTD/all37.tgz -C /tmp o37; }
run(){ timeout 100 .carry/cachet bench ttft --model examples/configs/llama3-8b.json --load-format dummy --tokenizer .carry/smollm2.gguf \
  --device cuda --requests 1200 --rate 58.6 --max-tokens 64 --warmup 32 --modes warm "$@" > $o/$name.txt 2>&1; save
  grep -h "^| \(all-on\|baseline\)" $o/$name/report.md | sed "s/^/$name /"; }
name=baseline; run --configs baseline --out $o/$name
for b in 2048 1024 512; do name=all-on-$b; run --configs all-on --out $o/$name --serve-args "--max-num-batched-tokens $b"; done
