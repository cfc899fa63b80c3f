#!/usr/bin/env bash
# Why the FP8 KV cache is slower than bf16 at batch 64–256 (issue 22): the 8B shape's decode steps
# at context 2048 with each cache, timed per operation, the CUDA-core attention kernel beside the
# tensor-core one for the FP8 cache, and Nsight Compute's speed-of-light, memory and warp-stall
# sections of the attention kernel of a batch-256 step for each cache. Everything ends up in
# $OUT/kv-fp8-profile.tar.gz. Carry .carry/cachet.xz.
#   OUT=... scripts/gpu_kv_fp8_profile.sh
source "$(dirname "$0")/gpu_common.sh"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --decode-contexts 2048
   --decode-context 2048 --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1)
mkdir -p "$out/kv"
[ "${NCU_ONLY:-0}" = 1 ] || for kv in auto fp8; do
  /tmp/cachet bench forward "${m[@]}" --kv-cache-dtype $kv --decode-batches 64,256 --profile 2>&1 \
    | grep -v INFO > "$out/kv/forward-$kv.txt"
done
[ "${NCU_ONLY:-0}" = 1 ] || CACHET_ATTENTION=simt /tmp/cachet bench forward "${m[@]}" --kv-cache-dtype fp8 --decode-batches 64,256 \
  --profile 2>&1 | grep -v INFO > "$out/kv/forward-fp8-simt.txt"
ncu=/opt/nvidia/nsight-compute/2025.3.1/ncu
if [ -x $ncu ]; then
  for kv in auto fp8; do
    k=paged_attention_mma_d128_bf16; [ $kv = fp8 ] && k=paged_attention_mma_d128_fp8
    # Batch 1 runs first (32 launches a step, ~11 timed steps and graph captures): skip past it.
    $ncu -k $k --launch-skip ${NCU_SKIP:-900} --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section LaunchStats --section Occupancy \
      /tmp/cachet bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
      --kv-cache-dtype $kv --decode-batches 256 --decode-contexts 2048 --decode-context 2048 --prefill 512 \
      --cached-prefix none --sampling-batches 1 --graph-batches 1 > "$out/kv/ncu-$kv.txt" 2>&1
  done
fi
tar czf "$out/kv-fp8-profile.tar.gz" -C "$out" kv && rm -r "$out/kv"
