#!/usr/bin/env bash
# The thin twins' eager per-operation profile (`--profile`): which operations the structure's
# ~30 µs a layer is made of.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
for x in "qwen3-30b-a3b-thin" "llama3-8b-thin" "llama3-8b-thin --quantization fp8"; do
  set -- $x; tag=$(echo "$x" | tr ' ' '_' | tr -d '-')
  /tmp/cachet bench forward --model examples/configs/$1.json ${2:-} ${3:-} --load-format dummy --device cuda \
    --decode-contexts 512 --decode-batches 1 --decode-context 512 --prefill 512 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 --profile 2>&1 | grep -v INFO > "$out/profile-$tag.txt"
  echo "== $x"; grep -E "eager|^\| [a-z↳]" "$out/profile-$tag.txt" | head -40
done
