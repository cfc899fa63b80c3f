#!/usr/bin/env bash
# Everything the H200 session runs, in one call: fidelity table, then the forward benchmarks
# (8B shape, dummy bf16 weights) with the PyTorch peer. Logs go to $OUT (or ./gpu-out).
# Test binaries, when carried in .carry (engine-tests, sampling-tests: built with
# `cargo test --release -p cachet-tests --test engine --test sampling --no-run`), run on CUDA first.
# FIDELITY=0, PEER=0, SIMT=0, NCU=0, ATTN=0, FORWARD=0, SPEC=0, KVFP8=0, GEMVAB=0 skip parts;
# TTFT=1 runs scripts/gpu_ttft.sh at the end (its environment: RATE, REQUESTS, ABLATION, MODES).
# The fidelity step loads the GGUF in transformers, which needs the `gguf` package: carry its
# wheel in .whl/ (`pip download --no-deps -d .whl gguf`; the machine has no index).
#   CACHET=.carry/cachet GGUF=.carry/smollm2.gguf scripts/gpu_run.sh
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CACHET_CACHE_DIR=${CACHET_CACHE_DIR:-/tmp/cachet-cache}
export PYTHONUNBUFFERED=1
bin=${CACHET:-.carry/cachet}
if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; fi
gguf=${GGUF:-.carry/smollm2.gguf}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
echo "== generate on CUDA"
"$bin" generate --model "$gguf" --device cuda --chat --prompt "What is the capital of France?" --max-tokens 24 2>&1 | tee "$out/generate.txt"
if [ -x .carry/engine-tests ]; then
  # Built here with: cargo test --release -p cachet-tests --test engine --no-run (then stripped).
  echo "== engine-core tests on CUDA"
  mkdir -p "$CACHET_CACHE_DIR/models/smollm2" && cp "$gguf" "$CACHET_CACHE_DIR/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  .carry/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt"
fi
if [ -x .carry/sampling-tests ]; then
  echo "== GPU sampling against the host distribution"
  .carry/sampling-tests --ignored --test-threads 1 2>&1 | tee "$out/sampling-cuda.txt"
fi
if [ -x .carry/speculative-tests ]; then
  echo "== speculative decoding tests on CUDA"
  .carry/speculative-tests --ignored --test-threads 1 2>&1 | tee "$out/speculative-cuda.txt"
fi
if [ -x .carry/kv-fp8-tests ]; then
  # --ignored runs the `::cuda` variants only (the codec test needs PyPI: CI runs it).
  echo "== FP8 KV cache tests on CUDA (tensor-core kernels, then the CUDA-core kernel)"
  { .carry/kv-fp8-tests --ignored --test-threads 1 --nocapture 2>&1
    CACHET_ATTENTION=simt .carry/kv-fp8-tests --ignored --test-threads 1 --nocapture 2>&1; } | tee "$out/kv-fp8-cuda.txt"
fi
if [ "${ATTN:-1}" = 1 ]; then
  echo "== attention kernels vs the CPU reference (random GQA models, d64 and d128)"
  CACHET="$bin" KV="auto fp8" bash scripts/gpu_attention_check.sh 2>&1 | tee "$out/attention-check.txt"
fi
if [ "${FIDELITY:-1}" = 1 ]; then
  echo "== fidelity"
  python3 scripts/gpu_fidelity.py --cachet "$bin" --gguf "$gguf" --out "$out/fidelity.json" 2>&1 | tee "$out/fidelity.txt"
fi
if [ "${KVFP8:-1}" = 1 ]; then
  echo "== FP8 KV cache fidelity vs bf16 KV: SmolLM2 (real weights), then the 8B shape (random weights)"
  { "$bin" bench kv-fp8 --model "$gguf" --device cuda --contexts 512,8192 --json-out "$out/kv-fp8-smollm2.json" 2>&1
    "$bin" bench kv-fp8 --model examples/configs/llama3-8b.json --load-format dummy --tokenizer "$gguf" --device cuda \
      --contexts 512,8192 --json-out "$out/kv-fp8-8b.json" 2>&1; } | grep -v INFO | tee "$out/kv-fp8.txt"
