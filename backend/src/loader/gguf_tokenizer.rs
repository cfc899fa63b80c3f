//! Builds a `tokenizers` tokenizer from the vocabulary, merges and special tokens that llama.cpp
//! stores in GGUF metadata (`tokenizer.ggml.*`), plus the chat template.
//!
//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`, the pre-tokenizer following
//! `tokenizer.ggml.pre` the way llama.cpp reads it) and SentencePiece BPE (`"llama"`, with scores:
//! Llama 2, Gemma).

use serde_json::{json, Value};

use super::gguf::GgufFile;
use crate::error::LoadError;
use crate::tokenizer::{TextTokenizer, LLAMA3_SPLIT, QWEN2_SPLIT};

/// llama.cpp's token types.
const TOKEN_TYPE_CONTROL: u64 = 3;
const TOKEN_TYPE_USER_DEFINED: u64 = 4;

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

/// A `tokenizer.ggml.pre` name with no pre-tokenizer here.
#[derive(Debug, thiserror::Error)]
#[error(
    "pre-tokenizer `{0}` is not supported (supported: smollm, starcoder, llama-bpe, qwen2, gpt2)"
)]
struct UnsupportedPreTokenizer(String);

/// The pre-tokenizer for llama.cpp's `tokenizer.ggml.pre` name.
fn pre_tokenizer(pre: &str) -> Result<Value, UnsupportedPreTokenizer> {
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
        other => return Err(UnsupportedPreTokenizer(other.to_string())),
    })
}

/// Reads the tokenizer of a GGUF file: byte-level BPE (`tokenizer.ggml.model = "gpt2"`) or
/// SentencePiece BPE (`"llama"`: Llama 2, Gemma), as llama.cpp reads them.
pub fn from_gguf(file: &GgufFile) -> Result<TextTokenizer, LoadError> {
    let path = file.path();
    let model = file.get_str("tokenizer.ggml.model")?;
    let tokens = file.get_array("tokenizer.ggml.tokens")?;
    let types = file
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
        .unwrap_or(&[]);
    let strings: Vec<&str> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| {
            t.as_str()
                .ok_or_else(|| LoadError::format(path, format!("token {id} is not a string")))
        })
        .collect::<Result<_, _>>()?;
    let added: Vec<Value> = strings
        .iter()
        .enumerate()
        .filter_map(|(id, s)| {
            let ty = types.get(id).and_then(|v| v.as_u64()).unwrap_or(1);
            (ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED).then(|| {
                json!({
                    "id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": ty == TOKEN_TYPE_CONTROL,
                })
            })
        })
        .collect();
    let doc = match model {
        "gpt2" => byte_level_bpe(file, &strings, added)?,
        // SentencePiece pieces of spaces are spelled with `▁` (see `sentencepiece_bpe`): such an
        // added token takes that spelling and is matched after normalisation, as the text's
        // spaces are.
        "llama" => {
            let added = added
                .into_iter()
                .map(|mut t| {
                    let content = t["content"].as_str().unwrap_or_default().to_string();
                    if content.chars().count() > 1 && content.chars().all(|c| c == ' ') {
                        t["content"] = json!("\u{2581}".repeat(content.chars().count()));
                        t["normalized"] = json!(true);
                    }
                    t
                })
                .collect();
            sentencepiece_bpe(file, &strings, added)?
        }
        other => {
            return Err(LoadError::Tokenizer(format!(
                "{}: tokenizer model `{other}` is not supported (supported: gpt2 byte-level BPE, llama SentencePiece BPE); load the HF directory with tokenizer.json instead",
                path.display()
            )))
        }
    };
    let mut doc = doc;
    // A prompt the model is given as text starts with BOS where the file says so (Gemma, Llama
    // 2): a post-processor adds it when special tokens are asked for (`encode_prompt`).
    let bos_id = file
        .get("tokenizer.ggml.bos_token_id")
        .and_then(|v| v.as_u64())
        .filter(|&id| (id as usize) < strings.len());
    let add_bos = file
        .get("tokenizer.ggml.add_bos_token")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if let (true, Some(id)) = (add_bos, bos_id) {
        let bos = strings[id as usize];
        doc["post_processor"] = json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [id], "tokens": [bos]}},
        });
    }
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
            .and_then(|id| strings.get(id as usize))
            .map(|t| t.to_string())
    };
    // llama.cpp's named templates: `tokenizer.chat_template.<name>`.
    let tool_template = file
        .get("tokenizer.chat_template.tool_use")
        .and_then(|v| v.as_str())
        .map(String::from);
    Ok(TextTokenizer::new(
        inner,
        chat_template,
        name_of("tokenizer.ggml.bos_token_id"),
        name_of("tokenizer.ggml.eos_token_id"),
    )
    .with_tool_template(tool_template))
}

