#!/usr/bin/env bash
# Variants of gemv.cu's L2 warm-up through CACHET_KERNEL_DIR, one binary, one call.
source scripts/gpu_common.sh
args() {
  case $1 in
    8b) echo --model examples/configs/llama3-8b.json ;;
    8b-fp8) echo --model examples/configs/llama3-8b.json --quantization fp8 ;;
    qwen3-moe) echo --model examples/configs/qwen3-30b-a3b.json ;;
  esac
}
one() { # variant model value [extra env]
  local x=${4:-}; local dir=""; [ "$1" = base ] || dir=$PWD/.carry/kv/$1
  f="$out/forward-$1-$2-$3${x:+-$x}"
  env ${dir:+CACHET_KERNEL_DIR=$dir} ${x} CACHET_L2_PREFETCH_MB=$3 timeout 120 /tmp/cachet bench forward $(args "$2") --load-format dummy --device cuda \
    --decode-contexts 512,4096 --decode-batches 2 --decode-context 512 --prefill 512 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 2>&1 | grep -v " INFO " > "$f.txt"
  echo "$1 $2 L2=$3 $x: $(grep -E '^\| decode batch' "$f.txt" | awk -F'|' '{printf "%s %s;", $2, $3}') $(grep -iE 'error|panic' "$f.txt" | head -2)"
}
for m in 8b-fp8 8b; do
  one base $m off; one base $m 4; one base $m 16
  one start $m 16
  one evict $m off; one evict $m 16
  one evictpf $m 16
  one base $m off CACHET_PDL=off; one base $m 16 CACHET_PDL=off
  one base $m off
done
one base qwen3-moe off; one evict qwen3-moe off; one evict qwen3-moe 16; one evictpf qwen3-moe 16; one base qwen3-moe off
