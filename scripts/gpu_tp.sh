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
# - With two GPUs and SERVE=1: the serving benchmark on the 8B shape (dummy weights), one
#   `cachet serve --tensor-parallel-size 2` against a gateway in front of two `cachet worker`s
#   (one GPU each, CUDA_VISIBLE_DEVICES), side by side, at two loads: 16 in flight (64 requests of
#   750 / 256 tokens: per-token latency) and 256 in flight (N=600 of 750 / 1,000: throughput).
#   TOKENIZER (default tests/fixtures/tiny-mixtral.gguf, in the tree) and ID_RANGE as in
#   gpu_serve_bench.sh.
#   OUT=... [BENCH=1] [SERVE=1] scripts/gpu_tp.sh
source "$(dirname "$0")/gpu_common.sh"
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [ -n "$lib" ] && [ -f "$lib" ] && export CACHET_NCCL_LIBRARY=$lib
fi
{ echo "NCCL: ${CACHET_NCCL_LIBRARY:-system}"; ldconfig -p | grep nccl; nvidia-smi topo -m; } 2>&1 | tee "$out/nccl.txt"
gpus=$(nvidia-smi -L | wc -l)
[ -x /tmp/tp-tests ] && /tmp/tp-tests --ignored --test-threads 1 --nocapture 2>&1 | tee "$out/tp-tests.txt"
[ "$gpus" -ge 2 ] || exit 0
if [ "${SERVE:-0}" = 1 ]; then
  key=sk-bench
  printf '[[tenant]]\nid = "bench"\napi_key_sha256 = ["%s"]\n' "$(printf $key | sha256sum | cut -d' ' -f1)" > /tmp/tenants.toml
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > /tmp/hash.key
  model="--model examples/configs/llama3-8b.json --load-format dummy --tokenizer ${TOKENIZER:-tests/fixtures/tiny-mixtral.gguf}"
  up() {  # url, log: waits for /health
    for i in $(seq 1 240); do curl -sf "$1/health" > /dev/null && return 0; sleep 1; done
    echo "$1 did not start"; tail -20 "$2"; return 1
  }
  loads() {  # layout name
    for load in "16 64 256" "256 ${N:-600} 1000"; do
      set -- $load
      timeout 300 /tmp/cachet bench serve --base-url http://127.0.0.1:18100 --api-key $key \
        --dataset random --input-len 750 --output-len $3 --num-prompts $2 --max-concurrency $1 \
        --ignore-eos --id-range ${ID_RANGE:-3,299} --json-out "$out/serve-$layout-c$1.json" 2>&1 \
        | tee "$out/serve-$layout-c$1.txt" | grep -E "Output token throughput|Median TPOT|Median TTFT|Failed"
    done
  }
  layout=tp2; echo "== $layout"
  /tmp/cachet serve $model --device cuda --tensor-parallel-size 2 --config /tmp/tenants.toml \
    --listen 127.0.0.1:18100 > "$out/serve-tp2.log" 2>&1 &
  up http://127.0.0.1:18100 "$out/serve-tp2.log" && loads
  kill %1; wait
  layout=2xtp1; echo "== $layout"
  for g in 0 1; do
    CUDA_VISIBLE_DEVICES=$g /tmp/cachet worker $model --device cuda --hash-key-file /tmp/hash.key \
      --listen 127.0.0.1:1900$g > "$out/worker-$g.log" 2>&1 &
  done
  up http://127.0.0.1:19000 "$out/worker-0.log" && up http://127.0.0.1:19001 "$out/worker-1.log" && {
    /tmp/cachet serve $model --config /tmp/tenants.toml --hash-key-file /tmp/hash.key \
      --worker http://127.0.0.1:19000 --worker http://127.0.0.1:19001 --listen 127.0.0.1:18100 \
      > "$out/gateway.log" 2>&1 &
    up http://127.0.0.1:18100 "$out/gateway.log" && loads
  }
  kill $(jobs -p) 2>/dev/null; wait
fi
[ "${BENCH:-0}" = 1 ] || exit 0
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
