#!/usr/bin/env bash
# One CUDA switch of the FP8 GEMMs side by side (issue 22), one binary, the value chosen per
# process by the environment variable VAR, each of VALUES in turn: the CUDA FP8 tests matching
# TESTS (default `fp8`; tiny-qwen3 against transformers on torch's e4m3 weights prints its
# errors), then `bench forward` on the Llama-3-8B shape with FP8 weights — prefill and batched
# decode at context 2048, where the cuBLASLt GEMMs run — the values alternated over two rounds,
# and optionally: PROFILE=1 one `--profile` run each (its `↳ fp8:` rows split the `gemm` op into
# quantization, cuBLASLt's product and the scales), COMPARE=1 the 8B's FP8-weight logits against
# bf16 under each (`bench kv-fp8 --compare weights`; needs SmolLM2's GGUF for the tokenizer),
# ENGINE=1 the CUDA engine tests under the last value, SERVE=1 the serving benchmark with FP8
# weights and cache under the last value (needs the GGUF).
# Carry .carry/cachet.xz and .carry/families-tests.xz (.carry/engine-tests.xz for ENGINE=1);
# SmolLM2's GGUF as /tmp/smollm2.gguf where needed.
#   OUT=... VAR=CACHET_FP8_ACTIVATIONS VALUES="exact fast" PROFILE=1 scripts/gpu_fp8_ab.sh
# Runs recorded in BENCHMARKS.md §9b: CACHET_FP8_FAST_ACCUM "0 1" (COMPARE=1),
# CACHET_FP8_PRODUCT "f32 bf16" (PROFILE=1 COMPARE=1 ENGINE=1), CACHET_FP8_ACTIVATIONS "exact fast"
# (TESTS="fp8_activations fp8_weights" PROFILE=1).
source "$(dirname "$0")/gpu_common.sh"
: "${VAR:?name the switch, e.g. VAR=CACHET_FP8_PRODUCT}" "${VALUES:?its values, e.g. VALUES=\"f32 bf16\"}"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8)
last=${VALUES##* }
for t in ${TESTS:-fp8}; do
  for v in $VALUES; do
    echo "== CUDA tests matching $t, $VAR=$v"
    env "$VAR=$v" /tmp/families-tests --ignored --test-threads 1 --nocapture "$t" 2>&1 \
      | tee "$out/families-$t-$v.txt" | grep -E "^test |test result|panicked|relative error|fast vs"
  done
done
for round in 1 2; do
  for v in $VALUES; do
    echo "== round $round, $VAR=$v"
    env "$VAR=$v" /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,64,256 \
      --decode-context 2048 --prefill 512,2048,4096 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      --json-out "$out/forward-$v-r$round.json" 2>&1 | grep -v INFO > "$out/forward-$v-r$round.txt"
    grep -E "prefill|batch (16|64|256)," "$out/forward-$v-r$round.txt"
  done
done
if [ -n "${PROFILE:-}" ]; then
  for v in $VALUES; do
    env "$VAR=$v" /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 256 \
      --decode-context 2048 --prefill 2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile \
      2>&1 | grep -v INFO > "$out/profile-$v.txt"
    echo "== profile, $VAR=$v"; grep -E "^\| (gemm|↳)" "$out/profile-$v.txt"
  done
fi
if [ -n "${COMPARE:-}" ]; then
  for v in $VALUES; do
    echo "== FP8 weights against bf16, $VAR=$v"
    env "$VAR=$v" /tmp/cachet bench kv-fp8 --compare weights "${m[@]:0:6}" --tokenizer /tmp/smollm2.gguf \
      --contexts 512,2048 --json-out "$out/fp8w-8b-$v.json" 2>&1 | grep -v INFO | tee "$out/fp8w-8b-$v.txt"
  done
fi
if [ -n "${ENGINE:-}" ]; then
  echo "== engine tests on CUDA, $VAR=$last"
  env "$VAR=$last" /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "test result|panicked"
fi
if [ -n "${SERVE:-}" ]; then
  echo "== served, FP8 weights + FP8 KV, $VAR=$last"
  env "$VAR=$last" OUT=$out/serve RUNS=fp8 bash scripts/gpu_serve_bench.sh
fi
