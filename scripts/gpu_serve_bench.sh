#!/usr/bin/env bash
# The serving benchmark on the H200 (issue 22): `cachet serve` on the Llama-3-8B shape (dummy bf16
# weights, SmolLM2's tokenizer) loaded by `cachet bench serve` — 1,000 requests of 750 prompt /
# 1,000 output tokens (ignore_eos), 256 in flight — once with the default flags (the step limits
# chosen for the device) and once with the CPU-sized limits that were the defaults before
# (--max-num-seqs 64 --max-num-batched-tokens 2048), one after the other; RUNS picks others:
# fp8-weights (--quantization fp8), kv-fp8 (--kv-cache-dtype fp8), kv-int8 (--kv-cache-dtype int8),
# fp8 (both).
# Carry .carry/cachet.xz; SmolLM2's GGUF as /tmp/smollm2.gguf (an earlier carry), or name another
# tokenizer source: TOKENIZER=tests/fixtures/tiny-mixtral.gguf (in the tree; prompts are token ids
# either way, the tokenizer only turns the generated ids into text; the gateway refuses prompt ids
# outside its vocabulary, so give a range inside it: ID_RANGE=3,299 for tiny-mixtral's 300).
# BIN names another server binary (default /tmp/cachet) and TAG is added to each run's file names,
# for binaries side by side; each run also keeps the engine's step and gap counters from /metrics.
# CONC sets the requests in flight (default 256).
#   OUT=... [N=1000] [CONC=256] [RUNS="defaults fp8"] [TOKENIZER=smollm2] [ID_RANGE=1000,10000] [BIN=/tmp/cachet-x TAG=x] scripts/gpu_serve_bench.sh
source "$(dirname "$0")/gpu_common.sh"
key=sk-bench
printf '[[tenant]]\nid = "bench"\napi_key_sha256 = ["%s"]\n' "$(printf $key | sha256sum | cut -d' ' -f1)" > /tmp/tenants.toml
serve() {  # name, then model flags
  local name=$1; shift
  ${BIN:-/tmp/cachet} serve "$@" --device cuda --config /tmp/tenants.toml --listen 127.0.0.1:18100 > "$out/serve-$name.log" 2>&1 &
  for i in $(seq 1 180); do curl -sf localhost:18100/health > /dev/null && return 0; sleep 1; done
  echo "serve ($name) did not start"; tail -20 "$out/serve-$name.log"; return 1
}
run() {  # name, then server flags
  local name=$1${TAG:+-$TAG}; shift
  echo "== $name: $*"
  serve "$name" --model examples/configs/llama3-8b.json --load-format dummy --tokenizer ${TOKENIZER:-smollm2} "$@" && {
    grep -o 'step limits.*' "$out/serve-$name.log" | sed 's/\x1b\[[0-9;]*m//g'
    timeout ${T:-260} /tmp/cachet bench serve --base-url http://127.0.0.1:18100 --api-key $key \
      --dataset random --input-len 750 --output-len 1000 --num-prompts ${N:-1000} --max-concurrency ${CONC:-256} \
      --ignore-eos --id-range ${ID_RANGE:-1000,10000} --json-out "$out/bench-serve-$name.json" 2>&1 | tee "$out/bench-serve-$name.txt"
    curl -s localhost:18100/metrics | grep -E "^cachet_engine_step" | tee "$out/steps-$name.txt"
    kill %1; wait
  }
}
for r in ${RUNS:-defaults cpu-sized-limits}; do
  case $r in
    defaults) run defaults ;;
    cpu-sized-limits) run cpu-sized-limits --max-num-seqs 64 --max-num-batched-tokens 2048 ;;
    fp8-weights) run fp8-weights --quantization fp8 ;;
    kv-fp8) run kv-fp8 --kv-cache-dtype fp8 ;;
    kv-int8) run kv-int8 --kv-cache-dtype int8 ;;
    fp8) run fp8 --quantization fp8 --kv-cache-dtype fp8 ;;
    *) echo "unknown run $r" ;;
  esac
done
