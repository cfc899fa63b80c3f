#!/usr/bin/env python3
"""Reference values from HF transformers + torch, written as JSON fixtures for Cachet's tests.

Nothing here is Cachet code: the model is loaded by transformers (its own GGUF reader and
dequantiser for SmolLM2, its safetensors loader for the tiny models) and run by torch in float32.

    python scripts/reference.py --gguf ~/.cache/cachet/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --tiny tests/fixtures/tiny-gqa-llama3 tests/fixtures/tiny-mha-tied --out tests/fixtures
    python scripts/reference.py --families tiny-qwen2 tiny-qwen2-yarn tiny-qwen3 tiny-qwen3-moe tiny-mixtral \
        --qwen-gguf ~/.cache/cachet/models/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

Tokenizer note: llama.cpp marks SmolLM2's GGUF with pre-tokenizer `smollm`, which splits every digit
on its own before the GPT-2 byte-level split (as SmolLM2's own tokenizer.json does:
Sequence[Digits(individual_digits=True), ByteLevel]). transformers' GGUF tokenizer converter has no
entry for `smollm` and falls back to plain byte-level, so we restore the digit split on transformers'
tokenizer (`tokenizers` library objects), and also record transformers' unmodified ids.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_grad_enabled(False)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a small village by the sea, there lived",
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé text, emoji 🦀🚀 and 中文字符 mixed with ASCII.",
]

TOKENIZER_TEXTS = [
    "Hello world! This is a plain ASCII sentence.",
    "Mixed: ASCII, Ünïcödé, emoji 🦀🚀👩‍💻, 中文, العربية, and numbers 1234567 or 3.14159.",
    "def f(x):\n\treturn x**2  # code\n\n\n    indented   with   runs of spaces  \n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "   leading spaces and trailing tabs\t\t\n\r\nwindows newlines",
]


def top_k(logits, k=5):
    vals, ids = torch.topk(logits, k)
    return [{"id": int(i), "logit": float(v)} for v, i in zip(vals.tolist(), ids.tolist())]


def smollm2(gguf_path, out_dir):
    d, f = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    plain = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    cases = []
    for p in PROMPTS:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        logits = model(torch.tensor([ids])).logits[0, -1]
        cases.append({"prompt": p, "ids": ids, "top5": top_k(logits)})
    toks = []
    for t in TOKENIZER_TEXTS:
        toks.append({
            "text": t,
            "ids": tok(t, add_special_tokens=False)["input_ids"],
            "transformers_plain_ids": plain(t, add_special_tokens=False)["input_ids"],
        })
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(chat_prompt, add_special_tokens=False)["input_ids"]
    gen = model.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False,
                         eos_token_id=[2], pad_token_id=2)
    out_ids = gen[0, len(prompt_ids):].tolist()
    doc = {
        "source": "transformers %s + torch %s, float32, GGUF dequantised by transformers" % (
            transformers.__version__, torch.__version__),
        "gguf": f,
        "cases": cases,
        "tokenizer": toks,
        "greedy_chat": {
            "messages": messages,
            "prompt": chat_prompt,
            "prompt_ids": prompt_ids,
            "output_ids": out_ids,
            "text": tok.decode(out_ids, skip_special_tokens=True),
        },
    }
    with open(os.path.join(out_dir, "smollm2_reference.json"), "w") as fh:
        json.dump(doc, fh, indent=1, ensure_ascii=False)
    print("smollm2:", doc["greedy_chat"]["text"])


def tiny(model_dir, out_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1234)
    seqs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (1, 7, 40)]
    cases = []
    for ids in seqs:
        logits = model(torch.tensor([ids])).logits[0]
        cases.append({"ids": ids, "logits": logits.tolist()})
    name = os.path.basename(os.path.normpath(model_dir))
    doc = {"source": "transformers %s + torch %s, float32" % (transformers.__version__, torch.__version__),
           "model": name, "cases": cases}
    with open(os.path.join(out_dir, f"{name}_reference.json"), "w") as fh:
        json.dump(doc, fh)
    print(name, "ok")


# Tiny configs of the other families, built by transformers itself (its own classes and
# save_pretrained), then every parameter redrawn so biases and norms are not their zero/one
# initialisation: the fixture directories hold transformers' files, not ours.
FAMILIES = {
    "tiny-qwen2": dict(
        model_type="qwen2", hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=300, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=2048,
        use_sliding_window=False, bos_token_id=1, eos_token_id=2),
    "tiny-qwen2-yarn": dict(
        model_type="qwen2", hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, vocab_size=300, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=256,
        use_sliding_window=False, bos_token_id=1, eos_token_id=2,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "tiny-qwen3": dict(
        model_type="qwen3", hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=300, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=2048,
        use_sliding_window=False, bos_token_id=1, eos_token_id=2,
        rope_scaling={"rope_type": "linear", "factor": 2.0}),
    # Windows of 8 keys, shorter than the test prompts, so the windows change the result.
    "tiny-gemma3": dict(
        model_type="gemma3_text", hidden_size=64, intermediate_size=112, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=300, rms_norm_eps=1e-6,
        query_pre_attn_scalar=24, sliding_window=8, max_position_embeddings=2048,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    # Mixtures of experts: many small experts, unnormalised top-3 (Qwen3-MoE's
    # norm_topk_prob false) and Mixtral's renormalised top-2.
    "tiny-qwen3-moe": dict(
        model_type="qwen3_moe", hidden_size=64, intermediate_size=112, moe_intermediate_size=32,
        num_experts=8, num_experts_per_tok=3, norm_topk_prob=False, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=300, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=False, max_position_embeddings=2048,
        use_sliding_window=False, bos_token_id=1, eos_token_id=2),
    # Widths that are multiples of 32, so a GPU serves both with its grouped GEMMs too.
    "tiny-mixtral": dict(
        model_type="mixtral", hidden_size=64, intermediate_size=64, num_local_experts=4,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=300, rms_norm_eps=1e-5, rope_theta=1000000.0, tie_word_embeddings=False,
        max_position_embeddings=2048, bos_token_id=1, eos_token_id=2),
    "tiny-mistral-window": dict(
        model_type="mistral", hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=300, rms_norm_eps=1e-5,
        rope_theta=10000.0, sliding_window=8, tie_word_embeddings=False, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2),
}


def build_family(name, out_dir):
    from transformers import AutoConfig
    spec = dict(FAMILIES[name])
    cfg = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                # Gemma's norms scale by (1 + w): draw w near 0 there.
                base = 0.0 if cfg.model_type.startswith("gemma") else 1.0
                p.copy_(base + 0.2 * (torch.rand_like(p) - 0.5))
            elif pname.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif "embed_tokens" in pname:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    d = os.path.join(out_dir, name)
    model.save_pretrained(d, safe_serialization=True)
    print(name, "built by", type(model).__name__)
    return d


# FP8 checkpoints of tiny-qwen3 (its transformers-built weights): every projection quantized to
# e4m3 by torch with (a) HF's fine-grained format (quant_method "fp8", 16x16 blocks,
# weight_scale_inv) and (b) compressed-tensors' per-channel float8 (weight_scale [out, 1]). The
# reference logits are transformers' on the dequantized weights (torch's own e4m3 decode).
FP8_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fp8_variant(base_dir, out_dir, scheme):
    from safetensors.torch import load_file, save_file
    name = os.path.basename(os.path.normpath(base_dir)) + "-fp8-" + scheme
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    sd = load_file(os.path.join(base_dir, "model.safetensors"))
    out, deq = {}, {}
    for k, w in sd.items():
        if not (k.endswith(".weight") and any(p in k for p in FP8_PROJ)):
            out[k] = w
            deq[k] = w
            continue
        rows, cols = w.shape
        if scheme == "block":
            b = 16
            sr, sc = -(-rows // b), -(-cols // b)
            scale = torch.zeros(sr, sc)
            for i in range(sr):
                for j in range(sc):
                    blk = w[i * b:(i + 1) * b, j * b:(j + 1) * b]
                    scale[i, j] = blk.abs().max() / 448.0
            full = scale.repeat_interleave(b, 0)[:rows].repeat_interleave(b, 1)[:, :cols]
            out[k + "_scale_inv"] = scale
        else:
            scale = w.abs().amax(dim=1, keepdim=True) / 448.0
            full = scale
            out[k + "_scale"] = scale
        codes = (w / full).to(torch.float8_e4m3fn)
        out[k] = codes
        deq[k] = codes.to(torch.float32) * full
    save_file(out, os.path.join(d, "model.safetensors"))
    cfg = json.load(open(os.path.join(base_dir, "config.json")))
    if scheme == "block":
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                      "fmt": "e4m3", "weight_block_size": [16, 16]}
    else:
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                          "weights": {"num_bits": 8, "type": "float",
                                                      "strategy": "channel", "symmetric": True}}},
            "ignore": ["lm_head"]}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    # transformers on the dequantized weights.
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model.load_state_dict(deq, strict=False)
    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1234)
    cases = []
    for n in (1, 7, 40):
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        cases.append({"ids": ids, "logits": logits.tolist()})
    doc = {"source": "transformers %s + torch %s, float32, on the weights torch dequantized from e4m3"
           % (transformers.__version__, torch.__version__), "model": name, "cases": cases}
    json.dump(doc, open(os.path.join(out_dir, f"{name}_reference.json"), "w"))
    print(name, "ok")


def greedy(model, ids, n):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def tiny_with_greedy(model_dir, out_dir):
    """tiny() plus 64 greedy tokens after two prompts that share a prefix."""
    tiny(model_dir, out_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(99)
    shared = torch.randint(0, vocab, (37,), generator=g).tolist()
    prompts = [shared + torch.randint(0, vocab, (n,), generator=g).tolist() for n in (5, 21)]
    name = os.path.basename(os.path.normpath(model_dir))
    path = os.path.join(out_dir, f"{name}_reference.json")
    doc = json.load(open(path))
    doc["greedy"] = [{"prompt": p, "output": greedy(model, p, 64)} for p in prompts]
    if getattr(model.config, "num_experts_per_tok", None):
        doc["routes"] = moe_routes(model, doc["cases"][-1]["ids"])
        # Where the routing is a near tie a bf16 device may choose another expert: per position,
        # the smallest gap over the layers between the k-th and the next probability.
        for c in doc["cases"]:
            c["route_gaps"] = route_gaps(model, c["ids"])
        for g in doc["greedy"]:
            g["route_gaps"] = route_gaps(model, g["prompt"] + g["output"])
    with open(path, "w") as fh:
        json.dump(doc, fh)


def moe_routes(model, ids):
    """Each layer's router choice for every token of `ids`: transformers' router logits
    (output_router_logits), softmax, top-k; with the gap between the k-th and the next
    probability, so a test can skip near ties."""
    k = model.config.num_experts_per_tok
    out = model(torch.tensor([ids]), output_router_logits=True)
    layers = []
    for logits in out.router_logits:
        p = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(p, k + 1, dim=-1)
        layers.append({"experts": top.indices[:, :k].tolist(),
                       "gap": (top.values[:, k - 1] - top.values[:, k]).tolist()})
    return layers


def tiny_gguf(path, arch, name, cfg, pre):
    """A gguf-py writer for a tiny model of `cfg` at `path`: the keys both MoE fixtures share
    (shape, RoPE base, norm epsilon, experts) and a small byte-level BPE vocabulary (the 256 byte
    symbols, one merge, control tokens up to the vocabulary size) with llama.cpp's pre-tokenizer
    `pre`. The caller adds its family's keys and the tensors, then `finish_gguf`."""
    import gguf
    from tokenizers.pre_tokenizers import ByteLevel
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    tokens = sorted(ByteLevel.alphabet(), key=lambda c: ord(c)) + ["\u0120t"]
    tokens += [f"<|ctl_{i}|>" for i in range(cfg["vocab_size"] - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3] * (len(tokens) - 257))
    w.add_token_merges(["\u0120 t"])
    w.add_eos_token_id(len(tokens) - 1)
    return w


