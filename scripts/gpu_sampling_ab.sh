#!/usr/bin/env bash
# Token selection before and after the shared-memory candidate path, side by side in one run on
# one binary: the kernels embedded in it (after) against an older sampling.cu substituted through
# CACHET_KERNEL_DIR (before), alternating, three runs each. Usage: OLD=dir BIN=cachet OUT=dir
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CACHET_CACHE_DIR=${CACHET_CACHE_DIR:-/tmp/cachet-cache}
run() {
  timeout 120 "$BIN" bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
    --decode-batches 1 --decode-contexts 512 --prefill 512 --cached-prefix none --graph-batches 1 \
    --sampling-batches 1,16,64,256 --json-out "$out/sampling-$1-$2.json" 2>&1 | grep -A6 "| decode step, ctx 512 | greedy"
}
for i in 1 2 3; do
  echo "== before, run $i"; CACHET_KERNEL_DIR="$OLD" run before "$i"
  echo "== after, run $i"; run after "$i"
done
