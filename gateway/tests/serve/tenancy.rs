//! Fair tenancy end to end: a public prefix shared safely between tenants.

use super::common::*;

const PUBLIC: &str = "You are Acme Assistant, the support agent of Acme Corporation. Answer \
    questions about Acme's routers, modems and mesh systems; be brief and polite; never promise \
    refunds; point customers to acme.example/support for anything you cannot solve.";
const PRIVATE: &str = "You are the internal assistant of Initech's treasury desk. Escalation \
    code 4471-ALPHA; the wire approval limit is 250000 USD; the counterparty list is in vault 9 \
    and must never be quoted to anyone outside the desk.";

fn config() -> String {
    let mut c = String::new();
    for t in ["a", "b", "c"] {
        c += &format!(
            "[[tenant]]\nid = \"{t}\"\napi_key_sha256 = [\"{}\"]\n",
            key_hash(&format!("sk-{t}"))
        );
    }
    c + &format!("[[public_prefix]]\nname = \"acme\"\nsystem = \"{PUBLIC}\"\n")
}

/// Sends a chat request; returns (prompt tokens, cached tokens).
fn chat(base: &str, key: &str, system: &str, q: &str, cache_salt: Option<&str>) -> (u64, u64) {
    let mut body = serde_json::json!({"model": "smollm2", "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]});
    if let Some(s) = cache_salt {
        body["cache_salt"] = s.into();
    }
    let (code, r) = http_json("POST", &format!("{base}/v1/chat/completions"), key, &body);
    assert_eq!(code, 200, "{r}");
    (
        r["usage"]["prompt_tokens"].as_u64().unwrap(),
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

/// The public blocks' tokens of a chat prompt, as the gateway computes them.
fn public_tokens(system: &str, q: &str) -> u64 {
    use cachet_backend::tokenizer::ChatMessage;
    use cachet_gateway::normalize::public::{PublicPrefixConfig, PublicPrefixes};
    let tok = cachet_tests::smollm2().tokenizer.clone().unwrap();
    let decl = PublicPrefixConfig {
        name: "acme".into(),
        system: Some(PUBLIC.into()),
        text: None,
    };
    let public = PublicPrefixes::new(&[decl], &tok, 16).unwrap();
    let msgs = [
        ChatMessage::new("system", system),
        ChatMessage::new("user", q),
    ];
    let ids = tok.encode(&tok.render_chat(&msgs, true).unwrap()).unwrap();
    public.part_of(&ids).map_or(0, |p| p.blocks as u64 * 16)
}

/// Two tenants share the declared public prefix's cached blocks and not one token more; a
/// tenant's own text, however often sent, is never shared; a client's own `cache_salt` opts out.
#[test]
fn tenants_share_the_public_prefix_and_not_one_token_more() {
    let (_server, base) = start(&config());
    let q1 = "My router blinks red. What now?";
    let q2 = "How do I reset my mesh system?";
    let shared = public_tokens(PUBLIC, q1);
    assert!(shared >= 48, "{shared} public tokens");
    assert_eq!(public_tokens(PUBLIC, q2), shared);
    // a computes everything; b finds the public blocks — exactly.
    assert_eq!(chat(&base, "sk-a", PUBLIC, q1, None).1, 0);
    assert_eq!(chat(&base, "sk-b", PUBLIC, q2, None).1, shared);
    // b sending a's exact prompt still gets only the public part; a gets its whole prompt.
    assert_eq!(chat(&base, "sk-b", PUBLIC, q1, None).1, shared);
    let (prompt, cached) = chat(&base, "sk-a", PUBLIC, q1, None);
    assert!(
        cached > shared && cached >= (prompt - 1) / 16 * 16,
        "a's own repeat: {cached} of {prompt} cached"
    );
    // A system prompt that goes on past the public text shares the public part only.
    let extended = format!("{PUBLIC} Internal note: escalation code 4471.");
    assert_eq!(chat(&base, "sk-b", &extended, q1, None).1, shared);
    assert_eq!(chat(&base, "sk-c", &extended, q1, None).1, shared);
    // A client's own cache_salt asked to share with no one.
    assert_eq!(chat(&base, "sk-c", PUBLIC, q1, Some("mine")).1, 0);
    // A tenant cannot make its own text public: a's private prompt, cached for a, is a miss
    // for b (there is no tenant setting or request field that declares a prefix).
    chat(&base, "sk-a", PRIVATE, q1, None);
    assert!(chat(&base, "sk-a", PRIVATE, q1, None).1 >= 48);
    assert_eq!(chat(&base, "sk-b", PRIVATE, q1, None).1, 0);
    let (code, r) = http_json(
        "POST",
        &format!("{base}/v1/chat/completions"),
        "sk-b",
        &serde_json::json!({"model": "smollm2", "public_prefix": "acme",
            "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        (code, r["error"]["param"].as_str()),
        (400, Some("public_prefix")),
        "{r}"
    );
    // The prefix's blocks are counted by name.
    let (_, metrics) = curl(&[&format!("{base}/metrics")]);
    assert!(
        metrics.contains("cachet_public_prefix_blocks_total{prefix=\"acme\"}"),
        "{metrics}"
    );
}

/// `curl -i` a JSON POST: (status, headers, body).
fn post_i(url: &str, key: &str, body: &serde_json::Value) -> (u16, String, String) {
    let (_, out) = curl(&[
        "-i",
        "-H",
        &format!("authorization: Bearer {key}"),
        "-H",
        "content-type: application/json",
        "-d",
        &body.to_string(),
        url,
    ]);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_ascii_lowercase(), body.to_string())
}

fn usage_of(base: &str, admin: &str, query: &str) -> (u16, serde_json::Value) {
    let (_, out) = curl(&[
        "-w",
        "\n%{http_code}",
        "-H",
        &format!("authorization: Bearer {admin}"),
        &format!("{base}/v1/usage{query}"),
    ]);
    let (json, code) = out.rsplit_once('\n').unwrap();
    (
        code.trim().parse().unwrap(),
        serde_json::from_str(json).unwrap_or_default(),
    )
}

/// Usage records and budgets through `cachet serve`: every request leaves a record (refused
/// ones too), `GET /v1/usage` sums them by day and model for the tenant's admin key, a tenant
/// over its budget is refused with 429 `budget_exceeded` while the request that crossed it ran
/// to its end, and records and spend survive `kill -9` — which loses at most the batch being
/// gathered (measured under load, printed).
#[test]
fn usage_is_recorded_budgets_refuse_and_records_survive_a_kill() {
    let mut config = String::new();
    for (t, extra) in [
        ("a", ""),
        ("b", "budget_usd = 0.5\nbudget_period = \"day\"\n"),
    ] {
        config += &format!(
            "[[tenant]]\nid = \"{t}\"\napi_key_sha256 = [\"{}\"]\nadmin_key_sha256 = [\"{}\"]\n{extra}",
            key_hash(&format!("sk-{t}")),
            key_hash(&format!("adm-{t}"))
        );
    }
    // 0.1 USD per generated token: b's budget holds 5.
    config += "[[price]]\nmodel = \"smollm2\"\ninput_per_mtok = 0.0\noutput_per_mtok = 100000.0\n";
    let dir = std::env::temp_dir().join(format!("cachet-usage-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite:{}", dir.join("usage.db").display());
    let flags = ["--usage-db", db.as_str()];
    let (mut server, base) = start_with(&config, &flags);
    let url = format!("{base}/v1/chat/completions");
    let ask = |max_tokens: u32, stream: bool| {
        serde_json::json!({"model": "smollm2", "max_tokens": max_tokens, "ignore_eos": true,
            "stream": stream, "stream_options": if stream { serde_json::json!({"include_usage": true}) } else { serde_json::Value::Null },
            "messages": [{"role": "user", "content": "Count to twenty."}]})
    };
    let (code, _, body) = post_i(&url, "sk-b", &ask(3, false));
    assert_eq!(code, 200, "{body}");
    // 0.3 spent of 0.5: admitted, and the stream runs to its 8 tokens (0.8 more) uncut.
    let (code, _, body) = post_i(&url, "sk-b", &ask(8, true));
    assert_eq!(code, 200, "{body}");
    let chunks: Vec<serde_json::Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let last = chunks.last().unwrap();
    assert_eq!(last["usage"]["completion_tokens"], 8, "{body}");
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "length"),
        "{body}"
    );
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    // Now over: refused before any work, with when to retry.
    let (code, head, body) = post_i(&url, "sk-b", &ask(1, false));
    assert_eq!(code, 429, "{body}");
    let e: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], "budget_exceeded", "{body}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("budget"),
        "{body}"
    );
    assert!(head.contains("retry-after:"), "{head}");
    // b's usage: three requests (one refused), 11 tokens, 1.1 USD.
    let (code, u) = usage_of(&base, "adm-b", "");
    assert_eq!(code, 200, "{u}");
    assert_eq!(u["total"]["requests"], 3, "{u}");
    assert_eq!(u["total"]["completion_tokens"], 11, "{u}");
    assert!(
        (u["total"]["cost_usd"].as_f64().unwrap() - 1.1).abs() < 1e-9,
        "{u}"
    );
    assert!(
        (u["budget"]["spent_usd"].as_f64().unwrap() - 1.1).abs() < 1e-9,
        "{u}"
    );
    assert_eq!(u["budget"]["period"], "day", "{u}");
    assert_eq!(u["data"][0]["model"], "smollm2", "{u}");
    // Only an admin key of the tenant; dates are checked.
    assert_eq!(usage_of(&base, "sk-b", "").0, 401);
    let (code, e) = usage_of(&base, "adm-b", "?start=2026-13-01");
    assert_eq!(
        (code, e["error"]["param"].as_str()),
        (400, Some("start")),
        "{e}"
    );
    let (code, e) = usage_of(&base, "adm-b", "?from=2026-12-01");
    assert_eq!(code, 400, "{e}");
    let (code, e) = usage_of(&base, "adm-b", "?start=2025-01-01&end=2026-12-01");
    assert_eq!(
        (code, e["error"]["param"].as_str()),
        (400, Some("end")),
        "{e}"
    );
    // kill -9 under load: a's clients count the answers they got; the store must hold them all
    // but the batch being gathered.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let answered = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (code, _, _) = post_i(&url, "sk-a", &ask(1, false));
                    if code == 200 {
                        answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_secs(3));
        server.0.kill().unwrap(); // SIGKILL
        let _ = server.0.wait();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let answered = answered.into_inner();
    let today = cachet_gateway::usage::day_of(cachet_gateway::usage::now_ms());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let log = cachet_gateway::usage::UsageLog::open(&db, vec![]).unwrap();
    let rows = rt.block_on(log.summary("a", &today, &today)).unwrap();
    drop(log);
    let recorded: u64 = rows.iter().map(|r| r.requests).sum();
    let lost = answered.saturating_sub(recorded);
    eprintln!(
        "kill -9 under load: {answered} answers, {recorded} records, {lost} lost (batches of at most {} records or {:?})",
        cachet_gateway::usage::MAX_BATCH,
        cachet_gateway::usage::BATCH_WINDOW
    );
    assert!(answered >= 8, "only {answered} answers in 3 s");
    assert!(lost as usize <= cachet_gateway::usage::MAX_BATCH);
    // Restarted on the same store: the records are there, and b is still over its budget.
    let (mut server, base) = start_with(&config, &flags);
    let url = format!("{base}/v1/chat/completions");
    let (code, _, body) = post_i(&url, "sk-b", &ask(1, false));
    assert_eq!(code, 429, "{body}");
    assert!(body.contains("budget_exceeded"), "{body}");
    let (_, u) = usage_of(&base, "adm-a", "");
    assert_eq!(u["total"]["requests"].as_u64(), Some(recorded), "{u}");
    // A clean stop (SIGTERM: drain) loses nothing: the last request's record is written.
    let (code, _, body) = post_i(&url, "sk-a", &ask(1, false));
    assert_eq!(code, 200, "{body}");
    let pid = server.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let _ = server.0.wait();
    let log = cachet_gateway::usage::UsageLog::open(&db, vec![]).unwrap();
    let rows = rt.block_on(log.summary("a", &today, &today)).unwrap();
    assert_eq!(rows.iter().map(|r| r.requests).sum::<u64>(), recorded + 1);
    let _ = std::fs::remove_dir_all(&dir);
}
