#!/usr/bin/env bash
# Every layer of a one-token decode step in one persistent launch (CACHET_DECODE_LAYERS) against the
# layers one by one: the CUDA test that compares them, then `bench forward` at batch 1 on the
# Llama-3-8B shape (FP8 and bf16 weights, bf16 KV, ctx 512 and 4096, CUDA graphs) and its thin
# twin (the same layers over next to no weight bytes: what the structure alone costs), one binary,
# the switch per process, two rounds for the FP8 8B. Carry .carry/cachet.xz and engine-tests.xz.
#   OUT=... [MODES="separate fused"] [BF16=0] [ROUNDS="1 2"] bash scripts/gpu_decode_layers.sh
source "$(dirname "$0")/gpu_common.sh"
t0=$(date +%s)
timeout 240 /tmp/engine-tests --ignored --exact --nocapture --test-threads=1 \
  decode_layers_in_one_launch_match_the_layers_one_by_one \
  decode_steps_of_a_random_fp8_model_replayed_from_cuda_graphs_match_eager_steps > "$out/tests.txt" 2>&1
echo "tests: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^test result' "$out/tests.txt")"
grep -E "one launch vs|panicked|FAILED" "$out/tests.txt" | head -40
run() {  # tag, config, mode, extra flags
  local tag=$1 cfg=$2 mode=$3; shift 3
  CACHET_DECODE_LAYERS=$mode timeout 150 /tmp/cachet bench forward --model examples/configs/$cfg.json \
    --load-format dummy --device cuda "$@" --decode-contexts 512,4096 --decode-batches 1 --decode-context 512 \
    --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 2>&1 | grep -v " INFO " > "$out/$tag-$mode.txt"
  echo "$tag $mode: $(grep -E '^\| decode batch 1, ctx' "$out/$tag-$mode.txt" | awk -F'|' '{print $2 $3 $5}' | tr '\n' ' ')"
}
for r in ${ROUNDS:-1 2}; do
  for mode in ${MODES:-separate fused}; do
    run llama-fp8-r$r llama3-8b $mode --quantization fp8
    [ $r = 1 ] && [ "${BF16:-1}" = 1 ] && run llama-bf16-r$r llama3-8b $mode
    run thin-fp8-r$r llama3-8b-thin $mode --quantization fp8
  done
done
echo "done in $(( $(date +%s) - t0 )) s"
