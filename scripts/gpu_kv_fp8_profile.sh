#!/usr/bin/env bash
# Why the FP8 KV cache is slower than bf16 at batch 64–256 (issue 22): the 8B shape's decode steps
# at context 2048 with each cache, timed per operation, the CUDA-core attention kernel beside the
# tensor-core one for the FP8 cache, and Nsight Compute's speed-of-light, memory and warp-stall
# sections of the attention kernel of a batch-256 step for each cache. Everything ends up in
# $OUT/kv-fp8-profile.tar.gz. Carry .carry/cachet.xz.
# SOURCE=1 adds, for the FP8 cache, Nsight Compute's source page: every SASS instruction with its
# executed count and sampled stalls, attributed to the kernel's lines (the kernels carry line
# information). CTX sets the context (default 2048; 1280 is the served benchmark's), QUANT=fp8
# loads FP8 weights as served. Clocks are left alone (not ncu's base clocks). The decode kernel
# profiled follows CACHET_DECODE_ATTENTION / CACHET_DECODE_ATTENTION_BF16 (the transposed `_dec`
# symbols where on).
# KVS picks the caches Nsight Compute profiles (default "auto fp8"; each takes minutes: the
# application runs once a pass). On the device, give the whole script's timeout room: a
# `timeout` that kills ncu leaves its target holding the GPU's memory.
#   OUT=... [NCU_ONLY=1] [KVS=fp8] [SOURCE=1] [CTX=1280] [QUANT=fp8] scripts/gpu_kv_fp8_profile.sh
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
  ctx=${CTX:-2048}
  quant=(); [ -z "${QUANT:-}" ] || quant=(--quantization $QUANT)
  for kv in ${KVS:-auto fp8}; do
    # The decode steps' kernel: the transposed one (`_dec`) where it is on (FP8: the default).
    k=paged_attention_mma_d128_bf16; [ "${CACHET_DECODE_ATTENTION_BF16:-rows}" = transposed ] && k=${k}_dec
    [ $kv = fp8 ] && k=paged_attention_mma_d128_fp8 && [ "${CACHET_DECODE_ATTENTION:-transposed}" = transposed ] && k=${k}_dec
    extra=(); [ "${SOURCE:-0}" = 1 ] && [ $kv = fp8 ] && extra=(--section SourceCounters --export "$out/kv/attention-fp8")
    # Batch 1 runs first (32 launches a step, ~11 timed steps and graph captures): skip past it.
    $ncu --clock-control none -k $k --launch-skip ${NCU_SKIP:-900} --launch-count 2 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section Occupancy --section InstructionStats "${extra[@]}" \
      /tmp/cachet bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda "${quant[@]}" \
      --kv-cache-dtype $kv --decode-batches 256 --decode-contexts $ctx --decode-context $ctx --prefill 512 \
      --cached-prefix none --sampling-batches 1 --graph-batches 1 > "$out/kv/ncu-$kv.txt" 2>&1
  done
  if [ -f "$out/kv/attention-fp8.ncu-rep" ]; then
    $ncu --import "$out/kv/attention-fp8.ncu-rep" --page source --csv --print-source sass,cuda > "$out/kv/source-fp8.csv" 2>&1
  fi
fi
tar czf "$out/kv-fp8-profile.tar.gz" -C "$out" kv && rm -r "$out/kv"
