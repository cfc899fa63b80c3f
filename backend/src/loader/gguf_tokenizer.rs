//! Builds a `tokenizers` tokenizer from the vocabulary, merges and special tokens that llama.cpp
//! stores in GGUF metadata (`tokenizer.ggml.*`), plus the chat template.
//!
//! Only byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is supported; the pre-tokenizer follows
//! `tokenizer.ggml.pre` the way llama.cpp reads it.

use serde_json::{json, Value};

use super::gguf::GgufFile;
use crate::error::LoadError;
use crate::tokenizer::TextTokenizer;

/// llama.cpp's token types.
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

/// Qwen2's split: Llama 3's with every digit on its own.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

/// The pre-tokenizer for llama.cpp's `tokenizer.ggml.pre` name.
fn pre_tokenizer(pre: &str) -> Result<Value, String> {
    Ok(match pre {
        // GPT-2 regex after splitting every digit on its own (SmolLM, StarCoder, …).
        "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" => json!({
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)],
        }),
        "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" | "dbrx" | "falcon3" => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": false},
                byte_level(false),
            ],
        }),
        "qwen2" => json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false},
                byte_level(false),
            ],
        }),
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        other => return Err(format!("pre-tokenizer `{other}` is not supported (supported: smollm, starcoder, llama-bpe, qwen2, gpt2)")),
    })
}

/// Reads the tokenizer of a GGUF file.
pub fn from_gguf(file: &GgufFile) -> Result<TextTokenizer, LoadError> {
    let path = file.path();
    let model = file.get_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(LoadError::Tokenizer(format!(
            "{}: tokenizer model `{model}` is not supported (only byte-level BPE, `gpt2`); load the HF directory with tokenizer.json instead",
            path.display()
        )));
    }
    let pre = file
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    // Qwen2's tokenizer normalises to NFC first (its tokenizer.json says so).
    let normalizer = if pre == "qwen2" {
        json!({"type": "NFC"})
    } else {
        Value::Null
    };
    let pre =
        pre_tokenizer(pre).map_err(|e| LoadError::Tokenizer(format!("{}: {e}", path.display())))?;
    let tokens = file.get_array("tokenizer.ggml.tokens")?;
    let types = file
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
        .unwrap_or(&[]);
    let merges = file.get_array("tokenizer.ggml.merges")?;

    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        let s = t
            .as_str()
            .ok_or_else(|| LoadError::format(path, format!("token {id} is not a string")))?;
        vocab.insert(s.to_string(), json!(id));
        let ty = types.get(id).and_then(|v| v.as_u64()).unwrap_or(1);
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({
                "id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty == TOKEN_TYPE_CONTROL,
            }));
        }
    }
    let merges: Vec<Value> = merges
        .iter()
        .map(|m| {
            m.as_str()
                .map(|s| json!(s))
                .ok_or_else(|| LoadError::format(path, "a merge is not a string"))
        })
        .collect::<Result<_, _>>()?;
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    let inner: tokenizers::Tokenizer = doc.to_string().parse().map_err(|e| {
        LoadError::Tokenizer(format!(
            "{}: building the tokenizer failed: {e}",
            path.display()
        ))
    })?;
    let chat_template = file
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())
        .map(String::from);
    let name_of = |key: &str| {
        file.get(key)
            .and_then(|v| v.as_u64())
            .and_then(|id| tokens.get(id as usize))
            .and_then(|t| t.as_str())
            .map(String::from)
    };
    Ok(TextTokenizer::new(
        inner,
        chat_template,
        name_of("tokenizer.ggml.bos_token_id"),
        name_of("tokenizer.ggml.eos_token_id"),
    ))
}
