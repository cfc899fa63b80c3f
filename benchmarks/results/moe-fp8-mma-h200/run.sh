#!/usr/bin/env bash
# Two prepared MoE switches, each against its default, one binary, the switch per process.
# (1) FP8 experts on moe.cu's FP8 × FP8 grouped kernel (CACHET_MOE_FP8_MMA=fp8: input rows quantized
# per row, e4m3 MMAs) against the default (weights' codes widened to bf16 for bf16 MMAs), one
# binary, the switch per process, alternated twice. First the CUDA MoE test, which runs the new
# path against the CPU reference (E 8 / 16 / 128, 64–1,600 rows: 16-, 64- and 128-row tiles).
# Then `bench forward`: Qwen3-30B-A3B's FP8 prefill (the one place FP8 experts lost to bf16,
# §13c) and batched decode in graphs (the grouped kernel from 24 rows), bf16 experts beside it;
# Mixtral-8x7B's FP8 batched decode (its prefill takes cuBLASLt an expert either way).
# (2) A MoE layer's norm in its router's GEMV (CACHET_MOE_NORM=fused) and its routing in the
# expert GEMVs (CACHET_MOE_ROUTER=experts): a launch fewer a layer each at batch 1. Batch-1
# decode of Qwen3-30B-A3B's thin twin (the layer structure alone, §13b) in all four forms, the
# full model (bf16, FP8 experts) without and with both, alternated twice.
# Carry .carry/{cachet,moe-tests}.xz; run from the repo root:  OUT=... [PARTS=...] bash <this file>
# PARTS: "test qwen" (the default), then "norm", then "mixtral profile": a call each, ~8–10 min.
source scripts/gpu_common.sh
t0=$(date +%s)
parts=" ${PARTS:-test qwen} "
[[ $parts == *" test "* ]] && { timeout 300 /tmp/moe-tests --ignored --nocapture --test-threads=1 \
  moe_layers_on_cuda_match_the_cpu_reference_on_every_path \
  the_moe_norm_in_the_routers_gemv_gives_the_separate_launches_results > "$out/moe-test.txt" 2>&1
echo "moe test: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^test result' "$out/moe-test.txt")"
grep -E "panicked|FP8 × FP8" "$out/moe-test.txt" | head -30; }
b() {  # tag, CACHET_MOE_FP8_MMA value, model, bench flags (CACHET_MOE_NORM from the caller)
  local tag=$1 mode=$2 model=$3; shift 3
  CACHET_MOE_FP8_MMA=$mode timeout 200 /tmp/cachet bench forward --model examples/configs/$model.json \
    --load-format dummy --device cuda --decode-context 2048 --cached-prefix none --sampling-batches 1 \
    "$@" --json-out "$out/$tag.json" 2>&1 | grep -v " INFO " > "$out/$tag.txt"
  echo "$tag: $(grep -E '^\| (decode batch [0-9]+, ctx [0-9]+|prefill [0-9]+ tokens) \| [0-9.]+ ms' "$out/$tag.txt" \
    | awk -F'|' '{gsub(/ +$/, "", $2); gsub(/ +$/, "", $3); printf "%s:%s;", $2, $3}')"
}
q=(--quantization fp8 --decode-contexts 2048 --decode-batches 64,256 --graph-batches 64,256 --prefill 512,4096)
[[ $parts == *" qwen "* ]] && for r in 1 2; do
  b qwen-fp8-widen-r$r widen qwen3-30b-a3b "${q[@]}"
  b qwen-fp8-mma-r$r fp8 qwen3-30b-a3b "${q[@]}"
done
[[ $parts == *" qwen "* ]] && b qwen-bf16 widen qwen3-30b-a3b --decode-contexts 2048 --decode-batches 64,256 --graph-batches 64,256 --prefill 512,4096
one=(--decode-contexts 512,4096 --decode-batches 1 --graph-batches 1 --prefill 256)
# The layer's launches at batch 1: separate (the default), the norm in the router's GEMV, the
# routing in the expert GEMVs (CACHET_MOE_ROUTER=experts), both.
[[ $parts == *" norm "* ]] && for r in 1 2; do
  for v in separate,gemv fused,gemv separate,experts fused,experts; do
    norm=${v%,*} router=${v#*,} tag=${v/,/-}
    CACHET_MOE_NORM=$norm CACHET_MOE_ROUTER=$router b qwen-thin-b1-$tag-r$r widen qwen3-30b-a3b-thin "${one[@]}"
    case $v in separate,gemv|fused,experts)
      CACHET_MOE_NORM=$norm CACHET_MOE_ROUTER=$router b qwen-b1-$tag-r$r widen qwen3-30b-a3b "${one[@]}"
      [ $r = 1 ] && CACHET_MOE_NORM=$norm CACHET_MOE_ROUTER=$router b qwen-fp8-b1-$tag widen qwen3-30b-a3b --quantization fp8 "${one[@]}";;
    esac
  done
done
m=(--quantization fp8 --decode-contexts 2048 --decode-batches 32,64 --graph-batches 32,64 --prefill 256)
[[ $parts == *" mixtral "* ]] && for r in 1 2; do
  b mixtral-fp8-widen-r$r widen mixtral-8x7b "${m[@]}"
  b mixtral-fp8-mma-r$r fp8 mixtral-8x7b "${m[@]}"
done
[[ $parts == *" profile "* ]] && b qwen-fp8-mma-profile fp8 qwen3-30b-a3b --quantization fp8 --decode-contexts 2048 --decode-batches 64 \
  --graph-batches 64 --prefill 4096 --profile
echo "done in $(( $(date +%s) - t0 )) s"
