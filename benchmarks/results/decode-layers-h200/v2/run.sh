#!/usr/bin/env bash
# Where the persistent decode kernel's time goes. The built-in kernel (one-hop barrier) is checked
# by the CUDA test first; then `bench forward` at batch 1 on the thin 8B twin (structure only) and
# on the FP8 8B, with kernel variants swapped in through CACHET_KERNEL_DIR:
#   v0 as built; v1 a back-off in the barrier's poll;
#   v2 no attention, v3 no grid barriers, v4 no GEMV rows (timing only: their logits are wrong);
#   v5 each warp's first weights of the next phase loaded into registers before the barrier
#      (checked by the same test, its kernel swapped in);
#   v6 eight keys' K and V in flight a lane in the attention phase instead of four.
# Run from the repo root.
here=$(cd "$(dirname "$0")" && pwd)
source scripts/gpu_common.sh
t0=$(date +%s)
# Each variant: kernels/src/decode_layers.cu with variants/<name>.patch applied, in a directory of
# its own for CACHET_KERNEL_DIR (v0-base: the built-in source).
for p in "$here"/variants/*.patch; do
  v=$(basename "$p" .patch); mkdir -p /tmp/dlv/$v
  patch -s -o /tmp/dlv/$v/decode_layers.cu kernels/src/decode_layers.cu < "$p" || echo "variant $v: the patch did not apply"
done
mkdir -p /tmp/dlv/v0-base && cp kernels/src/decode_layers.cu /tmp/dlv/v0-base/
timeout 200 /tmp/engine-tests --ignored --exact --nocapture --test-threads=1 \
  decode_layers_in_one_launch_match_the_layers_one_by_one > "$out/tests.txt" 2>&1
echo "tests: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^test result' "$out/tests.txt")"
grep -E "panicked|FAILED" "$out/tests.txt" | head
CACHET_KERNEL_DIR=/tmp/dlv/v5-preload timeout 200 /tmp/engine-tests --ignored --exact --nocapture --test-threads=1 \
  decode_layers_in_one_launch_match_the_layers_one_by_one > "$out/tests-v5.txt" 2>&1
echo "tests, v5: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^test result' "$out/tests-v5.txt")"
b() {  # tag, mode, variant dir or "", config, flags
  local tag=$1 mode=$2 dir=$3 cfg=$4; shift 4
  CACHET_KERNEL_DIR=$dir CACHET_DECODE_LAYERS=$mode timeout 150 /tmp/cachet bench forward --model examples/configs/$cfg.json \
    --load-format dummy --device cuda --decode-contexts 512,4096 --decode-batches 1 --decode-context 512 \
    --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 "$@" 2>&1 | grep -v " INFO " > "$out/$tag.txt"
  echo "$tag: $(grep -E '^\| decode batch 1, ctx [0-9]+ \| [0-9.]+ ms/token' "$out/$tag.txt" | awk -F'|' '{print $3}' | tr '\n' ' ')"
}
for r in 1 2; do
  b thin-separate-r$r separate "" llama3-8b-thin --quantization fp8
  # The timing-only variants once; the others twice.
  vs="v0-base v1-backoff v5-preload v6-attention-8-keys"
  [ $r = 1 ] && vs="$vs v2-no-attention v3-no-barriers v4-no-gemv"
  for v in $vs; do
    b thin-$v-r$r fused /tmp/dlv/$v llama3-8b-thin --quantization fp8
  done
done
b full-separate separate "" llama3-8b --quantization fp8
b full-v0-base fused /tmp/dlv/v0-base llama3-8b --quantization fp8
b full-v1-backoff fused /tmp/dlv/v1-backoff llama3-8b --quantization fp8
b full-v3-no-barriers fused /tmp/dlv/v3-no-barriers llama3-8b --quantization fp8
b full-v5-preload fused /tmp/dlv/v5-preload llama3-8b --quantization fp8
b full-v6-attention-8-keys fused /tmp/dlv/v6-attention-8-keys llama3-8b --quantization fp8
b full-v5-preload-bf16 fused /tmp/dlv/v5-preload llama3-8b
b full-separate-bf16 separate "" llama3-8b
echo "done in $(( $(date +%s) - t0 )) s"
