#!/usr/bin/env bash
# What the layer structure alone costs at batch 1: each model beside its "thin" twin (the same
# layers, heads, head size, experts and routing, a 256-wide hidden state: next to no weight bytes),
# `bench forward` with CUDA graphs, decode batch 1 at ctx 512 and 4096, one binary, one call.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
run() {  # tag, config, extra flags
  local tag=$1 cfg=$2; shift 2
  /tmp/cachet bench forward --model examples/configs/$cfg.json --load-format dummy --device cuda "$@" \
    --decode-contexts 512,4096 --decode-batches 1 --decode-context 512 --prefill 512 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 --json-out "$out/$tag.json" 2>&1 | grep -v INFO > "$out/$tag.txt"
  echo "== $tag"; grep -E "^model:|copy|decode batch 1," "$out/$tag.txt"
}
for r in 1 2; do
  run qwen-thin-$r qwen3-30b-a3b-thin
  [ $r = 1 ] && run qwen-full-$r qwen3-30b-a3b
  run llama-thin-fp8-$r llama3-8b-thin --quantization fp8
  [ $r = 1 ] && run llama-full-fp8-$r llama3-8b --quantization fp8
  run llama-thin-bf16-$r llama3-8b-thin
  [ $r = 1 ] && run llama-full-bf16-$r llama3-8b
done
date
