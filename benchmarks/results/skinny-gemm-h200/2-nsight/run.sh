#!/usr/bin/env bash
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
ncu=/opt/nvidia/nsight-compute/2025.3.1/ncu
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --decode-contexts 512 --decode-batches 64 --decode-context 1280 --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1)
CACHET_FP8_SKINNY=on $ncu --clock-control none -k regex:skinny_gemm --launch-count 4 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats \
  /tmp/cachet bench forward "${m[@]}" --quantization fp8 --kv-cache-dtype fp8 > "$out/ncu-skinny-fp8-b64.txt" 2>&1
CACHET_BF16_SKINNY=on $ncu --clock-control none -k regex:skinny_gemm --launch-count 4 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats \
  /tmp/cachet bench forward "${m[@]}" > "$out/ncu-skinny-bf16-b64.txt" 2>&1
grep -E "skinny_gemm|Duration|DRAM Throughput|Memory Throughput|Stall|Issued|Executed Ipc|Shared" "$out"/ncu-skinny-*.txt | head -80
