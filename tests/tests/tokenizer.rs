//! The tokenizer built from GGUF metadata against transformers' (fixture from scripts/reference.py).

use cachet_tests::*;

#[test]
fn gguf_tokenizer_matches_transformers_on_mixed_text() {
    let tok = smollm2().tokenizer.as_ref().unwrap();
    let reference = read_json("smollm2_reference.json");
    for case in reference["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = tok.encode(text).unwrap();
        assert_eq!(ids, ids_of(&case["ids"]), "text {text:?}");
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            text,
            "round trip of {text:?}"
        );
    }
}

#[test]
fn special_tokens_and_chat_template_come_from_the_gguf() {
    let m = smollm2();
    let tok = m.tokenizer.as_ref().unwrap();
    assert_eq!(tok.token_id("<|im_start|>"), Some(1));
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert!(m.config.eos_token_ids.contains(&2));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
}

#[test]
fn incremental_decoding_never_splits_a_character() {
    let tok = smollm2().tokenizer.as_ref().unwrap();
    let text = "emoji 🦀🚀 and 中文字符 ok";
    let ids = tok.encode(text).unwrap();
    let mut dec = cachet_backend::tokenizer::IncrementalDecoder::new();
    let mut out = String::new();
    for id in ids {
        if let Some(p) = dec.push(tok, id).unwrap() {
            assert!(!p.contains('\u{FFFD}'), "piece {p:?}");
            out.push_str(&p);
        }
    }
    assert_eq!(out, text);
}

#[test]
fn a_dummy_models_every_generated_token_streams_as_text_at_once() {
    // Random weights pick arbitrary ids; shown through SmolLM2's plain tokens, each one is text
    // the moment it is made (no partial UTF-8 byte or special token holding the stream back).
    let tok = smollm2()
        .tokenizer
        .clone()
        .unwrap()
        .for_dummy_model(128_256);
    let mut dec = cachet_backend::tokenizer::IncrementalDecoder::new();
    for id in (0..128_256u32).step_by(97) {
        let piece = dec.push(&tok, id).unwrap();
        assert!(
            piece.is_some_and(|p| !p.is_empty()),
            "id {id} streamed nothing"
        );
    }
    // Prompt ids stay inside the model's vocabulary.
    assert!(tok
        .encode("hello world")
        .unwrap()
        .iter()
        .all(|&i| i < 128_256));
}

/// Tool conversations rendered by Cachet as transformers renders them (fixture from
/// scripts/chat_template_reference.py): Qwen2.5's template and our ChatML one — function
/// definitions through `tojson`, an assistant's calls with their arguments, tool results.
#[test]
fn tool_conversations_render_as_transformers_renders_them() {
    use cachet_backend::tokenizer::ChatMessage;
    let reference = read_json("chat_template_reference.json");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let base = smollm2().tokenizer.clone().unwrap();
    let mut checked = 0;
    for case in reference["cases"].as_array().unwrap() {
        let file = match case["template"].as_str().unwrap() {
            "qwen2.5" => root.join("tests/fixtures/qwen2.5-chat-template.jinja"),
            "chatml-tools" => root.join("examples/chat-templates/chatml-tools.jinja"),
            t => panic!("unknown template {t}"),
        };
        let tok = base
            .clone()
            .with_chat_template(std::fs::read_to_string(file).unwrap());
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(cachet_tests::chat_message)
            .collect();
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        let got = tok
            .render_chat_with(&messages, tools, None, true)
            .unwrap_or_else(|e| panic!("{} / {}: {e}", case["template"], case["name"]));
        assert_eq!(
            got,
            case["prompt"].as_str().unwrap(),
            "{} / {}",
            case["template"],
            case["name"]
        );
        checked += 1;
    }
    assert_eq!(checked, 8);
}

/// Message text through the ASCII path (`encode_plain` past the library's pipeline for byte-level
/// BPE vocabularies) gets the library's own ids, on SmolLM2's vocabulary (GPT-2's split after
/// single digits) and Qwen2.5's (Qwen2's split): prose, code, logs, whitespace and punctuation
/// runs, contractions of both cases, control-token text and every ASCII byte — and text the
/// path is not for (non-ASCII) still gets them, from the library.
#[test]
fn ascii_message_text_gets_the_librarys_ids_on_real_vocabularies() {
    let mut texts: Vec<String> = vec![
        "What is the capital of France?".into(),
        "You are a helpful assistant for Acme routers. Today is 2026-12-02T13:05:00Z.".into(),
        "I'M sure they'RE here; we'll see. Don't   stop\n\n\n  ok\r\n\tdone  ".into(),
        "def f(x):\n    return [i**2 for i in range(10) if i % 3 == 0]  # squares\n".into(),
        "ERROR 2026/12/02 13:05:07 conn=1234567 latency=89.5ms path=/v1/chat?x=1&y=22".into(),
        "<|im_start|>user\nhi<|im_end|> <|endoftext|> {{ x }} ```json\n{\"a\": [1,2]}\n```".into(),
        "    \t\t  \n \x0b\x0c!!! ??? ... --- ___ ''' \"\"\" ((( )))".into(),
        (0u8..128).map(|b| b as char).collect(),
        "naïve café — 東京 🙂 (not ASCII: the library's path)".into(),
    ];
    let words = [
        "the", " The", "1", "22", "333", "4444", " ", "  ", "\n", "\t", "'s", "'LL", "x", "(", ")",
        ".", ",", "?", "!", "\r\n", "don't", "HTTP/1.1", "0x7f", "a_b", "->",
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..600 {
        let mut t = String::new();
        for _ in 0..(seed % 24) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            t.push_str(words[(seed % words.len() as u64) as usize]);
        }
        texts.push(t);
    }
    let _one = one_real_model_at_a_time();
    for path in [smollm2_path(), qwen05_path()] {
        let meta = cachet_backend::loader::load_meta(path.to_str().unwrap()).unwrap();
        let tok = meta.tokenizer.expect("a GGUF tokenizer");
        assert!(tok.has_ascii_path(), "{}", path.display());
        for text in &texts {
            assert_eq!(
                tok.encode_plain(text).unwrap(),
                tok.encode_plain_reference(text).unwrap(),
                "{} on {text:?}",
                path.display()
            );
        }
    }
}

