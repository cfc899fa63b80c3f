#!/usr/bin/env bash
# 16-row tiles in moe.cu's grouped kernel for decode (CACHET_MOE_SMALL_TILES=on, the default)
# against 64-row tiles (off): the CUDA MoE test, then decode batches two rounds, bf16 and FP8
# experts, CUDA graphs; then Nsight Compute on the 64-row-tile kernel at Qwen batch 64.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
timeout 200 /tmp/moe-tests --ignored --test-threads 1 --nocapture moe_layers_on_cuda 2>&1 | tee $out/moe-cuda.txt | grep -E "^test |test result|panicked" | tail -6
for r in 1 2; do
  for cfg in qwen3-30b-a3b mixtral-8x7b; do
    b=16,64,256; [ $cfg = mixtral-8x7b ] && b=16,64
    for q in none fp8; do
      for v in off on; do
        CACHET_MOE_SMALL_TILES=$v timeout 150 /tmp/cachet bench forward --model examples/configs/$cfg.json --load-format dummy --device cuda \
          --quantization $q --decode-contexts 512 --decode-batches $b --decode-context 2048 --prefill 512 --cached-prefix none \
          --sampling-batches 1 --graph-batches 1 2>&1 | grep -v INFO > $out/tiles-$cfg-$q-$v-r$r.txt
        echo "== r$r $cfg $q small=$v: $(grep -E "^\| decode batch (16|64|256)" $out/tiles-$cfg-$q-$v-r$r.txt | awk -F'|' '{printf "%s/", $3}')"
      done
    done
  done
done
NCU=/opt/nvidia/nsight-compute/2025.3.1/ncu
for v in off on; do
CACHET_MOE_SMALL_TILES=$v timeout 150 $NCU --kernel-name regex:moe_gemm --launch-skip 10 --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats /tmp/cachet bench forward --model examples/configs/qwen3-30b-a3b.json \
  --load-format dummy --device cuda --decode-contexts 512 --decode-batches 64 --decode-context 2048 --prefill 512 --cached-prefix none \
  --sampling-batches 1 --graph-batches 64 --cuda-graph-sizes 64 > $out/ncu-qwen-b64-small-$v.txt 2>&1
grep -E "moe_gemm_bm|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit" $out/ncu-qwen-b64-small-$v.txt | head -24
done
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
