#!/usr/bin/env bash
# Builds llama.cpp's llama-bench from the llama-cpp-python sdist on PyPI (CPU only), makes an F32
# copy of the SmolLM2 GGUF, and runs Cachet's CPU bench with llama.cpp side by side.
#   scripts/llama_cpp_bench.sh [workdir]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/cachet-llama-cpp}
mkdir -p "$work"
cd "$work"
python3 -m pip install -q scikit-build-core cmake ninja
if [ ! -f llama_cpp_python-*.tar.gz ]; then
  python3 -m pip download --no-deps --no-binary llama-cpp-python --no-build-isolation llama-cpp-python -d .
fi
if [ ! -x build/bin/llama-bench ]; then
  tar xzf llama_cpp_python-*.tar.gz
  src=$(ls -d llama_cpp_python-*/vendor/llama.cpp)
  cmake -S "$src" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON
  cmake --build build --target llama-bench llama-quantize -j "$(nproc)"
fi
gguf=$(cd "$repo" && cargo run -q --release -p cachet-gateway -- model fetch smollm2)
[ -f smollm2-f32.gguf ] || build/bin/llama-quantize --allow-requantize "$gguf" smollm2-f32.gguf F32
cd "$repo"
echo "## llama.cpp on the F32 GGUF (same arithmetic as Cachet's f32 CPU path)"
LLAMA_BENCH="$work/build/bin/llama-bench" LLAMA_GGUF="$work/smollm2-f32.gguf" cargo bench -p cachet-backend --bench cpu_forward
echo "## llama.cpp on the original Q4_1 GGUF (its native quantised kernels)"
LLAMA_BENCH="$work/build/bin/llama-bench" LLAMA_GGUF="$gguf" cargo bench -p cachet-backend --bench cpu_forward
