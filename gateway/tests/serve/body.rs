//! `--max-body-kib`: the API's request bodies over the cap are refused with 413 before they are
//! parsed; smaller ones are served.

use super::common::*;

#[test]
fn request_bodies_over_the_cap_are_413() {
    let config = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-body")
    );
    let (_server, base) = start_with(&config, &["--max-body-kib", "4"]);
    let chat = |words: usize| {
        post_json(
            &base,
            "/v1/chat/completions",
            "sk-body",
            &serde_json::json!({"model": "smollm2", "max_tokens": 1,
                "messages": [{"role": "user", "content": "word ".repeat(words)}]}),
        )
    };
    let (code, v) = chat(10);
    assert_eq!(code, 200, "{v}");
    // About 8 KiB of JSON.
    let (code, v) = chat(1600);
    assert_eq!(code, 413, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than 4096 bytes"),
        "{v}"
    );
    let (code, _) = post_json(
        &base,
        "/tokenize",
        "sk-body",
        &serde_json::json!({"model": "smollm2", "prompt": "word ".repeat(1600)}),
    );
    assert_eq!(code, 413);
}
