source scripts/gpu_common.sh >/dev/null
base=(--model examples/configs/llama3-8b.json --load-format dummy --quantization fp8 --device cuda --cached-prefix none --sampling-batches 1 --graph-batches 1 --decode-contexts 512 --decode-context 512 --prefill 128 --max-model-len 8192 --decode-batches 256 --cuda-graph-sizes 256)
CACHET_GRAPH_MEMORY=pool CACHET_DIAG_POOL_FP8=1 CACHET_DIAG_LT=1 timeout 150 /tmp/cachet bench forward "${base[@]}" > $OUT/memset.txt 2>&1
grep -E "DIAG" $OUT/memset.txt | sed 's/.*DIAG lt: //' | grep -E "memset|m=28672" | head -6 | cut -c1-700; grep -E "rror" $OUT/memset.txt | head -2
