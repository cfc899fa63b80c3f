#!/usr/bin/env bash
# The batched-tail GEMV (.carry-k/v4/gemv.cu, now kernels/src/gemv.cu) against the built-in one,
# from the repository root on the GPU machine:  OUT=... bash benchmarks/results/gemv-row-loops-h200/run-tail.sh
# base vs v4 (GEMV tails batched): MoE and families tests with v4, then bench rounds.
source scripts/gpu_common.sh >/dev/null
d=$out/gemv-tail; mkdir -p $d
for t in moe-tests families-tests; do
  echo "== $t with v4" | tee -a $d/summary.txt
  CACHET_KERNEL_DIR=$PWD/.carry-k/v4 timeout 200 /tmp/$t --ignored --test-threads 1 2>&1 | tee $d/$t-v4.txt \
    | grep -E "^test .*FAILED$|test result|panicked" | tee -a $d/summary.txt
done
bench() { # variant model quant
  local v=$1 model=$2 q=$3 kd=()
  [ $v = base ] || kd=(env CACHET_KERNEL_DIR=$PWD/.carry-k/$v)
  echo "== r$r $v $model $q" | tee -a $d/summary.txt
  "${kd[@]}" timeout 150 /tmp/cachet bench forward --model examples/configs/$model.json --load-format dummy \
    --quantization $q --device cuda --cached-prefix none --sampling-batches 1 --graph-batches 1 \
    --decode-contexts 512 --decode-context 512 --decode-batches 1,4 --prefill 128 --max-model-len 4096 \
    > $d/$v-$model-$q-r$r.txt 2>&1
  grep -E "^\| decode batch|rror" $d/$v-$model-$q-r$r.txt | cut -c1-200 | tee -a $d/summary.txt
}
for r in 1 2; do
  for v in base v4; do
    bench $v llama3-8b fp8; bench $v llama3-8b none; bench $v qwen3-30b-a3b none
  done
done
