//! Request ids and headers: every response carries `x-request-id` — the client's where it is a
//! usable one, else a fresh random `req_…` — errors included; completion ids are random, not a
//! counter; a limited tenant's responses carry OpenAI's `x-ratelimit-*`; every request is one
//! access line in the log.

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

/// (status, headers lowercased, body) of a chat of `content` with `id` as its x-request-id.
fn chat_headers(
    base: &str,
    key: &str,
    id: &str,
    content: &str,
) -> (
    u16,
    std::collections::HashMap<String, String>,
    serde_json::Value,
) {
    let body = serde_json::json!({"model": "smollm2", "max_tokens": 3,
        "messages": [{"role": "user", "content": content}]});
    let out = Command::new("curl")
        .args(["-si", "--max-time", "60"])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .args(["-H", "Content-Type: application/json"])
        .args(["-H", &format!("x-request-id: {id}")])
        .args([
            "-d",
            &body.to_string(),
            &format!("{base}/v1/chat/completions"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    (status, headers, serde_json::from_str(body).unwrap())
}

/// Seconds of a Go duration as OpenAI writes resets (`20ms`, `19.98s`, `1m0s`).
fn go_secs(s: &str) -> f64 {
    if let Some(ms) = s.strip_suffix("ms") {
        return ms.parse::<f64>().unwrap() / 1000.0;
    }
    let s = s.strip_suffix('s').unwrap();
    match s.split_once('m') {
        Some((m, sec)) => m.parse::<f64>().unwrap() * 60.0 + sec.parse::<f64>().unwrap(),
        None => s.parse().unwrap(),
    }
}

#[test]
fn rate_limit_headers_follow_the_buckets_and_every_request_is_logged() {
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\nrequests_per_minute = 3\n\
         tokens_per_minute = 5000\n\n[[tenant]]\nid = \"open\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-limited"),
        key_hash("sk-open")
    );
    let log = std::env::temp_dir().join(format!("cachet-access-{}.log", std::process::id()));
    let (server, base) = start_under(&config, &["--log-format", "json"], None, Some(&log));
    let h = |m: &std::collections::HashMap<String, String>, k: &str| -> String {
        m.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("no {k} in {m:?}"))
    };
    // The first request: one of 3 requests taken (full again in 20 s), and of 5,000 tokens
    // exactly its prompt (its output is charged once it is known).
    let (status, first, body) = chat_headers(&base, "sk-limited", "rl-1", "Hello there");
    assert_eq!(status, 200, "{body}");
    let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(h(&first, "x-ratelimit-limit-requests"), "3");
    assert_eq!(h(&first, "x-ratelimit-remaining-requests"), "2");
    let reset = go_secs(&h(&first, "x-ratelimit-reset-requests"));
    assert!((19.0..=20.0).contains(&reset), "{reset}");
    assert_eq!(h(&first, "x-ratelimit-limit-tokens"), "5000");
    assert_eq!(
        h(&first, "x-ratelimit-remaining-tokens"),
        (5000 - prompt).to_string()
    );
    let reset = go_secs(&h(&first, "x-ratelimit-reset-tokens"));
    let want = prompt as f64 * 60.0 / 5000.0;
    assert!((reset - want).abs() < 0.1, "{reset} vs {want}");
    // The second: the first's output charged too, less what refilled since (83 a second).
    let spent = prompt + body["usage"]["completion_tokens"].as_u64().unwrap();
    let (_, second, body) = chat_headers(&base, "sk-limited", "rl-2", "Hello again");
    let prompt2 = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(h(&second, "x-ratelimit-remaining-requests"), "1");
    let left: u64 = h(&second, "x-ratelimit-remaining-tokens").parse().unwrap();
    assert!(
        left >= 5000 - spent - prompt2 && left < 5000 - prompt2,
        "{left} tokens left after {spent} + {prompt2}"
    );
    let (status, _, _) = chat_headers(&base, "sk-limited", "rl-3", "Hi");
    assert_eq!(status, 200);
    // The fourth is refused: none left, and the headers say when the bucket is whole again.
    let (status, refused, body) = chat_headers(&base, "sk-limited", "rl-4", "Hi");
    assert_eq!(status, 429, "{body}");
    assert_eq!(h(&refused, "x-ratelimit-remaining-requests"), "0");
    assert!(go_secs(&h(&refused, "x-ratelimit-reset-requests")) > 40.0);
    assert!(refused.contains_key("retry-after"));
    // A tenant without limits gets no such headers; a bad key is refused before any tenant.
    let (status, open, _) = chat_headers(&base, "sk-open", "open-1", "Hi");
    assert_eq!(status, 200);
    assert!(
        !open.keys().any(|k| k.starts_with("x-ratelimit")),
        "{open:?}"
    );
    let (status, _, _) = chat_headers(&base, "sk-nobody", "bad-1", "Hi");
    assert_eq!(status, 401);
    // One access line per request, as JSON, once the response was sent.
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "cachet::access")
        .map(|v| v["fields"].clone())
        .collect();
    let by_id = |id: &str| {
        let found: Vec<_> = lines.iter().filter(|f| f["request_id"] == id).collect();
        assert_eq!(found.len(), 1, "{id}: {found:?} in\n{text}");
        found[0].clone()
    };
    for (id, status, tenant, model) in [
        ("rl-1", 200, "acme", "smollm2"),
        ("rl-3", 200, "acme", "smollm2"),
        ("rl-4", 429, "acme", "smollm2"),
        ("open-1", 200, "open", "smollm2"),
        ("bad-1", 401, "-", "-"),
    ] {
        let f = by_id(id);
        assert_eq!(f["message"], "request");
        assert_eq!(f["method"], "POST");
        assert_eq!(f["path"], "/v1/chat/completions");
        assert_eq!(f["status"], status, "{f}");
        assert_eq!(f["tenant"], tenant, "{f}");
        assert_eq!(f["model"], model, "{f}");
        assert_eq!(f["client"], "127.0.0.1");
        assert_eq!(f["complete"], true, "{f}");
        assert!(f["bytes"].as_u64().unwrap() > 20, "{f}");
        assert!(f["ms"].as_f64().unwrap() > 0.0, "{f}");
    }
}
