#!/usr/bin/env python3
"""CUDA engine fidelity on the GPU machine, in one call: logits of `cachet logits --device cuda`
against the CPU reference and against HF transformers (float32, on the GPU), and greedy outputs
of `cachet generate` CUDA vs CPU. Prints a table; exits non-zero if a check fails.

    python3 scripts/gpu/fidelity.py --cachet BIN --gguf SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(REPO, "tests", "fixtures")
TOL = 2e-2


def cachet_logits(binary, model, ids, device):
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        subprocess.run([binary, "logits", "--model", model, "--device", device, "--ids", ",".join(map(str, ids)),
                        "--dump", f.name, "--top", "2"], check=True, capture_output=True)
        return np.fromfile(f.name, dtype="<f4").astype(np.float64)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def hf_logits(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids], device="cuda")).logits[0, -1].double().cpu().numpy()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cachet", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    rows, ok = [], True

    cases = []
    smol = json.load(open(os.path.join(FIX, "smollm2_reference.json")))
    d, f = os.path.split(os.path.abspath(a.gguf))
    hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).cuda().eval()
    for c in smol["cases"]:
        cases.append(("smollm2", a.gguf, c["ids"], hf))
    for name in ["tiny-gqa-llama3", "tiny-mha-tied"]:
        path = os.path.join(FIX, name)
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
        ref = json.load(open(os.path.join(FIX, f"{name}_reference.json")))
        for c in ref["cases"]:
            cases.append((name, path, c["ids"], m))

    print("| model | tokens | top-1 cuda/cpu/hf | rel err cuda vs cpu | rel err cuda vs transformers (GPU f32) | cpu vs transformers | transformers bf16 vs f32 |")
    print("|---|---|---|---|---|---|---|")
    bf16_models = {}
    for name, path, ids, m in cases:
        cu = cachet_logits(a.cachet, path, ids, "cuda")
        cp = cachet_logits(a.cachet, path, ids, "cpu")
        hfl = hf_logits(m, ids)
        if name not in bf16_models:
            import copy
            bf16_models[name] = copy.deepcopy(m).to(torch.bfloat16)
        hfb = hf_logits(bf16_models[name], ids)
        e1, e2, e3, e4 = rel(cu, cp), rel(cu, hfl), rel(cp, hfl), rel(hfb, hfl)
        tops = (int(cu.argmax()), int(cp.argmax()), int(hfl.argmax()))
        good = tops[0] == tops[1] == tops[2] and e1 <= TOL and e2 <= TOL
        ok &= good
        print(f"| {name} | {len(ids)} | {tops[0]}/{tops[1]}/{tops[2]} | {e1:.2e} | {e2:.2e} | {e3:.2e} | {e4:.2e} |{'' if good else ' FAIL'}")
        rows.append({"model": name, "tokens": len(ids), "top1": tops, "rel_cuda_cpu": e1, "rel_cuda_hf": e2, "rel_cpu_hf": e3, "rel_hf_bf16_f32": e4})

    prompts = ["What is the capital of France?", "Write a haiku about the sea.", "List three uses of copper.",
               "Explain photosynthesis in one sentence.", "def fibonacci(n):"]
    print("\n| greedy prompt (SmolLM2, 48 tokens, ignore EOS) | identical | first divergence | CUDA logit gap there |")
    print("|---|---|---|---|")
    greedy = []
    for p in prompts:
        outs = {}
        for dev in ["cuda", "cpu"]:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                subprocess.run([a.cachet, "generate", "--model", a.gguf, "--device", dev, "--chat", "--prompt", p,
                                "--max-tokens", "48", "--ignore-eos", "--ids-out", f.name], check=True, capture_output=True)
                outs[dev] = json.load(open(f.name))
        cu, cp = outs["cuda"]["output_ids"], outs["cpu"]["output_ids"]
        same = cu == cp
        div, gap = "-", "-"
        if not same:
            k = next(i for i, (x, y) in enumerate(zip(cu, cp)) if x != y) if any(x != y for x, y in zip(cu, cp)) else min(len(cu), len(cp))
            ids = outs["cuda"]["prompt_ids"] + cu[:k]
            lg = cachet_logits(a.cachet, a.gguf, ids, "cuda")
            top2 = np.sort(lg)[-2:]
            div, gap = f"token {k}", f"{top2[1] - top2[0]:.3f}"
        print(f"| {p} | {'yes' if same else 'no'} | {div} | {gap} |")
        greedy.append({"prompt": p, "identical": same, "divergence": div, "gap": gap})
    if a.out:
        json.dump({"logits": rows, "greedy": greedy}, open(a.out, "w"), indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