fi
if [ "${FORWARD:-1}" = 1 ]; then
  echo "== forward bench (8B shape, dummy weights)"
  "$bin" bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda --profile \
    --json-out "$out/bench.json" 2>&1 | tee "$out/bench.txt"
fi
if [ "${GEMVAB:-1}" = 1 ]; then
  echo "== decode steps with cuBLAS and separate norm / SwiGLU launches (CACHET_GEMV=off), for comparison"
  CACHET_GEMV=off "$bin" bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
    --decode-batches 16 --prefill 512 --cached-prefix none --graph-batches 1,4 --profile \
    --json-out "$out/bench-gemv-off.json" 2>&1 | tee "$out/bench-gemv-off.txt"
fi
if [ "${SPEC:-1}" = 1 ]; then
  echo "== speculative decoding off vs on: SmolLM2 (drafts accepted), then the 8B shape (dummy weights: drafts rejected)"
  # Each also with --eager-verification: verification steps without CUDA graphs, side by side.
  { for ev in "" --eager-verification; do
      "$bin" bench spec --model "$gguf" --device cuda --max-tokens 96 --high-batch 48 $ev \
        --json-out "$out/spec-smollm2${ev:+-eager}.json" 2>&1
      "$bin" bench spec --model examples/configs/llama3-8b.json --load-format dummy --tokenizer "$gguf" --device cuda \
        --max-tokens 64 --high-batch 64 $ev --json-out "$out/spec-8b${ev:+-eager}.json" 2>&1
    done; } | grep -v INFO | tee "$out/spec.txt"
fi
if [ "${PEER:-1}" = 1 ]; then
  echo "== PyTorch peer (transformers LlamaForCausalLM, SDPA, random bf16)"
  python3 scripts/torch_peer.py --config examples/configs/llama3-8b.json --out "$out/peer.json" 2>&1 | tee "$out/peer.txt"
fi
if [ "${SIMT:-1}" = 1 ]; then
  echo "== the same shapes with the CUDA-core attention kernel (CACHET_ATTENTION=simt), for comparison"
  CACHET_ATTENTION=simt "$bin" bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda \
    --decode-batches 64 --decode-contexts 4096 --prefill 2048,8192 --cached-prefix none 2>&1 | tee "$out/bench-simt.txt"
fi
if [ "${NCU:-1}" = 1 ] && [ -x /opt/nvidia/nsight-compute/2025.3.1/ncu ]; then
  echo "== per-kernel time of eager decode steps (batch 1, ctx 4096) under Nsight Compute"
  /opt/nvidia/nsight-compute/2025.3.1/ncu --csv --print-units base --metrics gpu__time_duration.sum \
    --launch-skip 1500 --launch-count 330 "$bin" bench forward --model examples/configs/llama3-8b.json \
    --load-format dummy --device cuda --enforce-eager --decode-contexts 4096 --decode-batches 1 --prefill 512 \
    --cached-prefix none --gpu-memory-utilization 0.5 > "$out/ncu.csv" 2>/dev/null
  python3 scripts/ncu_summary.py "$out/ncu.csv" 2>&1 | tee "$out/ncu-summary.txt"
fi
if [ "${FP8FORWARD:-0}" = 1 ]; then
  echo "== decode with bf16 vs FP8 KV (8B shape), side by side"
  for dt in auto fp8; do
    "$bin" bench forward --model examples/configs/llama3-8b.json --load-format dummy --device cuda --kv-cache-dtype $dt \
      --decode-batches 1,64,256 --decode-contexts 512,4096 --decode-context 2048 --prefill 2048,8192 \
      --graph-batches 1 --json-out "$out/bench-kv-$dt.json" 2>&1 | grep -v INFO | tee "$out/bench-kv-$dt.txt"
  done
fi
if [ "${TTFT:-0}" = 1 ]; then
  echo "== the TTFT experiment"
  OUT="$out" CACHET="$bin" TOKENIZER="$gguf" bash scripts/gpu_ttft.sh 2>&1 | grep -v INFO | tail -60
fi
