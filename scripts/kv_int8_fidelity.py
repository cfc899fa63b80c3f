"""Issue 22's question about the seed's other KV format: does INT8 with per-channel scales and its
outlier channels kept in bf16 beat the FP8 cache on fidelity at equal bytes?

Real models (the trained GGUF weights of docs/MODELS.md, read by transformers, f32 on the CPU) run
teacher-forced over held-out text while every K and V they attend to passes through one cache
format (K after RoPE, as the engine stores it), against the same run with an f32 cache:

- `bf16`: K and V rounded to bf16 (the default cache) — 2·d bytes per token and KV head;
- `fp8`: the engine's FP8 cache — e4m3 codes, an f32 scale per token and KV head (amax / 448):
  d + 4 bytes;
- `int8-token`: the same layout in INT8 (scale amax / 127): d + 4 bytes;
- `int8-channel+k`: the seed's format — INT8 with a static scale per layer, KV head and channel
  (amax / 127 over calibration text, values past it saturate) and the k channels with the largest
  calibration amax kept in bf16: d + k bytes (k = 4 is FP8's d + 4);
- `int8-channel`: the same with no outlier channels: d bytes.

Per model and format: the mean KL divergence of the next-token distribution from the f32 run's,
top-1 agreement, and the largest logit difference, over every position of the evaluation texts.
The calibration text is not among them.

  python scripts/kv_int8_fidelity.py --out target/cachet-bench/kv-int8-fidelity [--tokens 320]
"""

import argparse
import json
import os
import pathlib
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

