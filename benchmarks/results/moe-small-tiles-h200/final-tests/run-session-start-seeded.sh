#!/usr/bin/env bash
# The session-start build's (7665fcb) engine test binary on the same SmolLM2 GGUF: does the
# seeded-request test fail there too?
cd "$(dirname "$0")/.." && rm -f /tmp/engine-tests
cat /tmp/smolxz.aa /tmp/smolxz.ab /tmp/smolxz.ac /tmp/smolxz.ad .carry-t/smolxz.ae | xz -dc > /tmp/smollm2.gguf && sha256sum /tmp/smollm2.gguf | cut -c1-16
mkdir -p .carry && cp .carry-t/engine-tests.xz .carry/ && BUILT_IN=/tmp/old source scripts/gpu_common.sh
/tmp/engine-tests --ignored --exact a_seeded_request_reproduces_whatever_shares_its_batch::cuda 2>&1 | grep -E "test result|vs" | cut -c1-220
