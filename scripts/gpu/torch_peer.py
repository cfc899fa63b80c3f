#!/usr/bin/env python3
"""The PyTorch peer column for `cachet bench forward`: HF transformers' causal-LM class of the
config's family (LlamaForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, ...) with SDPA, random
bf16 weights of the same config, on the same GPU in the same call. Mixtures of experts run with
transformers' own default experts implementation (named in the output).

    python3 scripts/gpu/torch_peer.py --config examples/configs/llama3-8b.json
    python3 scripts/gpu/torch_peer.py --config examples/configs/qwen3-30b-a3b.json --contexts 512 --prefill 512,4096
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def timed(fn, warm=2, reps=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out")
    ap.add_argument("--contexts", default="512,4096", help="decode batch-1 contexts")
    ap.add_argument("--prefill", default="512,2048,8192", help="prefill lengths")
    a = ap.parse_args()
    raw = json.load(open(a.config))
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    experts = getattr(model.config, "_experts_implementation", None)
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{type(model).__name__}" + (f", experts implementation {experts}" if experts else ""))
    rows = []
    print("| peer measurement | time |")
    print("|---|---|")
    with torch.no_grad():
        for ctx in [int(c) for c in a.contexts.split(",") if c]:
            ids = torch.randint(0, cfg.vocab_size, (1, ctx), device="cuda")
            out = model(ids, use_cache=True)
            past = out.past_key_values
            tok = torch.randint(0, cfg.vocab_size, (1, 1), device="cuda")
            for _ in range(3):
                model(tok, past_key_values=past, use_cache=True)
            torch.cuda.synchronize()
            steps = 10
            t = time.perf_counter()
            for _ in range(steps):
                model(tok, past_key_values=past, use_cache=True)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / steps * 1e3
            print(f"| decode batch 1, ctx {ctx} | {ms:.2f} ms/token |")
            rows.append({"kind": "decode", "ctx": ctx, "ms": ms})
            del past, out
            torch.cuda.empty_cache()
        for n in [int(c) for c in a.prefill.split(",") if c]:
            ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
            s = timed(lambda: model(ids, use_cache=False, logits_to_keep=1))
            print(f"| prefill {n} tokens | {s * 1e3:.1f} ms |")
            rows.append({"kind": "prefill", "tokens": n, "ms": s * 1e3})
    if a.out:
        json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
