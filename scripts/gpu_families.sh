#!/usr/bin/env bash
# The model families on the H200 in one call: the family tests on CUDA (tiny transformers-built
# Qwen2 / Qwen2-YaRN / Qwen3 models, and Qwen2.5-Coder-0.5B's real weights), the engine tests of
# the same build (when carried), then the forward bench of each family's 7–8B shape (dummy bf16
# weights) with the Llama row, side by side.
# Carry .carry/{cachet,families-tests[,engine-tests]}.xz; Qwen2.5-Coder-0.5B's and Gemma 3 270M's
# GGUFs as parts in /tmp/qwen-parts/ and /tmp/gemma-parts/, SmolLM2's as /tmp/smollm2.gguf (all
# from earlier carries; a model not carried fails its tests).
#   OUT=... [MODELS="..."] [FAMILY_TEST_ARGS="--skip qwen25"] scripts/gpu_families.sh
source "$(dirname "$0")/gpu_common.sh"
qdir="$CACHET_CACHE_DIR/models/qwen2.5-coder-0.5b"
if [ -d /tmp/qwen-parts ]; then
  mkdir -p "$qdir" && cat /tmp/qwen-parts/part* > "$qdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
  sha256sum "$qdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" | tee "$out/qwen-sha256.txt"
fi
gdir="$CACHET_CACHE_DIR/models/gemma3-270m"
if [ -d /tmp/gemma-parts ]; then
  mkdir -p "$gdir" && cat /tmp/gemma-parts/part* > "$gdir/gemma-3-270m-q4_k_m.gguf"
  sha256sum "$gdir/gemma-3-270m-q4_k_m.gguf" | tee "$out/gemma-sha256.txt"
fi
echo "== family tests on CUDA"
/tmp/families-tests --ignored --test-threads 1 --nocapture ${FAMILY_TEST_ARGS:-} 2>&1 | tee "$out/families-cuda.txt" | grep -E "^test |test result|parts at|panicked"
if [ -x /tmp/engine-tests ]; then
  echo "== engine tests on CUDA"
  /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "^test |test result|panicked"
fi
if [ -d /tmp/qwen-parts ]; then
  echo "== generate: Qwen2.5-Coder-0.5B on CUDA"
  /tmp/cachet generate --model "$qdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" --device cuda --chat \
    --prompt "Write a Python function that returns the square of x." --max-tokens 40 2>&1 | grep -v " INFO " | tee "$out/generate-qwen.txt"
fi
echo "== forward bench per family (dummy bf16 weights)"
for m in ${MODELS:-llama3-8b qwen2.5-7b qwen3-8b mistral-7b}; do
  /tmp/cachet bench forward --model examples/configs/$m.json --load-format dummy --device cuda \
    --decode-batches 1,64 --decode-contexts 512,4096 --prefill 512,2048,8192 --json-out "$out/forward-$m.json" 2>&1 \
    | grep -v " INFO " | tee "$out/forward-$m.txt"
done
