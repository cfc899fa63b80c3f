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
    use cachet_backend::tokenizer::{ChatMessage, ToolCall};
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
            .map(|m| {
                let mut msg =
                    ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap());
                msg.tool_call_id = m["tool_call_id"].as_str().map(str::to_owned);
                if let Some(calls) = m["tool_calls"].as_array() {
                    msg.tool_calls = calls
                        .iter()
                        .map(|c| ToolCall {
                            id: c["id"].as_str().unwrap().into(),
                            name: c["function"]["name"].as_str().unwrap().into(),
                            // As a client sends them: JSON text.
                            arguments: c["function"]["arguments"].to_string(),
                        })
                        .collect();
                }
                msg
            })
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
