#!/usr/bin/env bash
# Session 40, call 6: the 8B's FP8-weight logits against bf16 with the FP8 output scales in the norm
# and in their own launch (bench kv-fp8 --compare weights, SmolLM2's tokenizer-only GGUF).
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
[ -x /tmp/cachet ] || { xz -dc .carry/cachet.xz > /tmp/cachet; chmod +x /tmp/cachet; }
for v in separate norm; do
  CACHET_FP8_OUT_SCALES=$v timeout 200 /tmp/cachet bench kv-fp8 --compare weights --model examples/configs/llama3-8b.json --load-format dummy --device cuda --tokenizer .carry/smollm2-tokenizer.gguf --contexts 512,2048 --json-out $out/fp8w-$v.json 2>&1 | grep -v " INFO " > $out/fp8w-$v.txt
  tail -12 $out/fp8w-$v.txt
done
python3 - "$out" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/fp8w-{v}.json")) for v in ("separate", "norm"))
def strip(x):
    if isinstance(x, dict): return {k: strip(v) for k, v in x.items() if not k.endswith("_ms") and k not in ("seconds",)}
    if isinstance(x, list): return [strip(v) for v in x]
    return x
print("logit statistics identical under both:", strip(a) == strip(b))
PY
