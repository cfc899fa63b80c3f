#!/usr/bin/env bash
# Structured outputs on the GPU machine (issue 19): the CUDA test variants (incl. the
# grammar-constrained engine test), the schema corpus through `cachet serve` on SmolLM2, and the
# grammar's cost per decode step (mean inter-token latency, unconstrained vs json_schema, side by
# side) on SmolLM2 and on the 8B shape (dummy bf16 weights). $CARRY holds the binaries,
# smollm2.gguf, the jsonschema sdist (the corpus) and the validator's wheels (whl/); logs to $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
c=${CARRY:-/tmp/c}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CACHET_CACHE_DIR=${CACHET_CACHE_DIR:-/tmp/cachet-cache}
mkdir -p "$CACHET_CACHE_DIR/models/smollm2"
cp "$c/smollm2.gguf" "$CACHET_CACHE_DIR/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$c"/whl/*.whl && export PYTHONPATH=/tmp/site
for t in sampling engine; do
  echo "== $t tests on CUDA"
  timeout 200 "$c/$t-tests" --ignored --test-threads 1 > "$out/$t-cuda.txt" 2>&1
  grep -E "^test |test result|panicked" "$out/$t-cuda.txt" | grep -v " ok$"
done
key=sk-bench
printf '[[tenant]]\nid = "bench"\napi_key_sha256 = ["%s"]\n' "$(printf $key | sha256sum | cut -d' ' -f1)" > /tmp/tenants.toml
serve() {  # port, then model flags
  local port=$1; shift
  "$c/cachet" serve "$@" --device cuda --config /tmp/tenants.toml --listen 127.0.0.1:$port > "$out/serve-$port.log" 2>&1 &
  for i in $(seq 1 120); do curl -sf localhost:$port/health > /dev/null && return 0; sleep 1; done
  echo "serve on $port did not start"; tail -20 "$out/serve-$port.log"; return 1
}
echo "== SmolLM2: the JSON-Schema-Test-Suite corpus, then the per-step cost"
serve 18001 --model smollm2 && {
  for mt in 128 1024; do
    timeout 240 python3 scripts/structured_bench.py corpus --base http://127.0.0.1:18001 --key $key \
      --sdist "$c/jsonschema.tar.gz" --workers 32 --max-tokens $mt --out "$out/corpus-$mt.json" 2>&1 | tee "$out/corpus-$mt.txt"
  done
  timeout 150 python3 scripts/structured_bench.py overhead --base http://127.0.0.1:18001 --key $key \
    --concurrency 1,64 --reps 3 --max-tokens 128 --out "$out/overhead-smollm2.json" 2>&1 | tee "$out/overhead-smollm2.txt"
  kill %1; wait
}
echo "== 8B shape (dummy weights): the per-step cost"
serve 18002 --model examples/configs/llama3-8b.json --load-format dummy --tokenizer "$c/smollm2.gguf" && {
  timeout 150 python3 scripts/structured_bench.py overhead --base http://127.0.0.1:18002 --key $key --model llama3-8b \
    --concurrency 1,64 --reps 3 --max-tokens 128 --out "$out/overhead-8b.json" 2>&1 | tee "$out/overhead-8b.txt"
  kill %1; wait
}
echo "== token selection on the 8B shape (512-thread selection blocks)"
timeout 200 "$c/cachet" bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
  --decode-batches 1 --decode-contexts 512 --prefill 512 --cached-prefix none --graph-batches 1 \
  --sampling-batches 1,16,64,256 --json-out "$out/bench-sampling.json" 2>&1 | grep -A6 "| decode step, ctx 512 | greedy" | tee "$out/bench-sampling.txt"
