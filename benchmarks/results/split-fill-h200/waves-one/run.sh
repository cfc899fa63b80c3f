#!/usr/bin/env bash
# 2026-12-04 (session 40), two calls, one binary (the build of d7af4c6): one wave of attention splits
# (CACHET_ATTENTION_SPLIT=64,64,1) against the default two, two rounds, bf16 and FP8 + FP8 KV;
# batches 4-64 at ctx 1280 (split-*-r?.txt), then batches 2-32 at ctx 4096 (with batch 1 at ctx
# 4096 as the first row; split-*-ctx4096.txt).
cd "$(dirname "$0")/../../../.." && source scripts/gpu_common.sh
for ctx in 1280 4096; do
  b=4,8,16,32,64; c1=512; [ $ctx = 4096 ] && b=2,4,8,16,32 && c1=4096
  m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --decode-contexts $c1 --decode-context $ctx --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 --decode-batches $b)
  for r in 1 2; do for w in 2 1; do for q in fp8 bf16; do
    x=(); [ $q = fp8 ] && x=(--quantization fp8 --kv-cache-dtype fp8)
    CACHET_ATTENTION_SPLIT=64,64,$w /tmp/cachet bench forward "${m[@]}" "${x[@]}" 2>&1 | grep -v " INFO " > $out/split-$q-w$w-r$r.txt
  done; done; done
done
