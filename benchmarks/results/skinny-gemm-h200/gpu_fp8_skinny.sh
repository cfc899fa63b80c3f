#!/usr/bin/env bash
# Products of a few rows on our tensor-core kernel against the libraries (issue 22), one binary:
# FP8 weights, 5–64 rows (CACHET_FP8_SKINNY=on: fp8_skinny_gemm_*, against cuBLASLt) and bf16
# weights, 3–64 rows (CACHET_BF16_SKINNY=on: bf16_skinny_gemm_*, against cuBLAS) — each weight
# byte streamed once, k split where the weight rows give too few blocks. The CUDA tests comparing
# each with its library (8B projection shapes, up to 65 rows, a fused gate|up, an f32 LM head) and
# the random FP8 model's graph-vs-eager decode test with FP8 on, then `bench forward` on the
# Llama-3-8B shape — FP8 weights + FP8 KV, and bf16 — decode batches 16 / 32 / 64 at context 1280
# (fewer rows take the GEMV, 65+ the libraries either way), on and off alternated over ROUNDS;
# PROFILE=1 a `--profile` run of batch 64 each way (the `↳` product rows); NCU=1 (alone: ROUNDS=0
# KINDS=fp8 NCU=1 for a short call) Nsight Compute's speed-of-light and memory sections on the
# first skinny launches of an FP8 batch-64 step (their DRAM rate against the copy rate).
# Carry .carry/cachet.xz, .carry/families-tests.xz, .carry/engine-tests.xz.
#   OUT=... [ROUNDS=2] [PROFILE=1] [KINDS="fp8 bf16"] scripts/gpu_fp8_skinny.sh
source "$(dirname "$0")/gpu_common.sh"
echo "== CUDA tests"
/tmp/families-tests --ignored --test-threads 1 --nocapture skinny 2>&1 | tee "$out/families-skinny.txt" \
  | grep -E "^test |test result|panicked|skinny vs"
CACHET_FP8_SKINNY=on CACHET_BF16_SKINNY=on /tmp/engine-tests --ignored --test-threads 1 random_fp8_model 2>&1 \
  | tee "$out/engine-random-fp8-skinny.txt" | grep -E "^test |test result|panicked"
for kind in ${KINDS:-fp8 bf16}; do
  m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda)
  var=CACHET_BF16_SKINNY
  [ $kind = fp8 ] && m+=(--quantization fp8 --kv-cache-dtype fp8) && var=CACHET_FP8_SKINNY
  for r in $(seq 1 ${ROUNDS:-2}); do
    for v in on off; do
      echo "== $kind, round $r, $var=$v"
      env $var=$v /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,32,64 \
        --decode-context 1280 --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 \
        --json-out "$out/skinny-$kind-$v-$r.json" 2>&1 | grep -v INFO > "$out/skinny-$kind-$v-$r.txt"
      grep -E "batch (16|32|64)," "$out/skinny-$kind-$v-$r.txt"
    done
  done
  if [ "${PROFILE:-0}" = 1 ]; then
    for v in on off; do
      env $var=$v /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 64 \
        --decode-context 1280 --prefill 512 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile \
        2>&1 | grep -v INFO > "$out/profile-skinny-$kind-$v.txt"
      echo "== $kind profile, $var=$v"; grep -E "^\| (gemm|↳|attention)" "$out/profile-skinny-$kind-$v.txt" | head -12
    done
  fi
done
ncu=/opt/nvidia/nsight-compute/2025.3.1/ncu
if [ "${NCU:-0}" = 1 ] && [ -x $ncu ]; then
  # Give it room: a `timeout` that kills ncu leaves its target holding the GPU's memory.
  CACHET_FP8_SKINNY=on $ncu --clock-control none -k regex:skinny_gemm --launch-count 8 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy /tmp/cachet bench forward \
    --model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8 \
    --decode-contexts 512 --decode-batches 64 --decode-context 1280 --prefill 512 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 > "$out/ncu-skinny-fp8-b64.txt" 2>&1
  grep -E "skinny_gemm|Duration|DRAM Throughput|Memory Throughput" "$out/ncu-skinny-fp8-b64.txt" | head -40
fi
