#!/usr/bin/env bash
# cuBLASLt's FP8 products with split-K forms timed (CACHET_FP8_GEMM_TUNE=split) against the
# heuristic's pick and the timed choice without split-K; one binary, alternated over two rounds.
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
echo "== CUDA test (timed and split-K products against the heuristic's)"
timeout 120 /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_gemms_with_timed 2>&1 | tee $out/families-split.txt | grep -E "^test |test result|panicked|split-K true"
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for r in 1 2; do
  for v in heuristic timed split; do
    CACHET_FP8_GEMM_TUNE=$v RUST_LOG=info,cachet_backend::device::cuda::gemm_fp8=debug timeout 150 /tmp/cachet bench forward "${m[@]}" \
      --decode-contexts 512 --decode-batches 16,32,64,128,256 --decode-context 1280 --prefill 2048 --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --json-out "$out/$v-$r.json" > "$out/$v-$r.log" 2>&1
    grep -v -E " INFO | DEBUG " "$out/$v-$r.log" > "$out/$v-$r.txt"
    grep "FP8 GEMM tuned" "$out/$v-$r.log" > "$out/choices-$v-$r.txt"
    echo "== round $r $v"; grep -E "^\| (prefill|decode batch)" "$out/$v-$r.txt" | awk -F'|' '{print $2 "|" $3 "|" $6}'
  done
done
grep -c "splits=1 " $out/choices-split-1.txt; grep -v "splits=1 " $out/choices-split-1.txt | sed 's/.*tuned //' | head -30
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
