#!/usr/bin/env bash
# Two weight rows in flight per warp in the batch-1 GEMVs (issue 22 / 24), variants of gemv.cu
# swapped in through CACHET_KERNEL_DIR (.kvar-g/<v>/gemv.cu: kernels/src/gemv.cu with its
# GEMV_PAIR_UNROLL_F8 / GEMV_ROW_PAIRS switches set), one binary, from the repository root on the
# GPU machine:  OUT=... [TESTS=1] [ROUNDS="1"] [VARIANTS="base A D E"] bash benchmarks/results/gemv-pairs-h200/run.sh
#   A: row_dot2 streams 8 units of each row a pass for FP8 (gate|up: a whole 4096-wide row)
#   D: the plain and norm GEMVs give a warp two weight rows at once (row_dot2), both formats
#   E: A + D
source scripts/gpu_common.sh >/dev/null
d=/tmp/gemv-pairs; mkdir -p $d
if [ "${TESTS:-1}" = 1 ]; then
  for t in moe-tests families-tests; do
    echo "== $t with E" | tee -a $d/summary.txt
    CACHET_KERNEL_DIR=$PWD/.kvar-g/E timeout 240 /tmp/$t --ignored --test-threads 1 2>&1 | tee $d/$t-E.txt \
      | grep -E "^test .*FAILED$|test result|panicked" | tee -a $d/summary.txt
  done
fi
bench() { # variant model quant round
  local v=$1 model=$2 q=$3 r=$4 kd=()
  [ $v = base ] || kd=(env CACHET_KERNEL_DIR=$PWD/.kvar-g/$v)
  echo "== r$r $v $model $q" | tee -a $d/summary.txt
  "${kd[@]}" timeout 150 /tmp/cachet bench forward --model examples/configs/$model.json --load-format dummy \
    --quantization $q --device cuda --cached-prefix none --sampling-batches 1 --graph-batches 1 \
    --decode-contexts 512,4096 --decode-context 512 --decode-batches 2 --prefill 128 --max-model-len 8192 \
    > $d/$v-$model-$q-r$r.txt 2>&1
  grep -E "^\| decode batch|rror" $d/$v-$model-$q-r$r.txt | cut -c1-160 | tee -a $d/summary.txt
}
for r in ${ROUNDS:-1}; do
  for v in ${VARIANTS:-base A D E}; do
    bench $v llama3-8b fp8 $r; bench $v llama3-8b none $r; bench $v qwen3-30b-a3b none $r
  done
done
tar czf $out/gemv-pairs-$(date +%H%M%S).tgz -C /tmp gemv-pairs; cp $d/summary.txt $out/
