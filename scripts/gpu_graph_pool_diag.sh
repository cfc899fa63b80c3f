source scripts/gpu_common.sh >/dev/null
d=$out/diag; mkdir -p $d
one() { # name, env, args
  local name=$1 envs=$2; shift 2
  echo "== $name ($envs)" | tee -a $d/summary.txt
  env $envs timeout 120 /tmp/cachet bench forward "$@" --device cuda --cached-prefix none --sampling-batches 1 \
    --graph-batches 1 --decode-contexts 512 --decode-batches 4 --decode-context 512 --prefill 128 > $d/$name.txt 2>&1
  grep -v " INFO " $d/$name.txt | grep -E "^\| decode|rror" | tee -a $d/summary.txt
}
one smol-fp8w-pool "CACHET_GRAPH_MEMORY=pool" --model /tmp/smollm2.gguf --quantization fp8
one smol-fp8kv-pool "CACHET_GRAPH_MEMORY=pool" --model /tmp/smollm2.gguf --kv-cache-dtype fp8
one l8-fp8w-pool "CACHET_GRAPH_MEMORY=pool" --model examples/configs/llama3-8b.json --load-format dummy --quantization fp8
one l8-fp8kv-pool "CACHET_GRAPH_MEMORY=pool" --model examples/configs/llama3-8b.json --load-format dummy --kv-cache-dtype fp8
one l8-fp8w-pool-off "CACHET_GRAPH_MEMORY=pool CACHET_PDL=off" --model examples/configs/llama3-8b.json --load-format dummy --quantization fp8
if grep -q "rror" $d/smol-fp8w-pool.txt && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  echo "== sanitizer on smol-fp8w-pool"
  CACHET_GRAPH_MEMORY=pool timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 5 \
    /tmp/cachet bench forward --model /tmp/smollm2.gguf --quantization fp8 --device cuda --cached-prefix none \
    --sampling-batches 1 --graph-batches 1 --decode-contexts 512 --decode-batches 4 --decode-context 512 --prefill 128 \
    > $d/sanitizer.txt 2>&1; grep -v " INFO " $d/sanitizer.txt | head -60
fi
