#!/usr/bin/env bash
# The FP8 KV cache's decode attention on the H200 (issue 22): the attention kernels' sources of
# this checkout against an earlier copy (OLD_KERNELS, a folder of kernel sources swapped in
# through CACHET_KERNEL_DIR; default .carry-old/kold; `none` skips it), the same binary: the CUDA-vs-CPU attention
# check with both caches, the engine tests, and `bench forward` decode steps at batch 1 / 64 /
# 128 / 256 with the FP8 cache (old and new kernels) and the bf16 cache, alternated over ROUNDS;
# then, with SERVE=1, the serving benchmark with the bf16 and the FP8 cache on the new kernels.
# Carry .carry/cachet.xz, .carry-e/engine-tests.xz, the old kernels' folder. NEW_KERNELS names
# another folder for the new side (default this checkout's kernels/src), CTX the batches' context
# (default 2048), QUANT=fp8 loads FP8 weights; BF16=0 skips the bf16-cache rows.
#   OUT=... [ROUNDS=2] [SERVE=1] [NEW_KERNELS=dir] [CTX=1280] [QUANT=fp8] scripts/gpu_fp8_decode.sh
source "$(dirname "$0")/gpu_common.sh"
[ -x /tmp/engine-tests ] || [ ! -f .carry-e/engine-tests.xz ] || { xz -dc .carry-e/engine-tests.xz > /tmp/engine-tests && chmod +x /tmp/engine-tests; }
old=${OLD_KERNELS:-.carry-old/kold}
new=${NEW_KERNELS:-$PWD/kernels/src}
echo "== attention check, new kernels (bf16 and FP8 caches)"
CACHET_KERNEL_DIR=$new CACHET=/tmp/cachet KV="auto fp8" bash scripts/gpu_attention_check.sh 2>&1 | tee "$out/attention-check.txt" | grep -c OK
grep FAIL "$out/attention-check.txt" || echo "no FAIL"
if [ -x /tmp/engine-tests ]; then
  echo "== engine tests on CUDA, new kernels"
  CACHET_KERNEL_DIR=$new /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "test result|panicked|FAILED"
fi
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda)
[ -z "${QUANT:-}" ] || m+=(--quantization $QUANT)
bench() {  # name, kernel dir, kv dtype
  echo "== $1"
  CACHET_KERNEL_DIR=$2 /tmp/cachet bench forward "${m[@]}" --kv-cache-dtype $3 --decode-contexts 512,4096 \
    --decode-batches 64,128,256 --decode-context ${CTX:-2048} --prefill 512 --cached-prefix none --sampling-batches 1 \
    --graph-batches 1 --json-out "$out/$1.json" 2>&1 | grep -v INFO | tee "$out/$1.txt" | grep -E "decode|floor" | head -20
}
for r in $(seq 1 ${ROUNDS:-2}); do
  bench fp8-new-$r "$new" fp8
  [ "$old" = none ] || bench fp8-old-$r "$old" fp8
  [ "${BF16:-1}" = 0 ] || bench bf16-$r "$new" auto
done
if [ "${SERVE:-0}" = 1 ]; then
  CACHET_KERNEL_DIR=$new RUNS="${SERVE_RUNS:-kv-fp8 defaults}" bash scripts/gpu_serve_bench.sh
fi