def finish_gguf(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def moe_gguf(base_dir, out_dir):
    """tests/fixtures/tiny-qwen3-moe (its transformers-built weights) as a GGUF file in llama.cpp's
    layout for `qwen3moe` (written with llama.cpp's gguf-py: the experts stacked as
    ffn_{gate,up,down}_exps, f32), with a small byte-level vocabulary. The reference logits are
    transformers' on the GGUF as its own GGUF reader loads it (given the two settings its GGUF
    mapping does not read: the experts' width and norm_topk_prob) — checked here to equal the
    safetensors model's, so the file holds what llama.cpp's converter would put there."""
    import numpy as np
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(base_dir, "config.json")))
    sd = load_file(os.path.join(base_dir, "model.safetensors"))
    name = "tiny-qwen3-moe.gguf"
    path = os.path.join(out_dir, name)
    w = tiny_gguf(path, "qwen3moe", "tiny-qwen3-moe", cfg, "qwen2")
    L, E = cfg["num_hidden_layers"], cfg.get("num_experts") or cfg["num_local_experts"]
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_weights_norm(bool(cfg["norm_topk_prob"]))
    t = lambda k: sd[k].float().numpy()
    w.add_tensor("token_embd.weight", t("model.embed_tokens.weight"))
    w.add_tensor("output_norm.weight", t("model.norm.weight"))
    w.add_tensor("output.weight", t("lm_head.weight"))
    for l in range(L):
        p = f"model.layers.{l}."
        for ours, hf in [("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"),
                         ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
                         ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                         ("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm"),
                         ("ffn_gate_inp", "mlp.gate")]:
            w.add_tensor(f"blk.{l}.{ours}.weight", t(p + hf + ".weight"))
        for ours, hf in [("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")]:
            stacked = np.stack([t(f"{p}mlp.experts.{e}.{hf}.weight") for e in range(E)])
            w.add_tensor(f"blk.{l}.ffn_{ours}_exps.weight", stacked)
    finish_gguf(w)
    hf = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(
        out_dir, gguf_file=name, dtype=torch.float32,
        moe_intermediate_size=cfg["moe_intermediate_size"], norm_topk_prob=cfg["norm_topk_prob"]).eval()
    g = torch.Generator().manual_seed(1234)
    cases = []
    for n in (1, 7, 40):
        ids = torch.randint(0, cfg["vocab_size"], (n,), generator=g).tolist()
        logits = model(torch.tensor([ids])).logits[0]
        want = hf(torch.tensor([ids])).logits[0]
        assert torch.allclose(logits, want, atol=1e-4), "transformers reads the GGUF as the safetensors model"
        cases.append({"ids": ids, "logits": logits.tolist()})
    doc = {"source": "transformers %s + torch %s, float32, on the GGUF as transformers' GGUF reader loads it"
           % (transformers.__version__, torch.__version__), "model": name, "cases": cases}
    json.dump(doc, open(os.path.join(out_dir, "tiny-qwen3-moe-gguf_reference.json"), "w"))
    print(name, "ok")


