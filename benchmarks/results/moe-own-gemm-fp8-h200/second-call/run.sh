#!/usr/bin/env bash
# (1) the CUDA MoE test; (2) bf16 prefill 512 / 4096, two rounds, experts whose product has T+
# 128×128 tiles on a cuBLAS GEMM of their own (CACHET_MOE_OWN_GEMM=T) against none (off);
# (3) FP8 experts' prefill: cuBLAS's path (dequantized an expert at a time, the default where an
# expert's gate|up averages 132+ tiles) against moe.cu's FP8 kernel (off); (4) FP8 decode
# batches 16–64: the grouped FP8 kernel from 8 rows against the expert GEMVs (off).
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
timeout 200 /tmp/moe-tests --ignored --test-threads 1 --nocapture moe_layers_on_cuda 2>&1 | tee $out/moe-cuda.txt | grep -E "^test |test result|panicked|1600 rows" | tail -20
fwd() { timeout 150 /tmp/cachet bench forward --load-format dummy --device cuda --cached-prefix none --sampling-batches 1 "$@" 2>&1 | grep -v INFO; }
for r in 1 2; do
  for cfg in mixtral-8x7b qwen3-30b-a3b; do
    for v in off 66 132 264; do
      CACHET_MOE_OWN_GEMM=$v fwd --model examples/configs/$cfg.json --decode-contexts 512 --decode-batches 1 --decode-context 512 \
        --prefill 512,4096 --graph-batches 1 > $out/bf16-$cfg-own-$v-r$r.txt
      echo "== r$r $cfg own=$v: $(grep -E "prefill (512|4096) tokens \|" $out/bf16-$cfg-own-$v-r$r.txt | awk -F'|' '{printf "%s/", $3}')"
    done
  done
done
for cfg in mixtral-8x7b qwen3-30b-a3b; do
  for v in 132 off; do
    CACHET_MOE_OWN_GEMM=$v fwd --model examples/configs/$cfg.json --quantization fp8 --decode-contexts 512 --decode-batches 1 \
      --decode-context 512 --prefill 512,4096 --graph-batches 1 --profile > $out/fp8-prefill-$cfg-own-$v.txt
    echo "== FP8 $cfg own=$v: $(grep -E "prefill (512|4096) tokens \|" $out/fp8-prefill-$cfg-own-$v.txt | awk -F'|' '{printf "%s/", $3}')"
    grep -E "moe grouped gemm|↳ moe" $out/fp8-prefill-$cfg-own-$v.txt | head -4
  done
  for v in 8 off; do
    CACHET_MOE_GEMM_FP8=$v fwd --model examples/configs/$cfg.json --quantization fp8 --decode-contexts 512 --decode-batches 16,24,32,48,64 \
      --decode-context 2048 --prefill 512 --graph-batches 1 > $out/fp8-decode-$cfg-$v.txt
    echo "== FP8 decode $cfg grouped-from=$v"; grep -E "^\| decode batch" $out/fp8-decode-$cfg-$v.txt | awk -F'|' '{print $2 "|" $3}'
  done
done
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
