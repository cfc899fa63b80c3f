source scripts/gpu_common.sh >/dev/null
base=(--model examples/configs/llama3-8b.json --load-format dummy --quantization fp8 --device cuda --cached-prefix none --sampling-batches 1 --graph-batches 1 --decode-contexts 512 --decode-context 512 --prefill 128 --max-model-len 8192)
run() { local name=$1; shift; echo "== $name"; env "$@" CACHET_DIAG_LT=1 timeout 150 /tmp/cachet bench forward "${base[@]}" $SZ > $OUT/$name.txt 2>&1; grep -E "DIAG|rror|decode batch" $OUT/$name.txt | sed 's/.*DIAG lt: //' | cut -c1-300 | head -4; }
SZ="--decode-batches 256 --cuda-graph-sizes 256" run pool-noscales CACHET_GRAPH_MEMORY=pool CACHET_DIAG_POOL_FP8=1
SZ="--decode-batches 256 --cuda-graph-sizes 256" run pool-scales CACHET_GRAPH_MEMORY=pool CACHET_DIAG_POOL_FP8=1 CACHET_DIAG_SCALES=1
SZ="--decode-batches 1,256" run pool-scales-all CACHET_GRAPH_MEMORY=pool CACHET_DIAG_POOL_FP8=1 CACHET_DIAG_SCALES=1
SZ="--decode-batches 1,256" run nodes-scales-all CACHET_DIAG_SCALES=1
