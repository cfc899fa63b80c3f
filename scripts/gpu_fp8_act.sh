#!/usr/bin/env bash
# FP8 GEMMs' own kernels (issue 22): the activations' quantization read once and vectorized
# (`quantize_act_rows_e4m3`, the default) against the weights' kernel (`CACHET_FP8_ACTIVATIONS=
# exact`), with the bf16 product's scale epilogue eight elements a thread in both. One binary:
# the CUDA test holding the two quantizations' products together and to the CPU, the FP8-weight
# test against transformers under each, `bench forward` on the Llama-3-8B shape with FP8 weights
# exact / fast / exact / fast, and one profile each (its `↳ fp8:` rows split the `gemm` op).
# Carry .carry/cachet.xz and .carry/families-tests.xz.
#   OUT=... scripts/gpu_fp8_act.sh
source "$(dirname "$0")/gpu_common.sh"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8)
/tmp/families-tests --ignored --test-threads 1 --nocapture fp8_activations 2>&1 \
  | tee "$out/families-fp8-activations.txt" | grep -E "^test |test result|panicked|fast vs exact"
for a in exact fast; do
  echo "== FP8-weight test on CUDA, activations $a"
  CACHET_FP8_ACTIVATIONS=$a /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_weights 2>&1 \
    | tee "$out/families-fp8-weights-$a.txt" | grep -E "^test |test result|panicked|relative error"
done
for round in 1 2; do
  for a in exact fast; do
    echo "== round $round, activations $a"
    CACHET_FP8_ACTIVATIONS=$a /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,64,256 \
      --decode-context 2048 --prefill 512,2048,4096 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      2>&1 | grep -v INFO > "$out/forward-$a-r$round.txt"
    grep -E "prefill|batch (16|64|256)," "$out/forward-$a-r$round.txt"
  done
done
for a in exact fast; do
  CACHET_FP8_ACTIVATIONS=$a /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 256 \
    --decode-context 2048 --prefill 2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile \
    2>&1 | grep -v INFO > "$out/profile-$a.txt"
  echo "== profile, activations $a"; grep -E "^\| (gemm|↳)" "$out/profile-$a.txt"
done
