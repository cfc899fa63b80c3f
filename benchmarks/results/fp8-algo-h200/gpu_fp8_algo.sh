#!/usr/bin/env bash
# FP8 GEMMs with cuBLASLt's heuristic pick against the fastest of its first eight candidates,
# timed at each shape's first eager call (issue 22), one binary, the mode chosen per process by
# CACHET_FP8_ALGO: the FP8-weight test on CUDA under each (tiny-qwen3 against transformers on
# torch's e4m3 weights; its errors printed), `bench forward` on the Llama-3-8B shape with FP8
# weights heuristic / tuned / heuristic / tuned (prefill and batched decode, where the cuBLASLt
# GEMMs run), then one profile each — its `↳ fp8:` rows split the `gemm` op into the
# activations' quantization, cuBLASLt's product and the scale epilogue — with the tuning's log.
# Carry .carry/cachet.xz and .carry/families-tests.xz.
#   OUT=... scripts/gpu_fp8_algo.sh
source "$(dirname "$0")/gpu_common.sh"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8)
for a in heuristic tuned; do
  echo "== FP8-weight test on CUDA, algorithm $a"
  CACHET_FP8_ALGO=$a /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_weights 2>&1 \
    | tee "$out/families-fp8-algo-$a.txt" | grep -E "^test |test result|panicked|relative error"
done
for round in 1 2; do
  for a in heuristic tuned; do
    echo "== round $round, algorithm $a"
    CACHET_FP8_ALGO=$a /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,64,256 \
      --decode-context 2048 --prefill 512,2048,4096 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      2>&1 | grep -v INFO > "$out/forward-$a-r$round.txt"
    grep -E "prefill|batch (16|64|256)," "$out/forward-$a-r$round.txt"
  done
done
for a in heuristic tuned; do
  RUST_LOG=cachet_backend::device::cuda::gemm_fp8=debug CACHET_FP8_ALGO=$a /tmp/cachet bench forward "${m[@]}" \
    --decode-contexts 512 --decode-batches 256 --decode-context 2048 --prefill 2048 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 --profile 2>&1 | grep -v INFO > "$out/profile-$a.txt"
  echo "== profile, algorithm $a"; grep -E "^\| (gemm|↳)" "$out/profile-$a.txt"
  grep -c "algorithm tuned" "$out/profile-$a.txt"
done
