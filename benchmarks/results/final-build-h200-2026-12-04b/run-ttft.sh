#!/usr/bin/env bash
# Session 40, call 5: the seed TTFT experiment on the final build (baseline vs all on, cold and warm,
# at the baseline's capacity measured in the run).
cd "$(dirname "$0")/.." && source scripts/gpu_common.sh
[ -x /tmp/cachet ] || { xz -dc .carry/cachet.xz > /tmp/cachet; chmod +x /tmp/cachet; }
OUT=$out CACHET=/tmp/cachet TOKENIZER=.carry/smollm2-tokenizer.gguf LOAD=1.0 REQUESTS=1200 timeout 560 bash scripts/gpu_ttft.sh 2>&1 | grep -v " INFO " | tail -30
tar czf /tmp/r.tgz -C $out . && mv /tmp/r.tgz $out/all.tgz
