#!/usr/bin/env bash
# The final build's CUDA tests: MoE (every path), families (FP8 weights through cuBLASLt's
# refactored matmul, tiny families), engine (graphs, batching, FP8 graphs).
cd "$(dirname "$0")/.." && rm -f /tmp/cachet /tmp/*-tests && source scripts/gpu_common.sh
timeout 100 /tmp/moe-tests --ignored --test-threads 1 --nocapture moe_layers_on_cuda 2>&1 | tee $out/moe-cuda.txt | grep -E "^test |test result|panicked" | tail -4
timeout 150 /tmp/families-tests --ignored --test-threads 1 2>&1 | tee $out/families-cuda.txt | grep -E "^test |test result|panicked" | tail -14
timeout 240 /tmp/engine-tests --ignored --test-threads 1 2>&1 | tee $out/engine-cuda.txt | grep -E "test result|panicked|FAILED|^test .*(fail|FAIL)" | tail -8
