//! Request ids: every response carries `x-request-id` — the client's where it is a usable one,
//! else a fresh random `req_…` — errors included; completion ids are random, not a counter.

use std::process::Command;

use super::common::*;

/// (status line, x-request-id, body) of a chat request with `headers`.
fn chat(base: &str, key: &str, headers: &[&str]) -> (String, String, serde_json::Value) {
    let mut c = Command::new("curl");
    c.args([
        "-si",
        "--max-time",
        "60",
        "-H",
        &format!("Authorization: Bearer {key}"),
    ])
    .args(["-H", "Content-Type: application/json"]);
    for h in headers {
        c.args(["-H", h]);
    }
    let body =
        r#"{"model": "smollm2", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}"#;
    let out = c
        .args(["-d", body, &format!("{base}/v1/chat/completions")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap_or_else(|| panic!("no x-request-id in\n{head}"))
        .to_string();
    let status = head.lines().next().unwrap().to_string();
    (status, id, serde_json::from_str(body).unwrap())
}

fn random_hex(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix)
        .is_some_and(|h| h.len() == 24 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[test]
fn every_response_carries_its_request_id_and_ids_are_random() {
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-ids")
    );
    let (_server, base) = start(&config);
    // The client's own id comes back.
    let (status, id, body) = chat(&base, "sk-ids", &["x-request-id: client-7_a.b:c"]);
    assert!(status.contains("200"), "{status}");
    assert_eq!(id, "client-7_a.b:c");
    let first = body["id"].as_str().unwrap().to_string();
    assert!(random_hex(&first, "chatcmpl-"), "{first}");
    // Without one, or with one that is no id, a random one is made.
    let (_, made, body) = chat(&base, "sk-ids", &[]);
    assert!(random_hex(&made, "req_"), "{made}");
    let second = body["id"].as_str().unwrap().to_string();
    assert!(random_hex(&second, "chatcmpl-") && second != first);
    let long = format!("x-request-id: {}", "a".repeat(200));
    for bad in ["x-request-id: two words", long.as_str()] {
        let (_, id, _) = chat(&base, "sk-ids", &[bad]);
        assert!(random_hex(&id, "req_") && id != made, "{bad}: {id}");
    }
    // A refused request carries one too.
    let (status, id, _) = chat(&base, "sk-wrong", &["x-request-id: bad-key-1"]);
    assert!(status.contains("401"), "{status}");
    assert_eq!(id, "bad-key-1");
}
