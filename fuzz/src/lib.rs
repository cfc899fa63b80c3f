//! The bodies of Cachet's fuzz targets: everything the gateway or the engine parses from
//! outside, each driven with arbitrary bytes and held to what it promises — a value or a clear
//! error, never a panic, a hang or an allocation out of proportion to the input — plus each
//! parser's own invariants (below, per target).
//!
//! `fuzz_targets/*.rs` hand these to libFuzzer (`scripts/fuzz.sh`, nightly, `--features
//! libfuzzer`); `tests/corpus.rs` runs them over the committed corpus (`corpus/<target>/`, the
//! seeds and every input a fuzzer once failed on) on stable, in CI.

use std::path::Path;
use std::sync::OnceLock;

use cachet_backend::loader::{self, gguf::GgufFile, hf};
use cachet_backend::tokenizer::TextTokenizer;
use cachet_gateway::normalize::tokens::{self, PrefixTokens};
use cachet_gateway::normalize::{self, Mode, Rules};
use cachet_gateway::sandbox::{self, SandboxConfig, MAX_STOP_BYTES, MAX_STOP_HINTS};
use cachet_gateway::server::fields::UnknownFields;
use cachet_gateway::server::openai::{self, Input};
use cachet_guest_sdk::{Cache, Segment};

/// A fuzz target: any bytes in, a panic when the code under test breaks a promise.
pub type Target = fn(&[u8]);

/// The targets by name, for the corpus runner.
pub const TARGETS: &[(&str, Target)] = &[
    ("request", request),
    ("template_reply", template_reply),
    ("template_module", template_module),
    ("normalizer", normalizer),
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("schema", schema),
    ("lark", lark),
];

/// A structured-output schema (the input as JSON; not JSON: nothing to do) checked, compiled and
/// followed for a few tokens the way the engine does it: refused with a limit, refused as not
/// compiling, or a grammar whose masks and steps work — never a panic, a hang or a stack
/// overflow (which aborts the fuzzer). The seeds are chains of `$ref`s at and past the depth
/// limit, wide alternations and recursive references (`make_seeds.py`).
pub fn schema(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    follow_constraint(cachet_backend::grammar::Constraint::JsonSchema(v), data);
}

/// A Lark grammar (the input as text), as [`schema`]: chains of rules, deep groups, wide
/// alternations, `%json` blocks.
pub fn lark(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    follow_constraint(cachet_backend::grammar::Constraint::Lark(text), data);
}

/// Checks, compiles and follows `c` for up to 16 tokens picked by `data` among those allowed.
fn follow_constraint(c: cachet_backend::grammar::Constraint, data: &[u8]) {
    use cachet_backend::grammar::GrammarCompiler;
    use cachet_backend::EngineError;
    static COMPILER: OnceLock<GrammarCompiler> = OnceLock::new();
    let tok = &tokenizers_for_fuzzing()[0];
    let g = COMPILER.get_or_init(|| {
        let eos = tok
            .token_id("<|im_end|>")
            .expect("the fuzzing vocabulary has <|im_end|>");
        GrammarCompiler::new(tok.clone(), eos, tok.vocab_size())
    });
    let checked = c.check();
    let mut m = match g.compile(&c) {
        Ok(m) => m,
        Err(EngineError::InvalidRequest(msg)) => {
            assert!(!msg.is_empty());
            return;
        }
        // Busy (the compile slots) or anything else a fuzzing run cannot cause: a failure.
        Err(e) => panic!("a constraint compiled to {e}"),
    };
    assert!(checked.is_ok(), "compiled past the limits: {checked:?}");
    let words = tok.vocab_size().div_ceil(32);
    let mut mask = vec![0u32; words];
    for &pick in data.iter().take(16) {
        if m.is_stopped() || m.mask(&mut mask).is_err() {
            return;
        }
        let allowed: Vec<u32> = (0..tok.vocab_size() as u32)
            .filter(|t| mask[*t as usize / 32] >> (t % 32) & 1 == 1)
            .collect();
        let Some(&t) = allowed.get(pick as usize % allowed.len().max(1)) else {
            return;
        };
        m.consume(t)
            .expect("the grammar takes a token its mask allowed");
    }
}

