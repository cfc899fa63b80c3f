#!/usr/bin/env bash
# Session 40: decode steps filling half a wave left unsplit (the new default, fill_percent 50) against
# the rule off (CACHET_ATTENTION_SPLIT=64,64,2,64,1,0: the previous plan), one binary; then the seed
# TTFT experiment's all on (warm, at the rate measured earlier in the session) under each.
cd "$(dirname "$0")/.." && rm -f /tmp/cachet && source scripts/gpu_common.sh
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --decode-contexts 512 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 --decode-batches 16,24,32,48)
run() {  # rule ctx dtype round
  local e=(); [ $1 = off ] && e=(CACHET_ATTENTION_SPLIT=64,64,2,64,1,0)
  local x=(); [ $3 = fp8 ] && x=(--quantization fp8 --kv-cache-dtype fp8)
  env "${e[@]}" timeout 100 /tmp/cachet bench forward "${m[@]}" --decode-context $2 "${x[@]}" 2>&1 | grep -v " INFO " > $out/fill-$1-$3-ctx$2-r$4.txt
  echo "$1 $3 ctx$2 r$4: $(grep -E '^\| decode batch (16|24|32|48),' $out/fill-$1-$3-ctx$2-r$4.txt | awk -F'|' '{print $3}' | tr '\n' ' ')"
}
for r in 1 2; do for q in fp8 bf16; do run off 1280 $q $r; run on 1280 $q $r; done; done
for q in fp8 bf16; do run off 4096 $q 1; run on 4096 $q 1; done
for rule in off on; do
  e=(); [ $rule = off ] && e=(CACHET_ATTENTION_SPLIT=64,64,2,64,1,0)
  env "${e[@]}" OUT=$out TTFT_DIR=ttft-$rule CACHET=/tmp/cachet TOKENIZER=.carry/smollm2-tokenizer.gguf RATE=74.9 CONFIGS=all-on MODES=warm REQUESTS=1200 timeout 150 bash scripts/gpu_ttft.sh 2>&1 | grep -E "^\| all-on" 
done
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