def route_gaps(model, ids):
    """Per position of `ids`: the smallest gap over the layers between the k-th and the (k+1)-th
    router probability."""
    layers = moe_routes(model, ids)
    return [min(l["gap"][t] for l in layers) for t in range(len(ids))]


def moe_fused(base_dir, out_dir):
    """tests/fixtures/tiny-qwen3-moe as transformers 5 holds it in memory — every layer's experts
    as two fused parameters, `mlp.experts.gate_up_proj` [E, 2·I, h] and `mlp.experts.down_proj`
    [E, h, I] — saved straight from its state_dict (save_pretrained converts back to one tensor
    per expert), for the loader's fused path. Same weights, so the same reference logits."""
    import shutil
    from safetensors.torch import save_file
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    d = os.path.join(out_dir, "tiny-qwen3-moe-fused")
    os.makedirs(d, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd), "transformers keeps fused experts"
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(base_dir, "config.json"), os.path.join(d, "config.json"))
    print("tiny-qwen3-moe-fused ok")


def mixtral_gguf(base_dir, out_dir):
    """tests/fixtures/tiny-mixtral as a GGUF file in llama.cpp's layout for Mixtral: architecture
    `llama` with `llama.expert_count`, q and k rows permuted for llama.cpp's interleaved RoPE
    (its converter's `permute`), the experts stacked as ffn_{gate,up,down}_exps, f32, a small
    byte-level vocabulary. transformers' GGUF reader has no Mixtral, so the reference is the
    safetensors model's own (tiny-mixtral_reference.json: the same weights)."""
    import numpy as np
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(base_dir, "config.json")))
    sd = load_file(os.path.join(base_dir, "model.safetensors"))
    path = os.path.join(out_dir, "tiny-mixtral.gguf")
    w = tiny_gguf(path, "llama", "tiny-mixtral", cfg, "gpt2")
    L, E = cfg["num_hidden_layers"], cfg["num_local_experts"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    t = lambda k: sd[k].float().numpy()

    def permute(x, n_head):
        # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: each head's rows from HF's
        # half-split rotary order to interleaved pairs.
        return x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    w.add_tensor("token_embd.weight", t("model.embed_tokens.weight"))
    w.add_tensor("output_norm.weight", t("model.norm.weight"))
    w.add_tensor("output.weight", t("lm_head.weight"))
    for l in range(L):
        p = f"model.layers.{l}."
        w.add_tensor(f"blk.{l}.attn_norm.weight", t(p + "input_layernorm.weight"))
        w.add_tensor(f"blk.{l}.ffn_norm.weight", t(p + "post_attention_layernorm.weight"))
        w.add_tensor(f"blk.{l}.attn_q.weight", permute(t(p + "self_attn.q_proj.weight"), heads))
        w.add_tensor(f"blk.{l}.attn_k.weight", permute(t(p + "self_attn.k_proj.weight"), kv_heads))
        w.add_tensor(f"blk.{l}.attn_v.weight", t(p + "self_attn.v_proj.weight"))
        w.add_tensor(f"blk.{l}.attn_output.weight", t(p + "self_attn.o_proj.weight"))
        w.add_tensor(f"blk.{l}.ffn_gate_inp.weight", t(p + "block_sparse_moe.gate.weight"))
        for ours, hf in [("gate", "w1"), ("up", "w3"), ("down", "w2")]:
            stacked = np.stack([t(f"{p}block_sparse_moe.experts.{e}.{hf}.weight") for e in range(E)])
            w.add_tensor(f"blk.{l}.ffn_{ours}_exps.weight", stacked)
    finish_gguf(w)
    print("tiny-mixtral.gguf ok")


QWEN_PROMPTS = [
    "def quicksort(arr):\n",
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about Rust.<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé 中文 and digits 12345 mixed.",
]


def qwen_gguf(gguf_path, out_dir, name):
    d, f = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    cases = []
    for p in QWEN_PROMPTS:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        logits = model(torch.tensor([ids])).logits[0, -1]
        cases.append({"prompt": p, "ids": ids, "top5": top_k(logits)})
    messages = [{"role": "user", "content": "Write a Python function that returns the square of x."}]
    chat_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(chat_prompt, add_special_tokens=False)["input_ids"]
    gen = model.generate(torch.tensor([prompt_ids]), max_new_tokens=32, do_sample=False,
                         eos_token_id=[151645, 151643], pad_token_id=151643)
    out_ids = gen[0, len(prompt_ids):].tolist()
    doc = {
        "source": "transformers %s + torch %s, float32, GGUF dequantised by transformers" % (
            transformers.__version__, torch.__version__),
        "gguf": f,
        "tie_word_embeddings": bool(model.config.tie_word_embeddings),
        "cases": cases,
        "greedy_chat": {"messages": messages, "prompt": chat_prompt, "prompt_ids": prompt_ids,
                        "output_ids": out_ids, "text": tok.decode(out_ids, skip_special_tokens=True)},
    }
    with open(os.path.join(out_dir, f"{name}_reference.json"), "w") as fh:
        json.dump(doc, fh, indent=1, ensure_ascii=False)
    print(name, ":", doc["greedy_chat"]["text"])


GEMMA_TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Ünïcödé text, emoji 🦀🚀 and 中文字符 mixed with ASCII.",
    "   leading spaces,  double  spaces and trailing tabs\t\t\nnewlines\r\n",
    "<start_of_turn>user\nHi!<end_of_turn>\n",
]


