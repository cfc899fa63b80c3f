#!/usr/bin/env bash
# Batch-1 attention split vs none (no combine launch): CACHET_ATTENTION_SPLIT min_keys,max_splits,
# default 64,64 (8 splits at ctx 512); 256,64 (2); 512,64 (1 at 512, 8 at 4096); one binary.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
run() {  # tag, config, extra flags
  local tag=$1 cfg=$2; shift 2
  /tmp/cachet bench forward --model examples/configs/$cfg.json --load-format dummy --device cuda "$@" \
    --decode-contexts 512,4096 --decode-batches 1 --decode-context 512 --prefill 512 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 2>&1 | grep -v INFO > "$out/$tag.txt"
  echo "== $tag: $(grep -E "decode batch 1, ctx (512|4096) .*ms/token" "$out/$tag.txt" | cut -d'|' -f3 | tr '\n' ' ')"
}
for r in 1 2; do
  for s in 64,64 256,64 512,64; do
    export CACHET_ATTENTION_SPLIT=$s
    run thin-fp8-$s-$r llama3-8b-thin --quantization fp8
    run thin-qwen-$s-$r qwen3-30b-a3b-thin
    [ $r = 1 ] && run full-fp8-$s-$r llama3-8b --quantization fp8
    [ $r = 1 ] && run full-qwen-$s-$r qwen3-30b-a3b
  done
done
tar cJf /tmp/all.tar.xz -C $out . && mv /tmp/all.tar.xz $out/
