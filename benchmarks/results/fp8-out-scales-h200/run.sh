#!/usr/bin/env bash
# Session 40, call 3: an FP8 o_proj's / down's scales applied by the next norm (CACHET_FP8_OUT_SCALES
# norm vs separate): the CUDA tests, the step times alternated twice, the 8B's FP8 logits under
# each, then served (FP8 + FP8 KV) under each.
cd "$(dirname "$0")/.." && rm -f /tmp/cachet /tmp/moe-tests /tmp/families-tests && source scripts/gpu_common.sh
for t in fp8_output_scales fp8_norm fp8_weights fp8_glu; do
  timeout 150 /tmp/families-tests --ignored --test-threads 1 --nocapture $t 2>&1 | tee $out/families-$t.txt | grep -E "^test |test result|panicked|relative error" | tail -8
done
grep -E "differ" $out/families-fp8_output_scales.txt | head -40
timeout 200 /tmp/moe-tests --ignored --test-threads 1 2>&1 | tee $out/moe-cuda.txt | grep -E "^test |test result|panicked" | tail -6
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8 --decode-contexts 512 --decode-context 1280 --prefill 2048 --cached-prefix none --sampling-batches 1 --graph-batches 1 --decode-batches 16,32,64,128,256)
for r in 1 2; do for v in separate norm; do
  CACHET_FP8_OUT_SCALES=$v timeout 150 /tmp/cachet bench forward "${m[@]}" --json-out $out/forward-$v-r$r.json 2>&1 | grep -v " INFO " > $out/forward-$v-r$r.txt
  echo "$v r$r: $(grep -E '^\| (decode batch (16|32|64|128|256),|prefill)' $out/forward-$v-r$r.txt | awk -F'|' '{print $3}' | tr '\n' ' ')"
done; done
for v in separate norm; do
  CACHET_FP8_OUT_SCALES=$v timeout 100 /tmp/cachet bench forward "${m[@]:0:10}" --decode-batches 64 --decode-contexts 512 --decode-context 1280 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 --profile 2>&1 | grep -v " INFO " > $out/profile-$v.txt
  echo "== profile b64 $v"; grep -A14 "decode batch 64, ctx 1280 (device" $out/profile-$v.txt | grep -E "gemm|↳|add_rms|attention"
  CACHET_FP8_OUT_SCALES=$v timeout 120 /tmp/cachet bench kv-fp8 --compare weights "${m[@]:0:6}" --tokenizer .carry/smollm2-tokenizer.gguf --contexts 512,2048 --json-out $out/fp8w-$v.json 2>&1 | grep -v " INFO " > $out/fp8w-$v.txt
done
cmp $out/fp8w-separate.json $out/fp8w-norm.json && echo "FP8-weight logits: identical JSON under both" || diff <(grep -v _ms $out/fp8w-separate.json) <(grep -v _ms $out/fp8w-norm.json) | head -20
for v in separate norm; do
  CACHET_FP8_OUT_SCALES=$v OUT=$out/serve TAG=$v RUNS=fp8 TOKENIZER=.carry/smollm2-tokenizer.gguf T=200 bash scripts/gpu_serve_bench.sh 2>&1 | grep -E "Output token throughput|Failed|Successful|step limits|^==" 
done
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