def gemma_gguf(gguf_path, out_dir, name):
    """Gemma 3 270M (base): transformers' tokenizer and model from the GGUF, BOS prepended as its
    tokenizer does by default."""
    d, f = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    bos = tok.bos_token_id
    toks = [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in GEMMA_TEXTS]
    cases = []
    for t in GEMMA_TEXTS[:3]:
        ids = [bos] + tok(t, add_special_tokens=False)["input_ids"]
        logits = model(torch.tensor([ids])).logits[0, -1]
        cases.append({"prompt": t, "ids": ids, "top5": top_k(logits)})
    # A prompt longer than the 512-token sliding window: the local layers' windows apply.
    long_ids = [bos] + tok(" ".join(["The history of the city goes back many centuries."] * 60),
                           add_special_tokens=False)["input_ids"]
    logits = model(torch.tensor([long_ids])).logits[0, -1]
    cases.append({"prompt": "(long)", "ids": long_ids, "top5": top_k(logits)})
    prompt_ids = [bos] + tok("The capital of France is", add_special_tokens=False)["input_ids"]
    out_ids = greedy(model, prompt_ids, 24)
    doc = {
        "source": "transformers %s + torch %s, float32, GGUF read and dequantised by transformers" % (
            transformers.__version__, torch.__version__),
        "gguf": f, "tokenizer": toks, "cases": cases,
        "greedy": {"prompt_ids": prompt_ids, "output_ids": out_ids,
                   "text": tok.decode(out_ids, skip_special_tokens=True)},
    }
    with open(os.path.join(out_dir, f"{name}_reference.json"), "w") as fh:
        json.dump(doc, fh, indent=1, ensure_ascii=False)
    print(name, ":", doc["greedy"]["text"], "| long prompt:", len(long_ids), "tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", help="SmolLM2 GGUF (from `cachet model fetch smollm2`)")
    ap.add_argument("--tiny", nargs="*", default=[], help="tiny HF model directories made by `cachet model random`")
    ap.add_argument("--families", nargs="*", default=[], choices=sorted(FAMILIES),
                    help="tiny models of other families to build with transformers, with references")
    ap.add_argument("--qwen-gguf", help="Qwen2.5-Coder-0.5B GGUF (from `cachet model fetch qwen2.5-coder-0.5b`)")
    ap.add_argument("--qwen15-gguf", help="Qwen2.5-Coder-1.5B GGUF (from `cachet model fetch qwen2.5-coder-1.5b`)")
    ap.add_argument("--gemma-gguf", help="Gemma 3 270M GGUF (from `cachet model fetch gemma3-270m`)")
    ap.add_argument("--fp8", action="store_true",
                    help="FP8 checkpoints of tests/fixtures/tiny-qwen3 (block and per-channel scales)")
    ap.add_argument("--refs", nargs="*", default=[], choices=sorted(FAMILIES),
                    help="recompute the references of tiny family models already in --out")
    ap.add_argument("--moe-gguf", action="store_true",
                    help="tests/fixtures/tiny-qwen3-moe and tiny-mixtral as llama.cpp-layout GGUF files (transformers' logits on the first)")
    ap.add_argument("--out", default="tests/fixtures")
    a = ap.parse_args()
    if a.gguf:
        smollm2(a.gguf, a.out)
    for d in a.tiny:
        tiny(d, a.out)
    for name in a.families:
        tiny_with_greedy(build_family(name, a.out), a.out)
    for name in a.refs:
        tiny_with_greedy(os.path.join(a.out, name), a.out)
    if a.qwen_gguf:
        qwen_gguf(a.qwen_gguf, a.out, "qwen2.5-coder-0.5b")
    if a.qwen15_gguf:
        qwen_gguf(a.qwen15_gguf, a.out, "qwen2.5-coder-1.5b")
    if a.gemma_gguf:
        gemma_gguf(a.gemma_gguf, a.out, "gemma3-270m")
    if a.moe_gguf:
        moe_gguf(os.path.join(a.out, "tiny-qwen3-moe"), a.out)
        mixtral_gguf(os.path.join(a.out, "tiny-mixtral"), a.out)
        moe_fused(os.path.join(a.out, "tiny-qwen3-moe"), a.out)
    if a.fp8:
        for scheme in ("block", "channel"):
            fp8_variant(os.path.join(a.out, "tiny-qwen3"), a.out, scheme)


if __name__ == "__main__":
    sys.exit(main())