/// A request body (first byte: chat or text completion, unknown fields refused or let
/// through) through the API's parsing and validation: a request within the API's limits, or a
/// 400 that says what to fix.
pub fn request(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let chat = kind & 1 == 0;
    let unknown = if kind & 2 == 0 {
        UnknownFields::Reject
    } else {
        UnknownFields::Warn
    };
    match openai::parse_request(chat, body, unknown) {
        Ok(p) => {
            assert_ne!(p.max_tokens, Some(0));
            assert!((1..=openai::MAX_N as usize).contains(&p.n));
            p.sampling
                .validate()
                .expect("the engine takes what the API admits");
            assert!(unknown == UnknownFields::Warn || p.ignored.is_empty());
            assert!(
                p.stop.len() <= MAX_STOP_HINTS,
                "{} stop strings",
                p.stop.len()
            );
            assert!(p
                .stop
                .iter()
                .all(|s| !s.is_empty() && s.len() <= MAX_STOP_BYTES));
            match &p.input {
                Input::Chat(_, msgs) => {
                    assert!(!msgs.is_empty());
                    assert!(msgs
                        .iter()
                        .all(|m| ["system", "user", "assistant"].contains(&m.role.as_str())));
                }
                Input::Text(_, prompts) => {
                    assert!(!prompts.is_empty() && prompts.len() <= openai::MAX_PROMPTS);
                    assert!(prompts.len() * p.n <= openai::MAX_CHOICES);
                    assert!(prompts.iter().all(|x| match x {
                        openai::PromptIn::Text(t) => !t.is_empty(),
                        openai::PromptIn::Tokens(t) => !t.is_empty(),
                    }));
                }
            }
            let salt = p.input.common().salt(&[7; 32]);
            if p.input.common().cache_salt.is_some() {
                assert_ne!(salt, [7; 32], "a client salt must split the tenant's cache");
            }
        }
        Err(e) => {
            assert_eq!(e.status.as_u16(), 400, "{}", e.message);
            assert!(!e.message.is_empty());
        }
    }
}

