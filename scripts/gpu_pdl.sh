#!/usr/bin/env bash
# Programmatic dependent launch in decode graphs, side by side in one call (issues 22 and 24):
# the CUDA engine and MoE tests with it on (graph replays against eager steps, the MoE layer
# against the CPU reference), then `bench forward` with CACHET_PDL=off (plain graph edges, as
# before), late and early (the default) on SmolLM2 (real GGUF, the most launch-bound), the
# Llama-3-8B shape and the Qwen3-30B-A3B shape (dummy bf16 weights).
# Carry .carry/{cachet,engine-tests,moe-tests}.xz (and kv-int8-tests / kv-fp8-tests to run the
# INT8 and FP8 cache tests with it too); SmolLM2's GGUF as /tmp/smollm2.gguf.
#   OUT=... [MODES="off late early"] scripts/gpu_pdl.sh
source "$(dirname "$0")/gpu_common.sh"
modes=${MODES:-off late early}
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== which programmatic edges the driver takes (scripts/pdl_probe)"
  ( cd "$(dirname "$0")/pdl_probe" && export PATH=/usr/local/cuda/bin:$PATH &&
    nvcc -cubin -arch=sm_90 kernels.cu -o /tmp/pdl-kernels.cubin &&
    g++ probe.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -o /tmp/pdl-probe &&
    cd /tmp && cp pdl-kernels.cubin kernels.cubin && ./pdl-probe ) 2>&1 | tee "$out/pdl-probe.txt"
fi
if [ -x /tmp/engine-tests ] && [ -f /tmp/smollm2.gguf ]; then
  echo "== engine tests on CUDA (PDL early)"
  timeout 240 /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "^test |test result|panicked"
fi
if [ -x /tmp/moe-tests ]; then
  echo "== MoE tests on CUDA (PDL early)"
  timeout 240 /tmp/moe-tests --ignored --test-threads 1 2>&1 | tee "$out/moe-cuda.txt" | grep -E "^test |test result|panicked"
fi
for b in kv-int8-tests kv-fp8-tests; do
  [ -x /tmp/$b ] || [ ! -f .carry/$b.xz ] || { xz -dc .carry/$b.xz > /tmp/$b && chmod +x /tmp/$b; }
  if [ -x /tmp/$b ] && [ -f /tmp/smollm2.gguf ]; then
    echo "== $b on CUDA (PDL early)"
    timeout 240 /tmp/$b --ignored --test-threads 1 --skip qwen 2>&1 | tee "$out/$b-cuda.txt" | grep -E "test result|panicked"
  fi
done
bench() { # name, then bench forward's arguments
  local name=$1; shift
  for pdl in $modes; do
    echo "== $name, CACHET_PDL=$pdl"
    CACHET_PDL=$pdl timeout 150 /tmp/cachet bench forward "$@" --device cuda --cached-prefix none \
      --sampling-batches 1 --graph-batches 1 --json-out "$out/forward-$name-pdl-$pdl.json" 2>&1 \
      | grep -v " INFO " | tee "$out/forward-$name-pdl-$pdl.txt" | grep -E "^\| (decode|batch 1 )|^CUDA graphs|WARN"
  done
}
[ ! -f /tmp/smollm2.gguf ] || bench smollm2 --model /tmp/smollm2.gguf --decode-contexts 512,4096 \
  --decode-batches 16,64 --decode-context 2048 --prefill 512
bench llama3-8b --model examples/configs/llama3-8b.json --load-format dummy --decode-contexts 512,4096 \
  --decode-batches 64,256 --decode-context 2048 --prefill 512
bench qwen3-30b-a3b --model examples/configs/qwen3-30b-a3b.json --load-format dummy \
  --decode-contexts 512,4096 --decode-batches 16,64 --decode-context 2048 --prefill 512
