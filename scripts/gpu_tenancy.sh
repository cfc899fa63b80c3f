#!/usr/bin/env bash
# The fair-multi-tenancy GPU session in one call: the CUDA engine and speculative tests on the
# build that changed the scheduler and the KV pool, then `bench cache-share` on the 8B shape.
# Carry .carry/{cachet,engine-tests,speculative-tests}.xz (stripped, xz) and SmolLM2's GGUF as
# /tmp/smollm2.gguf. Test binaries find their fixtures under the path they were built in:
# BUILT_IN (default /work/main) is linked to this checkout.
source "$(dirname "$0")/gpu_common.sh"
echo "== engine tests on CUDA"
/tmp/engine-tests --ignored --test-threads 1 2>&1 | tee "$out/engine-cuda.txt" | grep -E "^test |test result"
echo "== speculative tests on CUDA"
/tmp/speculative-tests --ignored --test-threads 1 2>&1 | tee "$out/speculative-cuda.txt" | grep -E "^test |test result"
echo "== bench cache-share, 8B shape"
/tmp/cachet bench cache-share --model examples/configs/llama3-8b.json --load-format dummy --tokenizer smollm2 \
  --device cuda --fair-share --num-gpu-blocks-override ${BLOCKS:-768} --prefix-len 512 --suffix-len 16 \
  --scan-len 2048 --scanners 4 --hot-interval 0.5 --duration 20 --out "$out/cache-share-8b" 2>&1 \
  | grep -v " INFO " | tee "$out/cache-share-8b.txt"
