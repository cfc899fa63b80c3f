#!/usr/bin/env bash
# The GEMV variants of README.md against the built-in kernels, from the repository root on the
# GPU machine (the variant sources in .carry-k/v1..v3/gemv.cu):  OUT=... bash run.sh
source scripts/gpu_common.sh >/dev/null
d=$out/gemv; mkdir -p $d
for round in 1 2; do
for v in base ${GEMV_VARIANTS:-v1 v2 v3}; do
  for q in fp8 none; do
    kd=(); [ $v = base ] || kd=(env CACHET_KERNEL_DIR=$PWD/.carry-k/$v)
    echo "== r$round $v weights=$q" | tee -a $d/summary.txt
    "${kd[@]}" timeout 150 /tmp/cachet bench forward --model examples/configs/llama3-8b.json --load-format dummy \
      --quantization $q --device cuda --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      --decode-contexts 512 --decode-context 512 --decode-batches 1,4 --prefill 128 --max-model-len 4096 \
      > $d/$v-$q-r$round.txt 2>&1
    grep -E "^\| decode batch|rror" $d/$v-$q-r$round.txt | cut -c1-200 | tee -a $d/summary.txt
  done
done
done
for round in 1 2; do
for v in base v1; do
    kd=(); [ $v = base ] || kd=(env CACHET_KERNEL_DIR=$PWD/.carry-k/$v)
    echo "== qwen r$round $v" | tee -a $d/summary.txt
    "${kd[@]}" timeout 150 /tmp/cachet bench forward --model examples/configs/qwen3-30b-a3b.json --load-format dummy \
      --device cuda --cached-prefix none --sampling-batches 1 --graph-batches 1 \
      --decode-contexts 512 --decode-context 512 --decode-batches 1,4 --prefill 128 --max-model-len 4096 \
      > $d/qwen-$v-r$round.txt 2>&1
    grep -E "^\| decode batch|rror" $d/qwen-$v-r$round.txt | cut -c1-200 | tee -a $d/summary.txt
done
done