/// Byte-level BPE with the file's merges; the pre-tokenizer follows `tokenizer.ggml.pre`.
fn byte_level_bpe(file: &GgufFile, tokens: &[&str], added: Vec<Value>) -> Result<Value, LoadError> {
    let path = file.path();
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
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, s)| (s.to_string(), json!(id)))
        .collect();
    let merges: Vec<Value> = file
        .get_array("tokenizer.ggml.merges")?
        .iter()
        .map(|m| {
            m.as_str()
                .map(|s| json!(s))
                .ok_or_else(|| LoadError::format(path, "a merge is not a string"))
        })
        .collect::<Result<_, _>>()?;
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    let model = Bpe {
        vocab,
        merges,
        unk: None,
        byte_fallback: false,
    };
    Ok(tokenizer_json(added, normalizer, pre, decoder, model))
}

/// A BPE model's parts.
struct Bpe {
    vocab: serde_json::Map<String, Value>,
    merges: Vec<Value>,
    /// The unknown piece; with `byte_fallback`, what lacks a piece becomes its `<0xNN>` bytes.
    unk: Option<String>,
    byte_fallback: bool,
}

/// The `tokenizers` JSON of a BPE tokenizer.
fn tokenizer_json(
    added: Vec<Value>,
    normalizer: Value,
    pre: Value,
    decoder: Value,
    m: Bpe,
) -> Value {
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": decoder,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": m.unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": m.byte_fallback, "byte_fallback": m.byte_fallback,
            "ignore_merges": false, "vocab": m.vocab, "merges": m.merges,
        },
    })
}

/// SentencePiece BPE (llama.cpp's `llama` vocabulary: pieces with `▁` for spaces, scores, and
/// `<0xNN>` byte pieces for what the vocabulary lacks). The file has no merges: they are
/// recovered from the vocabulary — every split of a piece into two pieces is a merge, ranked by
/// the merged piece's score (by its place in the file for Gemma, whose scores are that order),
/// longer left parts first — which is what SentencePiece's highest-score-pair-first merging does.
fn sentencepiece_bpe(
    file: &GgufFile,
    tokens: &[&str],
    added: Vec<Value>,
) -> Result<Value, LoadError> {
    let path = file.path();
    let gemma = file
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .is_some_and(|a| a.starts_with("gemma"));
    let scores: Vec<f64> = match file.get("tokenizer.ggml.scores").and_then(|v| v.as_array()) {
        Some(s) if !gemma => s.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect(),
        // Gemma: rank by position (its file order is its merge order).
        _ => (0..tokens.len()).map(|i| -(i as f64)).collect(),
    };
    if scores.len() != tokens.len() {
        return Err(LoadError::format(
            path,
            format!("{} token scores for {} tokens", scores.len(), tokens.len()),
        ));
    }
    // Gemma stores pieces of two or more spaces as spaces; the normaliser turns text spaces into
    // `▁`, so those pieces are looked up as `▁`s.
    let pieces: Vec<String> = tokens
        .iter()
        .map(|t| {
            if t.chars().count() > 1 && t.chars().all(|c| c == ' ') {
                "\u{2581}".repeat(t.chars().count())
            } else {
                t.to_string()
            }
        })
        .collect();
    let mut ids: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(pieces.len());
    for (id, p) in pieces.iter().enumerate() {
        ids.insert(p, id);
    }
    // (left, right, score of the merged piece), the splits of each piece in id order of their
    // parts.
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    let mut local = Vec::new();
    for (piece, &score) in pieces.iter().zip(&scores) {
        local.clear();
        for (i, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(i);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                local.push((li, ri, l, r));
            }
        }
        local.sort_by_key(|&(li, ri, _, _)| (li, ri));
        merges.extend(local.iter().map(|&(_, _, l, r)| (l, r, score)));
    }
    // Best first; among equals the longer left part first (a stable sort keeps the rest in order).
    merges.sort_by(|a, b| {
        b.2.total_cmp(&a.2)
            .then(b.0.chars().count().cmp(&a.0.chars().count()))
            .then(b.1.chars().count().cmp(&a.1.chars().count()))
    });
    let vocab: serde_json::Map<String, Value> = ids
        .iter()
        .map(|(p, &id)| (p.to_string(), json!(id)))
        .collect();
    let merges: Vec<Value> = merges.iter().map(|(l, r, _)| json!([l, r])).collect();
    let space_prefix = file
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(|v| v.as_bool())
        .unwrap_or(!gemma);
    let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    // A prefix space added to the text is taken off the decoded text.
    let normalizer = if space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u{2581}"}, replace]})
    } else {
        replace
    };
    let decoder = json!({"type": "Sequence", "decoders": decoders});
    let unk = file
        .get("tokenizer.ggml.unknown_token_id")
        .and_then(|v| v.as_u64())
        .and_then(|id| pieces.get(id as usize))
        .cloned();
    let model = Bpe {
        vocab,
        merges,
        unk,
        byte_fallback: true,
    };
    Ok(tokenizer_json(
        added,
        normalizer,
        Value::Null,
        decoder,
        model,
    ))
}
