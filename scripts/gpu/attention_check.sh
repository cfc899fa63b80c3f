#!/usr/bin/env bash
# Quick CUDA-vs-CPU logits check of both attention kernels (no model download): random GQA models
# with head_dim 64 and 128 (tensor-core kernel, groups 4 and 8, split-K for the short prompts, several
# units per sequence for the long ones), the same with sliding windows, and the tiny fixtures
# (CUDA-core kernel; tiny-gemma3: windows, GeGLU, output norms, scaled embeddings). KV="auto fp8
# int8" also checks the FP8 and INT8 KV caches (CUDA against the CPU's reference of the same
# format; looser bound: the two quantize K from bf16 vs f32 rotations, and INT8 calibrates on a
# bf16 vs an f32 cache, so a few codes round the other way). Each prompt is
# checked as one prefill, with its last token as a decode step of its own (the
# fused GEMV path of a one-row step and the decode attention), and (n >= 4) with its last four
# tokens as one step of their own (a speculative verification step). MODES and MODELS pick some.
set -euo pipefail
bin=${CACHET:?the cachet binary to check}
"$bin" model random --config examples/configs/small-gqa-d64.json --out /tmp/m64 --seed 3 2>/dev/null
"$bin" model random --config examples/configs/small-gqa-d128.json --out /tmp/m128 --seed 4 2>/dev/null
# A GQA group of 8 (Llama-3-70B's, Qwen3-30B-A3B's): a decode step fills all 8 query columns of
# the FP8 cache's transposed decode kernel.
"$bin" model random --config examples/configs/small-gqa8-d128.json --out /tmp/g8 --seed 8 2>/dev/null
# Sliding windows (Mistral-style, every layer) of 100 and 256 keys: the 300- and 1500-token prompts
# reach past them, and a decode step over 1500 keys splits the key range, some splits wholly
# outside the window.
"$bin" model random --config examples/configs/small-window-d64.json --out /tmp/w64 --seed 5 2>/dev/null
"$bin" model random --config examples/configs/small-window-d128.json --out /tmp/w128 --seed 6 2>/dev/null
# Gemma 3's head_dim 256 (the wide CUDA-core kernels), windows of 100 keys on two of three layers.
"$bin" model random --config examples/configs/small-gemma3-d256.json --out /tmp/g256 --seed 7 2>/dev/null
for kv in ${KV:-auto}; do
tol=$([ "$kv" = auto ] && echo 2e-2 || echo 5e-2)
for model in ${MODELS:-/tmp/m64 /tmp/m128 /tmp/g8 /tmp/w64 /tmp/w128 /tmp/g256 tests/fixtures/tiny-gqa-llama3 tests/fixtures/tiny-mha-tied tests/fixtures/tiny-gemma3}; do
  max=$(python3 -c "import json; print(json.load(open('$model/config.json'))['max_position_embeddings'])")
  for n in 1 37 300 1500; do
    [ "$n" -le "$max" ] || continue
    ids=$(python3 -c "print(','.join(str((i * 37 + 5) % 250) for i in range($n)))")
    for mode in ${MODES:-prefill decode verify}; do
    # verify: the last 4 tokens as one step after the rest (a speculative verification step)
    case $mode in prefill) flag= ;; decode) flag=--decode-last ;; verify) flag="--decode-last 4" ;; esac
    [ "$mode" != verify ] || [ "$n" -ge 4 ] || continue
    # A cache CUDA cannot give the model (FP8 needs head_dim divisible by 8; the tiny fixtures'
    # is 12) is refused with that reason: said, and skipped.
    refused=
    for dev in cuda cpu; do
      "$bin" logits --model "$model" --device "$dev" --kv-cache-dtype "$kv" --ids "$ids" --dump "/tmp/$dev.f32" --top 1 $flag >/dev/null 2>"/tmp/$dev.err" || refused="$refused $dev"
    done
    if [ -n "$refused" ]; then
      if [ "$refused" = " cuda" ] && grep -q "divisible by 8" /tmp/cuda.err; then
        echo "$model kv $kv n=$n $mode: skipped (CUDA: $(grep -ho 'an [A-Za-z0-9]* KV cache needs head_dim[^)]*)' /tmp/cuda.err | head -1))"
      else
        echo "$model kv $kv n=$n $mode: FAIL ($refused refused: $(tail -1 /tmp/cuda.err) / $(tail -1 /tmp/cpu.err))"
      fi
      continue
    fi
    ${PYTHON:-python3} -c "
import numpy as np
import json
v = json.load(open('$model/config.json'))['vocab_size']
a = np.fromfile('/tmp/cuda.f32', '<f4').astype(np.float64).reshape(-1, v); b = np.fromfile('/tmp/cpu.f32', '<f4').astype(np.float64).reshape(-1, v)
e = np.linalg.norm(a - b) / np.linalg.norm(b)
# Random weights put near ties at the top: a different top-1 passes only where the reference's
# own logits for the two differ by less than the two rows differ anywhere (at least 0.01), said
# as such. Every row (verify: four).
tops = []
for ra, rb in zip(a, b):
    gap, tie = rb.max() - rb[ra.argmax()], max(0.01, np.abs(ra - rb).max())
    tops.append('OK' if ra.argmax() == rb.argmax() else ('OK (near tie, gap %.4f < %.4f)' % (gap, tie) if gap < tie else 'FAIL'))
top = 'FAIL' if 'FAIL' in tops else ' '.join(sorted(set(tops)))
print(f'$model kv $kv n=$n $mode rows {len(a)} rel err {e:.2e} top1 {a[-1].argmax()}/{b[-1].argmax()}', top if e < $tol else 'FAIL')"
    done
  done
done
done
