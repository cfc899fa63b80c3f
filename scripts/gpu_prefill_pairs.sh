#!/usr/bin/env bash
# Issue 21's last edge on the H200: Gemma-3-12B's 512-token prefill against Llama-3-8B's, the two
# shapes alternated ROUNDS times in one call (dummy bf16 weights), so the comparison of achieved
# rates holds across the card's clock drift instead of resting on one pair of runs.
#   OUT=... ROUNDS=3 scripts/gpu_prefill_pairs.sh
source "$(dirname "$0")/gpu_common.sh"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for m in llama3-8b gemma3-12b; do
    echo "== round $r, $m"
    /tmp/cachet bench forward --model examples/configs/$m.json --load-format dummy --device cuda \
      --decode-batches 1 --decode-contexts 512 --prefill 512,2048 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --json-out "$out/pairs-$m-$r.json" 2>&1 \
      | grep -E "prefill|decode b|floor" | tee "$out/pairs-$m-$r.txt"
  done
done