/// A template's reply through the gateway's reply parser: segments and hints within the API's
/// limits, or an error saying what is wrong with the reply.
pub fn template_reply(data: &[u8]) {
    match sandbox::parse_reply(data) {
        Ok(r) => {
            assert!(!r.segments.is_empty());
            assert!(r.segments.iter().all(|s| !s.role.trim().is_empty()));
            assert!(r.stop.len() <= MAX_STOP_HINTS);
            assert!(r
                .stop
                .iter()
                .all(|s| !s.is_empty() && s.len() <= MAX_STOP_BYTES));
            assert_ne!(r.max_tokens, Some(0));
            // What a template returns goes on to the normalizer.
            check_normalized(&r.segments, &Rules::default());
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// A tenant's upload through the checks made by parsing alone, before any compiling.
pub fn template_module(data: &[u8]) {
    if let Err(e) = sandbox::precheck(data, &SandboxConfig::default()) {
        assert!(!e.to_string().is_empty());
        assert!((400..500).contains(&e.status()), "{e}: {}", e.status());
    }
}

/// A prompt (segments cut from the input: `\x01` separates them, each one's first character
/// picks its role and whether it is static) through normalization, chat-template rendering and
/// tokenization. Holds the normalizer's properties (no value lost, idempotent, text without
/// volatile spans unchanged) and the prompt's: message text never yields a control token, and
/// the prompt's tokens are its pieces' tokens, the cached prefix's included.
pub fn normalizer(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mode = [Mode::Off, Mode::Relocate, Mode::RelocateAfter][(flags % 3) as usize];
    let text = String::from_utf8_lossy(rest);
    let segments: Vec<Segment> = text
        .split('\u{1}')
        .map(|part| {
            let mut chars = part.chars();
            let c = chars.next().map_or(0, |c| c as u32);
            let cache = if c & 4 == 0 {
                Cache::Static
            } else {
                Cache::Dynamic
            };
            let text = chars.as_str().to_string();
            match c & 24 {
                // A tool result (a message of its own), and an assistant's call.
                8 => Segment {
                    tool_call_id: Some(format!("call_{c}")),
                    cache,
                    ..Segment::fixed("tool", text)
                },
                16 => Segment {
                    tool_calls: vec![cachet_guest_sdk::ToolCall {
                        id: format!("call_{c}"),
                        name: "f".into(),
                        arguments: "{}".into(),
                    }],
                    cache,
                    ..Segment::fixed("assistant", text)
                },
                _ => Segment {
                    cache,
                    ..Segment::fixed(["system", "user", "assistant"][(c % 3) as usize], text)
                },
            }
        })
        .collect();
    let rules = Rules {
        mode,
        ..Rules::default()
    };
    let normalized = check_normalized(&segments, &rules);
    let (messages, first_dynamic) = normalize::to_messages(&normalized);
    if messages.is_empty() {
        return;
    }
    let tok = &tokenizers_for_fuzzing()[(flags as usize / 3) % 2];
    let rendered = match tokens::render(
        tok,
        &[],
        &messages,
        tokens::TemplateArgs::PLAIN,
        first_dynamic,
    ) {
        Ok(r) => r,
        Err(e) => {
            assert!(
                messages.iter().any(|m| tokens::has_reserved(&m.content)),
                "rendering failed without reserved characters: {e}"
            );
            return;
        }
    };
    assert!(rendered.boundary <= rendered.text.len());
    assert!(rendered.text.is_char_boundary(rendered.boundary));
    let mut at = 0;
    for p in &rendered.pieces {
        assert_eq!(p.range.start, at, "pieces must cover the prompt in order");
        at = p.range.end;
    }
    assert_eq!(at, rendered.text.len());
    // Message text never produces a control token; the prompt's control tokens are exactly
    // those of the template's markup.
    let specials = special_ids(tok);
    let count = |ids: &[u32]| ids.iter().filter(|i| specials.contains(i)).count();
    let mut expected = Vec::new();
    for p in &rendered.pieces {
        let piece = &rendered.text[p.range.clone()];
        if p.content {
            let ids = tok.encode_plain(piece).unwrap();
            assert_eq!(
                count(&ids),
                0,
                "message text {piece:?} gave a control token"
            );
            expected.extend(ids);
        } else {
            expected.extend(tok.encode(piece).unwrap());
        }
    }
    let cache = PrefixTokens::new(1 << 20);
    let first = cache.encode(tok, &rendered, &[1; 32]).unwrap();
    assert_eq!(count(&first.ids), count(&expected));
    if let Some(fill) = first.fill.clone() {
        cache.fill(fill);
        let again = cache.encode(tok, &rendered, &[1; 32]).unwrap();
        assert!(again.hit);
        assert_eq!(
            again.ids, first.ids,
            "a cached prefix changed the prompt's tokens"
        );
        let other = cache.encode(tok, &rendered, &[2; 32]).unwrap();
        assert!(!other.hit, "another tenant's salt hit the cache");
    }
}

/// Normalizes `segments` and checks the normalizer's properties; returns the result.
fn check_normalized(segments: &[Segment], rules: &Rules) -> Vec<Segment> {
    let n = normalize::normalize(segments, rules);
    let dynamic: String = n
        .segments
        .iter()
        .filter(|s| s.cache == Cache::Dynamic)
        .map(|s| s.text.as_str())
        .collect();
    for v in &n.relocated {
        assert!(dynamic.contains(v.as_str()), "{v:?} was lost");
    }
    if n.relocated.is_empty() {
        assert_eq!(n.segments, segments, "text without volatile spans changed");
    }
    assert_eq!(
        normalize::normalize(&n.segments, rules).segments,
        n.segments,
        "normalizing twice changed the prompt"
    );
    n.segments
}

/// A GGUF file: parsed, or refused with an error; every tensor read or refused; its config and
/// tokenizer built or refused.
pub fn gguf(data: &[u8]) {
    let path = Path::new("fuzz.gguf");
    let file = match GgufFile::from_bytes(path, data.to_vec()) {
        Ok(f) => f,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    for t in &file.tensors {
        if let Ok((shape, values)) = file.tensor_f32(&t.name) {
            assert_eq!(shape.iter().product::<usize>(), values.len());
        }
    }
    if let Ok(meta) = loader::gguf_meta(&file, path) {
        let c = &meta.config;
        assert!(c.num_attention_heads > 0 && c.head_dim > 0 && c.vocab_size > 0);
    }
}

/// A safetensors file: its tensors read (as f32) or refused with an error.
pub fn safetensors(data: &[u8]) {
    let path = Path::new("fuzz.safetensors");
    let names = match hf::shard_names(path, data) {
        Ok(n) => n,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    for name in names {
        match hf::read_tensor(path, data, &name) {
            Ok(t) => assert_eq!(t.shape.iter().product::<usize>(), t.data.len()),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

/// Two tokenizers as real models have them, built here so the targets need no files: byte-level
/// BPE with a few merges and special tokens, one with ChatML (SmolLM2, Qwen) and one with a
/// Gemma-style template that trims message text.
pub fn tokenizers_for_fuzzing() -> &'static [TextTokenizer; 2] {
    static T: OnceLock<[TextTokenizer; 2]> = OnceLock::new();
    T.get_or_init(|| {
        let chatml = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let gemma = "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";
        [
            TextTokenizer::new(
                byte_level_bpe(),
                Some(chatml.into()),
                None,
                Some("<|im_end|>".into()),
            ),
            TextTokenizer::new(
                byte_level_bpe(),
                Some(gemma.into()),
                Some("<bos>".into()),
                Some("<eos>".into()),
            ),
        ]
    })
}

const SPECIALS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<bos>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn>",
];

fn special_ids(tok: &TextTokenizer) -> Vec<u32> {
    SPECIALS.iter().filter_map(|s| tok.token_id(s)).collect()
}

/// Byte-level BPE over the 256 byte symbols, a handful of merges, and the special tokens.
fn byte_level_bpe() -> tokenizers::Tokenizer {
    // GPT-2's byte-to-symbol map: printable bytes stand for themselves, the rest move to 256+.
    let mut symbols = Vec::with_capacity(256);
    let mut shifted = 0;
    for b in 0u32..256 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        symbols.push(if printable {
            char::from_u32(b).unwrap()
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap()
        });
    }
    let mut vocab = serde_json::Map::new();
    for (i, c) in symbols.iter().enumerate() {
        vocab.insert(c.to_string(), i.into());
    }
    let merges = ["Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he", "e r"];
    for m in merges {
        vocab.insert(m.replace(' ', ""), vocab.len().into());
    }
    let added: Vec<serde_json::Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            serde_json::json!({"id": vocab.len() + i, "content": s, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
    })
    .to_string()
    .parse()
    .expect("the fuzzing tokenizer builds")
}
