# Sourced by the scripts/gpu_*.sh sessions: the output folder, CUDA's libraries, the checkout
# linked where the test binaries were built (BUILT_IN, default /work/main: they find their
# fixtures there), the carried binaries (.carry/NAME.xz, stripped and xz'd) unpacked to /tmp,
# and SmolLM2's GGUF (/tmp/smollm2.gguf, assembled from earlier carries) in the model cache.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NO_COLOR=1  # plain log lines, so " INFO " filters them
export CACHET_CACHE_DIR=${CACHET_CACHE_DIR:-/tmp/cachet-cache}
mkdir -p "$(dirname "${BUILT_IN:-/work/main}")" && ln -sfn "$PWD" "${BUILT_IN:-/work/main}"
for b in cachet engine-tests speculative-tests families-tests moe-tests tp-tests; do
  [ -x /tmp/$b ] || [ ! -f .carry/$b.xz ] || { xz -dc .carry/$b.xz > /tmp/$b && chmod +x /tmp/$b; }
done
mkdir -p "$CACHET_CACHE_DIR/models/smollm2"
[ ! -f /tmp/smollm2.gguf ] || cp /tmp/smollm2.gguf "$CACHET_CACHE_DIR/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