CACHE = pathlib.Path(os.environ.get("CACHET_CACHE_DIR", pathlib.Path.home() / ".cache/cachet")) / "models"
MODELS = [
    ("SmolLM2-135M", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("Gemma-3-270M", "gemma3-270m/gemma-3-270m-q4_k_m.gguf"),
    ("Qwen2.5-Coder-0.5B", "qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ("Qwen2.5-Coder-1.5B", "qwen2.5-coder-1.5b/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
]
ROOT = pathlib.Path(__file__).resolve().parent.parent
# Held-out evaluation text: prose, Rust, CUDA, TOML. Calibration: a different file.
EVAL_FILES = ["README.md", "gateway/src/http/serve.rs", "kernels/src/attention_mma.cu", "examples/cachet.toml"]
CALIB_FILE = "ARCHITECTURE.md"


def fp8(x):
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
    return (x / s).to(torch.float8_e4m3fn).to(torch.float32) * s


def int8_token(x):
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127.0
    return (x / s).round().clamp(-127, 127) * s


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


class Calibrate(DynamicCache):
    """Records each layer's per-(KV head, channel) amax of K and V."""

    def __init__(self, config, amax):
        super().__init__(config=config)
        self.amax = amax

    def update(self, k, v, layer_idx, *args, **kwargs):
        for name, x in (("k", k), ("v", v)):
            a = x.abs().amax(dim=(0, 2))  # [kv heads, d]
            key = (layer_idx, name)
            self.amax[key] = torch.maximum(self.amax[key], a) if key in self.amax else a
        return super().update(k, v, layer_idx, *args, **kwargs)


def int8_channel(amax, outliers):
    """The seed's format from calibration amax: per-channel INT8, `outliers` channels in bf16."""

    def q(x, layer_idx, name):
        a = amax[(layer_idx, name)].clamp_min(1e-12)  # [kv heads, d]
        s = (a / 127.0)[None, :, None, :]
        y = (x / s).round().clamp(-127, 127) * s
        if outliers:
            idx = a.topk(outliers, dim=-1).indices  # [kv heads, k]
            keep = torch.zeros_like(a, dtype=torch.bool).scatter_(-1, idx, True)[None, :, None, :]
            y = torch.where(keep, bf16(x), y)
        return y

    return q


def fp8_smoothed(amax, which):
    """FP8 per token after dividing each channel by its calibration amax (K's channels tied in
    RoPE pairs, as a scale folded into W_q/W_k must commute with the rotation) and multiplying
    back: what folding the scales into the projections would give (q·k and p·v unchanged)."""

    def q(x, layer_idx, name):
        if name not in which:
            return fp8(x)
        a = amax[(layer_idx, name)].clamp_min(1e-6)  # [kv heads, d]
        if name == "k":
            h = a.shape[-1] // 2
            pair = torch.maximum(a[:, :h], a[:, h:])
            a = torch.cat([pair, pair], -1)
        s = a[None, :, None, :]
        return fp8(x / s) * s

    return q


class Quantized(DynamicCache):
    """Passes every incoming K and V through `fmt` before it is stored (and attended to)."""

    def __init__(self, config, fmt):
        super().__init__(config=config)
        self.fmt = fmt

    def update(self, k, v, layer_idx, *args, **kwargs):
        return super().update(self.fmt(k, layer_idx, "k"), self.fmt(v, layer_idx, "v"), layer_idx, *args, **kwargs)


def logits(model, ids, cache):
    with torch.no_grad():
        return model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0].float()


def compare(ref, got):
    lp, lq = torch.log_softmax(ref, -1), torch.log_softmax(got, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return {
        "kl_mean": kl.mean().item(),
        "kl_max": kl.max().item(),
        "top1_agree": (ref.argmax(-1) == got.argmax(-1)).float().mean().item(),
        "max_abs_logit_diff": (ref - got).abs().max().item(),
        "positions": ref.shape[0],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=320, help="tokens of each evaluation text")
    ap.add_argument("--models", default=",".join(m for m, _ in MODELS))
    ap.add_argument("--outliers", default="4,8")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 2)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, rel in MODELS:
        if name not in a.models.split(","):
            continue
        path = CACHE / rel
        t0 = time.time()
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
        cfg = model.config
        texts = [(ROOT / f).read_text() for f in EVAL_FILES]
        evals = [torch.tensor([tok(t)["input_ids"][: a.tokens]]) for t in texts]
        calib_ids = torch.tensor([tok((ROOT / CALIB_FILE).read_text())["input_ids"][: 4 * a.tokens]])
        amax = {}
        logits(model, calib_ids, Calibrate(cfg, amax))
        d = cfg.hidden_size // cfg.num_attention_heads if not getattr(cfg, "head_dim", None) else cfg.head_dim
        formats = {
            "bf16": (lambda x, l, n: bf16(x), 2 * d),
            "fp8": (lambda x, l, n: fp8(x), d + 4),
            "int8-token": (lambda x, l, n: int8_token(x), d + 4),
            "int8-channel": (int8_channel(amax, 0), d),
            "fp8-smooth-k": (fp8_smoothed(amax, "k"), d + 4),
            "fp8-smooth-kv": (fp8_smoothed(amax, "kv"), d + 4),
        }
        for k in [int(x) for x in a.outliers.split(",") if x]:
            formats[f"int8-channel+{k}"] = (int8_channel(amax, k), d + k)
        refs = [logits(model, ids, DynamicCache(config=cfg)) for ids in evals]
        r = {"head_dim": d, "layers": cfg.num_hidden_layers, "kv_heads": cfg.num_key_value_heads, "formats": {}}
        for f, (fn, bytes_) in formats.items():
            per = [compare(ref, logits(model, ids, Quantized(cfg, fn))) for ref, ids in zip(refs, evals)]
            n = sum(p["positions"] for p in per)
            r["formats"][f] = {
                "bytes_per_token_head": bytes_,
                "kl_mean": sum(p["kl_mean"] * p["positions"] for p in per) / n,
                "kl_max": max(p["kl_max"] for p in per),
                "top1_agree": sum(p["top1_agree"] * p["positions"] for p in per) / n,
                "max_abs_logit_diff": max(p["max_abs_logit_diff"] for p in per),
                "positions": n,
            }
        r["seconds"] = round(time.time() - t0, 1)
        results[name] = r
        print(name, json.dumps(r["formats"], indent=None), flush=True)
        del model
    (out / "results.json").write_text(json.dumps(results, indent=2))
    lines = ["| model (head dim) | format | bytes / token·head | mean KL | max KL | top-1 agreement | max |Δlogit| |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        for f, v in r["formats"].items():
            lines.append(
                f"| {name} (d{r['head_dim']}) | {f} | {v['bytes_per_token_head']} | {v['kl_mean']:.2e} | {v['kl_max']:.2e} "
                f"| {100 * v['top1_agree']:.2f}% | {v['max_abs_logit_diff']:.3f} |"
            )
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
