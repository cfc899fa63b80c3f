#!/usr/bin/env bash
# Which decode graphs go wrong with the graph memory pool and FP8 weights on the Llama-3-8B shape
# (an illegal address at the first decode step; SmolLM2 with FP8 weights and the 8B with an FP8
# cache pass; each graph size alone at --max-model-len 1024 passes): graph sizes and context
# lengths varied, then compute-sanitizer on the first case that fails.
#   OUT=... scripts/gpu_graph_pool_diag.sh
source "$(dirname "$0")/gpu_common.sh" >/dev/null
d=$out/diag2; mkdir -p $d
base=(--model examples/configs/llama3-8b.json --load-format dummy --quantization fp8 --device cuda
  --cached-prefix none --sampling-batches 1 --graph-batches 1 --decode-contexts 512 --decode-context 512
  --prefill 128 --decode-batches 1)
first=
cases=("all-1k|--max-model-len 1024" "g1-8k|--cuda-graph-sizes 1 --max-model-len 8192"
  "g1-32k|--cuda-graph-sizes 1 --max-model-len 32768" "g1-default|--cuda-graph-sizes 1"
  "g1-4-default|--cuda-graph-sizes 1,2,4" "all-8k|--max-model-len 8192")
for c in "${cases[@]}"; do
  name=${c%%|*}; read -ra extra <<< "${c#*|}"
  echo "== $name: ${extra[*]}" | tee -a $d/summary.txt
  CACHET_GRAPH_MEMORY=pool timeout 100 /tmp/cachet bench forward "${base[@]}" "${extra[@]}" > $d/$name.txt 2>&1
  grep -E "^\| decode batch|rror|CUDA graphs|max_model_len|KV blocks" $d/$name.txt | cut -c1-220 | tee -a $d/summary.txt
  grep -q "rror" $d/$name.txt && [ -z "$first" ] && first=$c
done
if [ -n "$first" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  read -ra extra <<< "${first#*|}"
  echo "== compute-sanitizer: ${first%%|*}" | tee -a $d/summary.txt
  CACHET_GRAPH_MEMORY=pool timeout 300 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 3 \
    /tmp/cachet bench forward "${base[@]}" "${extra[@]}" > $d/sanitizer.txt 2>&1
  grep -v " INFO " $d/sanitizer.txt | head -60 | cut -c1-300
fi
