"""A real model as its Hugging Face repository lays it out, assembled from its GGUF file.

    hf_layout.py MODEL.gguf OUT_DIR

Writes config.json, generation_config.json, tokenizer.json, tokenizer_config.json (with the chat
template) and model.safetensors (float16) for a llama or qwen2 GGUF: the weights dequantized by
gguf-py (llama.cpp's own reader), the tokenizer converted by transformers' GGUF tokenizer mapping,
llama's query/key rows put back in Hugging Face's order (llama.cpp's converter interleaves them).
The local Hub server of the hub tests serves what this writes; the tests hold the engine's output
on it to the same model read from its GGUF.
"""

import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file
from tokenizers import pre_tokenizers
from transformers.integrations.gguf.gguf_tokenizer_mapping import (
    GGUF_TOKENIZER_MAPPING,
    convert_gguf_tokenizer,
)

ARCHS = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}
LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def field(reader, name, default=None):
    f = reader.fields.get(name)
    return default if f is None else f.contents()


def unpermute(w, heads):
    """llama.cpp's converter wrote each head's q/k rows as (half, pair); HF's order is (pair, half)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name):
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    blk, layer, part, kind = gguf_name.split(".")
    assert blk == "blk", gguf_name
    return f"model.layers.{layer}.{LAYER[part]}.{kind}"


def main(gguf_path, out):
    reader = GGUFReader(gguf_path)
    arch = field(reader, "general.architecture")
    if arch not in ARCHS:
        sys.exit(f"{gguf_path}: architecture {arch} (this script knows {sorted(ARCHS)})")
    heads = field(reader, f"{arch}.attention.head_count")
    kv_heads = field(reader, f"{arch}.attention.head_count_kv", heads)
    tensors = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue  # llama 3's rope scaling, which config.json states
        w = dequantize(t.data, t.tensor_type).reshape(tuple(reversed([int(d) for d in t.shape])))
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_k.weight")):
            w = unpermute(w, heads if "attn_q" in t.name else kv_heads)
        tensors[hf_name(t.name)] = np.ascontiguousarray(w.astype(np.float16))
    tokens = field(reader, "tokenizer.ggml.tokens")
    bos, eos = field(reader, "tokenizer.ggml.bos_token_id"), field(reader, "tokenizer.ggml.eos_token_id")
    architecture, model_type = ARCHS[arch]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": field(reader, f"{arch}.embedding_length"),
        "intermediate_size": field(reader, f"{arch}.feed_forward_length"),
        "num_hidden_layers": field(reader, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": field(reader, f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": field(reader, f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": field(reader, f"{arch}.context_length"),
        "vocab_size": len(tokens),
        "hidden_act": "silu",
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float16",
    }
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos, "eos_token_id": eos}, f, indent=2)

    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    tok = {name: field(reader, f"tokenizer.{key}") for key, name in renames.items()}
    tok = {k: v for k, v in tok.items() if v is not None}
    backend, _ = convert_gguf_tokenizer(arch, tok)
    if tok.get("pre_tokenizer_type") == "smollm":
        # SmolLM2's own tokenizer.json: digits one by one, then GPT-2's byte-level split.
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    backend.save(os.path.join(out, "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[bos] if bos is not None else None,
        "eos_token": tokens[eos],
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "model_max_length": config["max_position_embeddings"],
        "chat_template": field(reader, "tokenizer.chat_template"),
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
