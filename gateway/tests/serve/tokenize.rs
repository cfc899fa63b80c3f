//! `POST /tokenize` and `/detokenize` against a real `cachet serve` (SmolLM2 on the CPU): a
//! prompt's and a chat's token count is the `prompt_tokens` the same request is charged on
//! `/v1/completions` and `/v1/chat/completions`; the token texts, the generation prompt, the
//! model's length and the round trip through `/detokenize`; every refusal names its field.

use cachet_tests::curl_status;

use super::common::*;

fn config() -> String {
    format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-test-acme")
    )
}

fn post(base: &str, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    post_json(base, path, "sk-test-acme", &body)
}

#[test]
fn tokenize_counts_what_a_request_is_charged_and_detokenize_inverts_it() {
    let (_server, base) = start_with(&config(), &["--max-model-len", "2048"]);
    // A prompt: the count the completion is charged.
    let prompt = "The capital of France is";
    let (code, t) = post(
        &base,
        "/tokenize",
        serde_json::json!({"model": "smollm2",
        "prompt": prompt, "return_token_strs": true}),
    );
    assert_eq!(code, 200, "{t}");
    assert_eq!(t["max_model_len"], 2048, "{t}");
    let tokens: Vec<u64> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(t["count"], tokens.len());
    assert_eq!(t["token_strs"].as_array().unwrap().len(), tokens.len());
    let (code, c) = post(
        &base,
        "/v1/completions",
        serde_json::json!({"model": "smollm2",
        "prompt": prompt, "max_tokens": 1}),
    );
    assert_eq!(code, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], tokens.len(), "{c} {t}");
    // Its tokens decode to the prompt.
    let (code, d) = post(&base, "/detokenize", serde_json::json!({"tokens": tokens}));
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["prompt"], prompt);
    // A chat: the count the chat completion is charged; without the generation prompt fewer
    // tokens, the same before them.
    let messages = serde_json::json!([{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"}]);
    let (code, t) = post(
        &base,
        "/tokenize",
        serde_json::json!({"messages": messages,
        "return_token_strs": true}),
    );
    assert_eq!(code, 200, "{t}");
    assert!(
        t["token_strs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "<|im_start|>"),
        "{t}"
    );
    let (code, c) = post(
        &base,
        "/v1/chat/completions",
        serde_json::json!({"model": "smollm2",
        "messages": messages, "max_tokens": 1}),
    );
    assert_eq!(code, 200, "{c}");
    assert_eq!(c["usage"]["prompt_tokens"], t["count"], "{c} {t}");
    let (code, bare) = post(
        &base,
        "/tokenize",
        serde_json::json!({"messages": messages,
        "add_generation_prompt": false}),
    );
    assert_eq!(code, 200, "{bare}");
    let (with, without) = (
        t["tokens"].as_array().unwrap(),
        bare["tokens"].as_array().unwrap(),
    );
    assert!(without.len() < with.len(), "{bare} {t}");
    assert_eq!(&with[..without.len()], &without[..]);
    // Refusals name what to fix.
    for (path, body, field) in [
        (
            "/tokenize",
            serde_json::json!({"prompt": "x", "temperature": 1}),
            "temperature",
        ),
        (
            "/tokenize",
            serde_json::json!({"messages": messages, "max_tokens": 3}),
            "max_tokens",
        ),
        (
            "/tokenize",
            serde_json::json!({"messages": messages, "continue_final_message": true}),
            "continue_final_message",
        ),
        (
            "/tokenize",
            serde_json::json!({"messages": messages, "add_special_tokens": true}),
            "add_special_tokens",
        ),
        (
            "/tokenize",
            serde_json::json!({"prompt": "x", "add_generation_prompt": true}),
            "add_generation_prompt",
        ),
        ("/tokenize", serde_json::json!({"prompt": 3}), "prompt"),
        (
            "/detokenize",
            serde_json::json!({"tokens": [49152]}),
            "tokens",
        ),
        (
            "/detokenize",
            serde_json::json!({"tokens": ["a"]}),
            "tokens",
        ),
    ] {
        let (code, e) = post(&base, path, body.clone());
        assert_eq!(code, 400, "{body}: {e}");
        assert_eq!(e["error"]["param"], field, "{body}: {e}");
    }
    // The model card says the same length.
    let (code, models) = curl_status(&[
        "-H",
        "Authorization: Bearer sk-test-acme",
        &format!("{base}/v1/models"),
    ]);
    assert_eq!(code, 200, "{models}");
    let models: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 2048, "{models}");
    let (code, e) = post(
        &base,
        "/tokenize",
        serde_json::json!({"model": "gpt-4", "prompt": "x"}),
    );
    assert_eq!(code, 404, "{e}");
    let (code, _) = curl_status(&["-d", "{\"prompt\": \"x\"}", &format!("{base}/tokenize")]);
    assert_eq!(code, 401);
}
