#!/usr/bin/env bash
# Head_dim 256 (Gemma 3) on the H200 after a kernel change: the CUDA-vs-CPU attention check,
# the family and engine tests on CUDA (real-weight models skipped unless carried), then ROUNDS
# alternated Llama-3-8B / Gemma-3-12B forward runs (decode b1 at ctx 512 and 4096, prefill 512
# and 2048) and one profile of each (where a 512-token prefill's time goes).
#   OUT=... [ROUNDS=3] [TESTS=0: the bench only] [FAMILY_TEST_ARGS="--skip qwen25_coder --skip gemma3_270m"] scripts/gpu_d256.sh
source "$(dirname "$0")/gpu_common.sh"
if [ "${TESTS:-1}" = 1 ]; then
echo "== attention check, CUDA vs the CPU reference"
CACHET=/tmp/cachet KV="${KV:-auto}" bash scripts/gpu_attention_check.sh > "$out/attention-check.txt" 2>&1
echo "rc=$?"; grep -c OK "$out/attention-check.txt"; grep -E "FAIL" "$out/attention-check.txt" | head
echo "== family tests on CUDA"
/tmp/families-tests --ignored --test-threads 1 ${FAMILY_TEST_ARGS:---skip qwen25_coder --skip gemma3_270m} 2>&1 \
  | tee "$out/families-cuda.txt" | grep -E "test result|panicked|FAILED"
if [ -x /tmp/engine-tests ]; then
  echo "== engine tests on CUDA"
  /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "test result|panicked|FAILED"
fi
fi
for r in $(seq 1 "${ROUNDS:-3}"); do
  for m in llama3-8b gemma3-12b; do
    echo "== round $r, $m"
    /tmp/cachet bench forward --model examples/configs/$m.json --load-format dummy --device cuda \
      --decode-batches 1 --decode-contexts 512,4096 --prefill 512,2048 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --json-out "$out/pairs-$m-$r.json" 2>&1 \
      | grep -E "prefill|decode b|floor" | tee "$out/pairs-$m-$r.txt"
  done
done
for m in llama3-8b gemma3-12b; do
  echo "== profile $m"
  /tmp/cachet bench forward --model examples/configs/$m.json --load-format dummy --device cuda \
    --decode-batches 1 --decode-contexts 4096 --prefill 512 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 --profile 2>&1 | grep -v " INFO " > "$out/profile-$m.txt"
  grep -A6 "prefill 512 (device" "$out/profile-$m.txt"
done
