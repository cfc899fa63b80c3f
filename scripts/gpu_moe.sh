#!/usr/bin/env bash
# Mixtures of experts on the H200 (issue 24), in one call: the CUDA family tests (tiny Qwen3-MoE
# and Mixtral against transformers, with the dense families), then `bench forward` on the
# Qwen3-30B-A3B and Mixtral-8x7B shapes (dummy bf16 weights): decode batch 1 against its
# active-weight floor, batches 16 / 64 / 256 against the floor of the experts they touch, prefill
# against the GEMM rate — and the transformers peer of the same configs in the same call
# (TORCH=0 skips it); GEMV_TOO=1 adds the decode batches with every step on the expert GEMVs
# (CACHET_MOE_GEMM=off) beside the grouped GEMMs; QUANT="none fp8" adds the FP8-expert tables. Carry .carry/{cachet,families-tests,moe-tests,
# engine-tests}.xz (stripped, xz); the results are tarred into $OUT/moe.tar.gz as well.
#   OUT=... [MODELS="qwen3-30b-a3b mixtral-8x7b"] [PREFILL_qwen3_30b_a3b=512,4096] [QUANT="none fp8"] scripts/gpu_moe.sh
source "$(dirname "$0")/gpu_common.sh"
if [ -x /tmp/families-tests ]; then
  echo "== family tests on CUDA (tiny MoE models among them)"
  /tmp/families-tests --ignored --test-threads 1 tiny_families 2>&1 | tee "$out/families-cuda.txt" \
    | grep -E "^test |test result|panicked"
fi
if [ -x /tmp/moe-tests ]; then
  echo "== MoE tests on CUDA (the GGUF MoE against transformers)"
  /tmp/moe-tests --ignored --test-threads 1 2>&1 | tee "$out/moe-cuda.txt" | grep -E "^test |test result|panicked"
fi
if [ -x /tmp/engine-tests ] && [ "${ENGINE:-1}" = 1 ]; then
  echo "== engine tests on CUDA"
  /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "test result|panicked|FAILED"
fi
for model in ${MODELS:-qwen3-30b-a3b mixtral-8x7b}; do
  var="PREFILL_${model//[-.]/_}"
  prefill=${!var:-512,4096}
  for q in ${QUANT:-none}; do
    sfx=""; [ "$q" = none ] || sfx="-$q"
    echo "== bench forward, $model (prefill $prefill, weights $q)"
    /tmp/cachet bench forward --model examples/configs/$model.json --load-format dummy --device cuda \
      --quantization "$q" --decode-contexts 512,4096 --decode-batches ${BATCHES:-16,64,256} --decode-context 2048 \
      --prefill "$prefill" --cached-prefix none --sampling-batches 1 --graph-batches 1,16 --profile \
      --json-out "$out/forward-$model$sfx.json" 2>&1 | grep -v " INFO " | tee "$out/forward-$model$sfx.txt"
  done
  if [ "${GEMV_TOO:-0}" = 1 ]; then
    echo "== bench forward, $model, expert GEMVs only (CACHET_MOE_GEMM=off)"
    CACHET_MOE_GEMM=off /tmp/cachet bench forward --model examples/configs/$model.json --load-format dummy \
      --device cuda --decode-contexts 512 --decode-batches ${BATCHES:-16,64,256} --decode-context 2048 \
      --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      --json-out "$out/forward-$model-gemv.json" 2>&1 | grep -v " INFO " | tee "$out/forward-$model-gemv.txt"
  fi
  if [ "${TORCH:-1}" = 1 ]; then
    echo "== transformers peer, $model"
    timeout ${TORCH_TIMEOUT:-240} python3 scripts/torch_peer.py --config examples/configs/$model.json \
      --contexts 512 --prefill "$prefill" --out "$out/peer-$model.json" 2>&1 | grep -v Warn | tee "$out/peer-$model.txt"
  fi
done
tar -czf "$out/moe.tar.gz" -C "$out" --exclude moe.tar.gz .
