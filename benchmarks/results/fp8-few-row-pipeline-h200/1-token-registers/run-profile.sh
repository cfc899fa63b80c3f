#!/usr/bin/env bash
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
rm -f /tmp/families-tests; xz -dc .carry/families-tests.xz > /tmp/families-tests; chmod +x /tmp/families-tests
timeout 100 /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_products_of_a_few_rows 2>&1 | tee $out/families-skinny.txt | grep -E "^test |test result|panicked|ours vs|took|off" | tail -30
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for v in off on; do
CACHET_FP8_SKINNY=$v timeout 100 /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16 --decode-context 1280 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile 2>&1 | grep -v " INFO " > $out/prof16-$v.txt
grep -A16 "decode batch 16, ctx 1280 (device" $out/prof16-$v.txt
done
CACHET_FP8_SKINNY=on timeout 200 ncu --kernel-name regex:fp8_skinny --launch-skip 40 --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,64 --decode-context 1280 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 --enforce-eager > $out/ncu.txt 2>&1
grep -E "fp8_skinny|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Grid Size|Stall|Warp Cycles Per Issued|Issued Ipc|Compute \(SM\)" $out/ncu.txt | head -80
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
