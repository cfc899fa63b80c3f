#!/usr/bin/env bash
# Session 40, last call: SmolLM2's GGUF assembled from the parts carried before, then the CUDA
# engine tests (graph replays with FP8 weights among them) and the FP8 family tests on the final build.
cd "$(dirname "$0")/.." && rm -f /tmp/cachet /tmp/engine-tests /tmp/families-tests
[ -f /tmp/smollm2.gguf ] || cat /tmp/smollm2.part.0* | xz -dc > /tmp/smollm2.gguf
source scripts/gpu_common.sh
sha256sum /tmp/smollm2.gguf | tee $out/gguf.sha
timeout 300 /tmp/engine-tests --ignored --test-threads 1 --nocapture 2>&1 | tee $out/engine-cuda.txt | grep -E "^test |test result|panicked|parted at" | tail -30
timeout 200 /tmp/families-tests --ignored --test-threads 1 2>&1 | tee $out/families-cuda.txt | grep -E "^test |test result|panicked" | tail -16
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
