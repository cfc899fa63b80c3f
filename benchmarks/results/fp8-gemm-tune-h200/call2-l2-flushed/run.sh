#!/usr/bin/env bash
source scripts/gpu_common.sh
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for v in timed heuristic; do
  echo "== CACHET_FP8_GEMM_TUNE=$v"
  CACHET_FP8_GEMM_TUNE=$v RUST_LOG=info,cachet_backend::device::cuda::gemm_fp8=debug /tmp/cachet bench forward "${m[@]}" \
    --decode-contexts 512 --decode-batches 64,128,256 --decode-context 1280 --prefill 2048 --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 --json-out "$out/tune2-$v.json" > "$out/tune2-$v.log" 2>&1
  grep -v -E " INFO | DEBUG " "$out/tune2-$v.log" > "$out/tune2-$v.txt"
  grep "FP8 GEMM tuned" "$out/tune2-$v.log" > "$out/tune2-choices-$v.txt"
  grep -E "prefill|batch (64|128|256)," "$out/tune2-$v.txt"
done
echo "$(wc -l < $out/tune2-choices-timed.txt) shapes tuned, $(grep -vc 'best=0 ' $out/tune2-choices-timed.txt) not the heuristic's pick"
(cd "$OUT" && tar czf /tmp/results.tgz . && rm -rf ./* && mv /tmp/results.tgz .)