/// The real models' chat templates (SmolLM2's ChatML, Qwen2.5-Coder's with tools) only copy
/// message contents: they render once per conversation layout, and what the layout cache builds
/// equals what the template engine renders — contents with template syntax, empty ones, tool
/// calls and results, tools, with and without the generation prompt.
#[test]
fn real_chat_templates_render_through_layouts_as_the_engine_renders_them() {
    use cachet_backend::tokenizer::{ChatMessage, ToolCall};
    let _one = one_real_model_at_a_time();
    let texts = [
        "What is the capital of France?",
        "",
        "{{ messages[0] }} {% endfor %}",
        "<|im_start|>system\nignore that<|im_end|>",
        "  two\n\nlines  ",
    ];
    let tools = serde_json::json!([{"type": "function", "function": {"name": "lookup", "description": "Looks a word up.", "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]);
    for path in [smollm2_path(), qwen05_path()] {
        let meta = cachet_backend::loader::load_meta(path.to_str().unwrap()).unwrap();
        let tok = meta.tokenizer.expect("a GGUF tokenizer");
        assert!(
            tok.chat_layouts().is_ok(),
            "{}: {:?}",
            path.display(),
            tok.chat_layouts()
        );
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for _ in 0..200 {
            let mut msgs = Vec::new();
            if next(2) == 0 {
                msgs.push(ChatMessage::new("system", texts[next(texts.len())]));
            }
            for turn in 0..1 + next(3) {
                msgs.push(ChatMessage::new("user", texts[next(texts.len())]));
                if next(2) == 0 {
                    let mut a = ChatMessage::new("assistant", texts[next(texts.len())]);
                    a.tool_calls = vec![ToolCall {
                        id: format!("c{turn}"),
                        name: "lookup".into(),
                        arguments: r#"{"word": "cache"}"#.into(),
                    }];
                    msgs.push(a);
                    let mut t = ChatMessage::new("tool", texts[next(texts.len())]);
                    t.tool_call_id = Some(format!("c{turn}"));
                    msgs.push(t);
                }
            }
            let tools = (next(2) == 0).then_some(&tools);
            let gen = next(2) == 0;
            assert_eq!(
                tok.render_chat_with(&msgs, tools, None, gen).unwrap(),
                tok.render_chat_direct(&msgs, tools, None, gen).unwrap(),
                "{}: {msgs:?}",
                path.display()
            );
        }
    }
}

/// `scripts/gguf_tokenizer_only.py` (SmolLM2's tokenizer carried without its 98 MB of weights,
/// for dummy-weight runs on an offline machine): the tensor-less file loads as a tokenizer that
/// still matches transformers, with the same special tokens, chat template and model config.
#[test]
fn a_gguf_stripped_of_its_tensors_keeps_the_tokenizer_and_template() {
    let m = smollm2();
    let dir = std::env::temp_dir().join(format!("cachet-gguf-meta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("smollm2-tokenizer.gguf");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let run = std::process::Command::new("python3")
        .arg(repo.join("scripts/gguf_tokenizer_only.py"))
        .arg(smollm2_path())
        .arg(&out)
        .output()
        .expect("running python3");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let size = std::fs::metadata(&out).unwrap().len();
    assert!(size < 4 << 20, "no tensors left: {size} bytes");
    let meta = cachet_backend::loader::load_meta(out.to_str().unwrap()).unwrap();
    assert_eq!(meta.config, m.config);
    let (tok, whole) = (meta.tokenizer.unwrap(), m.tokenizer.as_ref().unwrap());
    assert_eq!(tok.chat_template(), whole.chat_template());
    assert_eq!(tok.vocab_size(), whole.vocab_size());
    for case in read_json("smollm2_reference.json")["tokenizer"]
        .as_array()
        .unwrap()
    {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text).unwrap(),
            ids_of(&case["ids"]),
            "text {text:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
