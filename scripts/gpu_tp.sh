#!/usr/bin/env bash
# Tensor parallelism over NCCL on the GPU machine (issue 23). Carry .carry/cachet.xz and
# .carry/tp-tests.xz (the tensor_parallel test binary, stripped and xz'd).
# - NCCL: the system libnccl.so.2, else the one torch's wheels bring (nvidia-nccl), named by
#   CACHET_NCCL_LIBRARY; its version and the GPUs' topology are logged.
# - The CUDA tests of tests/tensor_parallel.rs: the dummy generator's parts, one GPU as a group of
#   one through NCCL (eager and in decode graphs), two GPUs against transformers and one GPU (it
#   says it skipped where fewer than two are visible).
# - With two GPUs or more (nvidia-h200-x2) and BENCH=1: `bench forward` on the Llama-3-8B shape
#   with TP=1 then TP=2 (decode batch 1 at ctx 512 / 4096, batches 16 / 64 at ctx 2048, prefill
#   512 / 4096), the Llama-3-70B shape over two GPUs (decode batch 1, batch 64, prefill 4096,
#   --profile), and decode batch 1 of the 70B under NCCL_PROTO=LL / LL128 / Simple.
#   OUT=... [BENCH=1] scripts/gpu_tp.sh
source "$(dirname "$0")/gpu_common.sh"
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export CACHET_NCCL_LIBRARY=$lib
fi
{ echo "NCCL: ${CACHET_NCCL_LIBRARY:-system}"; ldconfig -p | grep nccl; nvidia-smi topo -m; } 2>&1 | tee "$out/nccl.txt"
gpus=$(nvidia-smi -L | wc -l)
[ -x /tmp/tp-tests ] && /tmp/tp-tests --ignored --test-threads 1 --nocapture 2>&1 | tee "$out/tp-tests.txt"
[ "${BENCH:-0}" = 1 ] && [ "$gpus" -ge 2 ] || exit 0
fwd() {  # name, then flags
  local name=$1; shift
  echo "== $name: $*"
  /tmp/cachet bench forward --load-format dummy --device cuda "$@" 2>&1 | grep -v ' INFO ' | tee "$out/forward-$name.txt"
}
common="--decode-contexts 512,4096 --decode-batches 16,64 --decode-context 2048 --prefill 512,4096"
fwd 8b-tp1 --model examples/configs/llama3-8b.json $common
fwd 8b-tp2 --model examples/configs/llama3-8b.json $common --tensor-parallel-size 2
fwd 70b-tp2 --model examples/configs/llama3-70b.json --tensor-parallel-size 2 \
  --decode-contexts 512,4096 --decode-batches 64 --decode-context 2048 --prefill 4096 --profile
for p in LL LL128 Simple; do
  NCCL_PROTO=$p fwd 70b-tp2-$p --model examples/configs/llama3-70b.json --tensor-parallel-size 2 \
    --decode-contexts 512 --decode-batches 64 --decode-context 2048 --prefill 512
done
