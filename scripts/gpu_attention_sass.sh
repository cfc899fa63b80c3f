#!/usr/bin/env bash
# Where the FP8 cache's decode attention spends its instructions (issue 22): Nsight Compute on
# one launch of paged_attention_mma_d128_fp8 in a batch-256 decode step of the 8B shape (FP8
# weights + FP8 KV, context CTX, default 1280 — the served contexts), clocks left alone: the
# speed-of-light, occupancy and warp-stall sections, then the source page — every SASS
# instruction with its executed count and sampled stalls, attributed to the kernel's lines (the
# kernels are built with line information). BENCHMARKS.md §12c has the first reading (44% of
# DRAM, ~830 instructions a warp for each 16 keys, waits on the cache only 6% of stalls).
# Carry .carry/cachet.xz.
#   OUT=... [CTX=1280] [KERNEL=paged_attention_mma_d128_fp8] scripts/gpu_attention_sass.sh
source "$(dirname "$0")/gpu_common.sh"
ncu=/opt/nvidia/nsight-compute/2025.3.1/ncu
[ -x $ncu ] || { echo "no Nsight Compute at $ncu"; exit 1; }
cmd=(/tmp/cachet bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8
     --kv-cache-dtype fp8 --decode-batches 256 --decode-contexts ${CTX:-1280} --decode-context ${CTX:-1280} --prefill 512
     --cached-prefix none --sampling-batches 1 --graph-batches 1)
# Batch 1 runs first (32 launches a step, ~11 timed steps and graph captures): skip past it.
sel=(--clock-control none -k ${KERNEL:-paged_attention_mma_d128_fp8} --launch-skip ${NCU_SKIP:-900} --launch-count 1)
timeout 200 $ncu "${sel[@]}" --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section InstructionStats --section SourceCounters --export "$out/attention" "${cmd[@]}" > "$out/ncu-run.txt" 2>&1
timeout 120 $ncu --import "$out/attention.ncu-rep" --page details > "$out/details.txt" 2>&1
timeout 120 $ncu --import "$out/attention.ncu-rep" --page source --csv --print-source sass,cuda > "$out/source.csv" 2>&1
grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|Registers Per|Achieved Occupancy" "$out/details.txt" | head -12
echo "source rows: $(wc -l < "$out/source.csv")"
