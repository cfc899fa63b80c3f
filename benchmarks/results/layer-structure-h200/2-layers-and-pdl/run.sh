#!/usr/bin/env bash
# The thin twins' step against their layer count (48 / 32 vs 8 layers: the per-layer slope and the
# step's constant) and with programmatic launches off, one binary, one call.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
run() {  # tag, config path, extra flags
  local tag=$1 cfg=$2; shift 2
  /tmp/cachet bench forward --model $cfg --load-format dummy --device cuda "$@" \
    --decode-contexts 512 --decode-batches 1 --decode-context 512 --prefill 512 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 2>&1 | grep -v INFO > "$out/$tag.txt"
  echo "== $tag: $(grep -E "decode batch 1, ctx 512 .*ms/token" "$out/$tag.txt" | cut -d'|' -f3)"
}
for r in 1 2; do
  for pdl in early off; do
    export CACHET_PDL=$pdl
    run qwen-thin-48-$pdl-$r examples/configs/qwen3-30b-a3b-thin.json
    run qwen-thin-8-$pdl-$r .carry/qwen3-30b-a3b-thin-8l.json
    run llama-thin-fp8-32-$pdl-$r examples/configs/llama3-8b-thin.json --quantization fp8
    run llama-thin-fp8-8-$pdl-$r .carry/llama3-8b-thin-8l.json --quantization fp8
    run llama-thin-bf16-32-$pdl-$r examples/configs/llama3-8b-thin.json
    run llama-thin-bf16-8-$pdl-$r .carry/llama3-8b-thin-8l.json
  done
  unset CACHET_PDL
  CACHET_GRAPH_MEMORY=pool run qwen-thin-48-pool-$r examples/configs/qwen3-30b-a3b-thin.json
  CACHET_GRAPH_MEMORY=pool run llama-thin-bf16-32-pool-$r examples/configs/llama3-8b-thin.json
done
tar cJf $out/all.tar.xz -C $out --exclude all.tar.xz .
date
