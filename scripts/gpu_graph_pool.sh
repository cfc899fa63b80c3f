#!/usr/bin/env bash
# Decode graphs without allocation nodes (CACHET_GRAPH_MEMORY=pool, graph_pool.rs) against the
# capture's own allocation nodes (nodes), with programmatic dependent launch off / late / early,
# side by side in one call (issues 22 and 24). First the CUDA engine, MoE and KV-cache tests
# with the pool on (graph replays against eager steps, greedy equality under batching,
# chunking, caching and preemption; the MoE layer against the CPU reference and the fused router
# against the two-launch one), then `bench forward` batch-1 decode (ctx 512 / 4096) and one
# larger batch for each (memory, PDL) pair, rounds taken in turn, on SmolLM2 (real GGUF), the
# Llama-3-8B and Qwen3-30B-A3B shapes (dummy bf16 weights); Qwen also with ROUTERS.
# Carry .carry/{cachet,engine-tests,moe-tests,kv-int8-tests,kv-fp8-tests}.xz; SmolLM2's GGUF
# as /tmp/smollm2.gguf.
# CONFIGS="nodes:early pool:mixed ..." names (memory, PDL) pairs instead of MEMS × PDLS; the
# tests run with the pool and TEST_PDL (default early).
#   OUT=... [MEMS="nodes pool"] [PDLS="off early"] [CONFIGS=...] [ROUTERS="gemv fused"]
#   [ROUNDS=1] [MODELS="smollm2 llama3-8b qwen3-30b-a3b"; also llama3-8b-fp8] [TESTS=1] [TEST_PDL=early]
#   scripts/gpu_graph_pool.sh
source "$(dirname "$0")/gpu_common.sh"
configs=${CONFIGS:-}
if [ -z "$configs" ]; then
  for mem in ${MEMS:-nodes pool}; do for pdl in ${PDLS:-off early}; do configs="$configs $mem:$pdl"; done; done
fi
for b in kv-int8-tests kv-fp8-tests; do
  [ -x /tmp/$b ] || [ ! -f .carry/$b.xz ] || { xz -dc .carry/$b.xz > /tmp/$b && chmod +x /tmp/$b; }
done
if [ "${TESTS:-1}" = 1 ]; then
  for t in engine-tests moe-tests kv-int8-tests kv-fp8-tests; do
    [ -x /tmp/$t ] || continue
    [ $t = moe-tests ] || [ -f /tmp/smollm2.gguf ] || continue
    echo "== $t on CUDA, graph memory pool, PDL ${TEST_PDL:-early}"
    # The KV-cache tests' Qwen cases need Qwen's GGUF, which is not carried.
    skip=(); [ $t = moe-tests ] || [ $t = engine-tests ] || skip=(--skip qwen)
    CACHET_PDL=${TEST_PDL:-early} CACHET_GRAPH_MEMORY=pool timeout 240 /tmp/$t --ignored --test-threads 1 "${skip[@]}" 2>&1 \
      | tee "$out/$t-pool.txt" | grep -E "^test .*(ok|FAILED)$|test result|panicked" | tail -40
  done
fi
run() { # name, then bench forward's arguments
  local name=$1; shift
  echo "== $name" | tee -a "$out/summary.txt"
  CACHET_PDL=${pdl} CACHET_GRAPH_MEMORY=${mem} CACHET_MOE_ROUTER=${router:-gemv} timeout 150 \
    /tmp/cachet bench forward "$@" --device cuda --cached-prefix none --sampling-batches 1 \
    --graph-batches 1 --json-out "$out/forward-$name.json" 2>&1 | grep -v " INFO " \
    | tee "$out/forward-$name.txt" | grep -E "^\| decode batch|^CUDA graphs|WARN|rror" | tee -a "$out/summary.txt"
}
for r in $(seq 1 "${ROUNDS:-1}"); do
  for model in ${MODELS:-smollm2 llama3-8b qwen3-30b-a3b}; do
    case $model in
      smollm2) [ -f /tmp/smollm2.gguf ] || continue
        args=(--model /tmp/smollm2.gguf --decode-contexts 512,4096 --decode-batches 64 --decode-context 2048 --prefill 512);;
      llama3-8b) args=(--model examples/configs/llama3-8b.json --load-format dummy --decode-contexts 512,4096 \
        --decode-batches 64 --decode-context 2048 --prefill 512);;
      llama3-8b-fp8) args=(--model examples/configs/llama3-8b.json --load-format dummy --quantization fp8 \
        --kv-cache-dtype fp8 --decode-contexts 512,4096 --decode-batches 64 --decode-context 2048 --prefill 512);;
      *) args=(--model examples/configs/$model.json --load-format dummy --decode-contexts 512,4096 \
        --decode-batches 16 --decode-context 2048 --prefill 512);;
    esac
    routers=gemv
    case $model in *moe*|qwen3-30b*|mixtral*) routers=${ROUTERS:-gemv fused};; esac
    for router in $routers; do
      for c in $configs; do
        mem=${c%%:*} pdl=${c#*:}
        run "$model-$mem-pdl-$pdl-router-$router-r$r" "${args[@]}"
      done
    done
  done
done
