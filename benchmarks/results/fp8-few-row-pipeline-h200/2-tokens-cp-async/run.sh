#!/usr/bin/env bash
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
rm -f /tmp/families-tests /tmp/cachet; xz -dc .carry/families-tests.xz > /tmp/families-tests; xz -dc .carry/cachet.xz > /tmp/cachet; chmod +x /tmp/families-tests /tmp/cachet
m=(--model examples/configs/llama3-8b.json --load-format dummy --device cuda --quantization fp8 --kv-cache-dtype fp8)
for v in off on; do
  CACHET_FP8_SKINNY=$v timeout 100 /tmp/cachet bench forward "${m[@]}" --decode-contexts 512 --decode-batches 16,32,64 --decode-context 1280 --prefill 256 --cached-prefix none --sampling-batches 1 --graph-batches 1 --json-out $out/fwd-$v.json 2>&1 | grep -v " INFO " > $out/fwd-$v.txt
  echo "== skinny $v"; grep -E "^\| (decode batch)" $out/fwd-$v.txt | awk -F'|' '{print $2 "|" $3 "|" $6}'
done
timeout 90 /tmp/families-tests --ignored --test-threads 1 --nocapture fp8_products_of_a_few_rows 2>&1 | tee $out/families-skinny.txt | grep -E "^test |test result|panicked|ours vs" | tail -30
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
