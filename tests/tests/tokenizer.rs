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
