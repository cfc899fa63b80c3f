//! Tenants' templates through `cachet serve`: upload, activate, render, use.

use std::time::{Duration, Instant};

use super::common::*;

/// A template that never returns (it spins until its deadline or fuel ends it).
fn spinning_template() -> Vec<u8> {
    wat::parse_str(
        r#"(module (memory (export "memory") 1)
            (func (export "cachet_abi_version") (result i32) i32.const 1)
            (func (export "cachet_alloc") (param i32) (result i32) i32.const 1024)
            (func (export "cachet_render") (param i32 i32) (result i64) (loop br 0) i64.const 0))"#,
    )
    .unwrap()
}

#[test]
fn tenants_upload_activate_and_use_their_templates_through_cachet_serve() {
    let support = cachet_tests::build_template("support-bot");
    let clock = cachet_tests::build_template("clock-user");
    let dir = std::env::temp_dir().join(format!(
        "cachet-templates-{}-{}",
        std::process::id(),
        free_port()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let looping = dir.with_extension("loop.wasm");
    std::fs::write(&looping, spinning_template()).unwrap();
    let not_wasm = dir.with_extension("txt");
    std::fs::write(&not_wasm, "definitely not wasm").unwrap();
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\nadmin_key_sha256 = [\"{}\"]\n\n\
         [[tenant]]\nid = \"other\"\napi_key_sha256 = [\"{}\"]\nadmin_key_sha256 = [\"{}\"]\n",
        key_hash("sk-acme"),
        key_hash("adm-acme"),
        key_hash("sk-other"),
        key_hash("adm-other")
    );
    let dir_s = dir.to_str().unwrap().to_string();
    // A one-second budget: the default 50 ms is a production figure, and the first calls of a
    // freshly uploaded template overran it on a 2-core machine busy compiling. Fuel enough for
    // ~10 s of spinning, so that the looping template below is ended by the deadline (well
    // inside its 5 s bound), not by its fuel.
    let flags = [
        "--templates-dir",
        &dir_s,
        "--template-deadline-ms",
        "1000",
        "--template-fuel",
        "20000000000",
    ];
    let (server, base) = start_with(&config, &flags);
    let t = format!("{base}/v1/templates");
    // Upload: version 1, active at once.
    let (code, v) = http("PUT", &format!("{t}/support"), "adm-acme", Some(&support));
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["version"]["version"], 1);
    assert_eq!(v["active"], true);
    // Only admin keys manage templates, each its own tenant's.
    let (code, v) = http("GET", &t, "sk-acme", None);
    assert_eq!(code, 401, "{v}");
    let (code, v) = http("GET", &t, "adm-other", None);
    assert_eq!((code, v["data"].as_array().unwrap().len()), (200, 0), "{v}");
    let (code, v) = http("GET", &t, "adm-acme", None);
    assert_eq!(code, 200);
    assert_eq!(v["data"][0]["name"], "support");
    assert_eq!(v["data"][0]["active"], 1);
    // A bad upload is refused with what to fix, and nothing is stored.
    let (code, v) = http("PUT", &format!("{t}/broken"), "adm-acme", Some(&not_wasm));
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("template_not_wasm")),
        "{v}"
    );
    let (code, v) = http(
        "PUT",
        &format!("{t}/Bad%20Name"),
        "adm-acme",
        Some(&support),
    );
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (400, Some("template_bad_name")),
        "{v}"
    );
    // Dry run: the prompt the model will see.
    let (code, dry) = http_json(
        "POST",
        &format!("{t}/support/render"),
        "adm-acme",
        &chat("Is my router broken?", "support"),
    );
    assert_eq!(code, 200, "{dry}");
    let prompt = dry["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("You are Ada") && prompt.contains("Is my router broken?"),
        "{prompt}"
    );
    // A chat request through the template: its prompt is the dry run's, and a second question
    // finds the template's static prefix (persona + few-shot) in the cache.
    let url = format!("{base}/v1/chat/completions");
    let (code, r) = http_json(
        "POST",
        &url,
        "sk-acme",
        &chat("Is my router broken?", "support"),
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], dry["prompt_tokens"], "{r}");
    let (code, r2) = http_json(
        "POST",
        &url,
        "sk-acme",
        &chat("How do I update the firmware?", "support"),
    );
    assert_eq!(code, 200, "{r2}");
    let cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 96, "only {cached} cached tokens: {r2}");
    // Another tenant cannot use acme's template.
    let (code, r) = http_json("POST", &url, "sk-other", &chat("hi", "support"));
    assert_eq!(
        (code, r["error"]["code"].as_str()),
        (404, Some("template_not_found")),
        "{r}"
    );
    version_two_relocates_volatile_values(&base, &t, &clock);
    a_hostile_template_fails_only_its_own_request(&base, &t, &looping);
    // Templates survive a restart.
    drop(server);
    let (_server, base) = start_with(&config, &flags);
    let (code, v) = http("GET", &format!("{base}/v1/templates"), "adm-acme", None);
    assert_eq!(code, 200);
    let names: Vec<_> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["active"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("loop".to_string(), Some(1)),
            ("support".to_string(), Some(2))
        ],
        "{v}"
    );
    let (code, _) = http_json(
        "POST",
        &format!("{base}/v1/chat/completions"),
        "sk-acme",
        &chat("After the restart?", "support"),
    );
    assert_eq!(code, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A chat request of one user question through `template`.
fn chat(q: &str, template: &str) -> serde_json::Value {
    serde_json::json!({"model": "smollm2", "messages": [{"role": "user", "content": q}],
        "template": template, "max_tokens": 4, "temperature": 0, "user": "user-7"})
}

/// Version 2 (the clock template), activated atomically: the clock and the user id move out of
/// the system prompt, so another user at another time hits the cached system prompt; the active
/// version cannot be deleted, the old one can.
fn version_two_relocates_volatile_values(base: &str, t: &str, clock: &std::path::Path) {
    let url = format!("{base}/v1/chat/completions");
    let (code, v) = http("PUT", &format!("{t}/support"), "adm-acme", Some(clock));
    assert_eq!(
        (
            code,
            v["version"]["version"].as_u64(),
            v["active"].as_bool()
        ),
        (201, Some(2), Some(false)),
        "{v}"
    );
    let (code, _) = http_json(
        "POST",
        &format!("{t}/support/activate"),
        "adm-acme",
        &serde_json::json!({"version": 2}),
    );
    assert_eq!(code, 200);
    let (_, dry) = http_json(
        "POST",
        &format!("{t}/support/render"),
        "adm-acme",
        &chat("Balance?", "support"),
    );
    // The clock and the user id moved out of the system prompt (normalization), and the model
    // still sees them, right before the question.
    let prompt = dry["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("<|im_start|>system\nYou are the assistant of Contoso Bank.")
            && prompt.contains("User id: user-7\n\nBalance?"),
        "{dry}"
    );
    assert_eq!(dry["relocated"].as_array().unwrap().len(), 2, "{dry}");
    // So another user, at another time, hits the cached system prompt.
    let (code, _) = http_json("POST", &url, "sk-acme", &chat("Balance?", "support"));
    assert_eq!(code, 200);
    let mut other_user = chat("Card limit?", "support");
    other_user["user"] = "user-8".into();
    let (code, r) = http_json("POST", &url, "sk-acme", &other_user);
    assert_eq!(code, 200, "{r}");
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 32, "only {cached} cached tokens: {r}");
    let (code, v) = http(
        "DELETE",
        &format!("{t}/support/versions/2"),
        "adm-acme",
        None,
    );
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (409, Some("template_version_active")),
        "{v}"
    );
    let (code, _) = http(
        "DELETE",
        &format!("{t}/support/versions/1"),
        "adm-acme",
        None,
    );
    assert_eq!(code, 200);
}

/// A hostile template fails only its own request, with a clear status, and is counted.
fn a_hostile_template_fails_only_its_own_request(base: &str, t: &str, looping: &std::path::Path) {
    let url = format!("{base}/v1/chat/completions");
    let (code, _) = http("PUT", &format!("{t}/loop"), "adm-acme", Some(looping));
    assert_eq!(code, 201);
    let t0 = Instant::now();
    let (code, r) = http_json("POST", &url, "sk-acme", &chat("hi", "loop"));
    assert_eq!(
        (code, r["error"]["code"].as_str()),
        (422, Some("template_timeout")),
        "{r}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    let (code, r) = http_json("POST", &url, "sk-acme", &chat("hi", "nope"));
    assert_eq!(
        (code, r["error"]["code"].as_str()),
        (404, Some("template_not_found")),
        "{r}"
    );
    let (code, _) = http_json("POST", &url, "sk-acme", &chat("Still there?", "support"));
    assert_eq!(code, 200);
    let (ok, metrics) = curl(&[&format!("{base}/metrics")]);
    assert!(
        ok && metrics
            .contains(r#"cachet_template_calls_total{tenant="acme",outcome="template_timeout"} 1"#),
        "{metrics}"
    );
}

/// A tenant's template runs count in its concurrency and come after its rate limit: a template
/// that runs to its deadline (a second), asked for by 12 clients at once with `max_concurrent = 2`, runs only
/// for requests that were admitted (the rest get 429 without running it), and with
/// `requests_per_minute = 2` the third request is refused before its template runs.
#[test]
fn template_runs_are_admitted_by_the_tenants_limits_first() {
    let dir = std::env::temp_dir().join(format!(
        "cachet-tpl-limits-{}-{}",
        std::process::id(),
        free_port()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let looping = dir.join("loop.wasm");
    std::fs::write(&looping, spinning_template()).unwrap();
    let config = format!(
        "[[tenant]]\nid = \"busy\"\napi_key_sha256 = [\"{}\"]\nadmin_key_sha256 = [\"{}\"]\nmax_concurrent = 2\n\n\
         [[tenant]]\nid = \"slow\"\napi_key_sha256 = [\"{}\"]\nadmin_key_sha256 = [\"{}\"]\nrequests_per_minute = 2\n",
        key_hash("sk-busy"),
        key_hash("adm-busy"),
        key_hash("sk-slow"),
        key_hash("adm-slow")
    );
    let store = dir.join("store");
    // Each run of the template takes its whole deadline, a second, so the twelve overlap.
    let (_server, base) = start_with(
        &config,
        &[
            "--templates-dir",
            store.to_str().unwrap(),
            "--template-deadline-ms",
            "1000",
            "--template-fuel",
            "100000000000",
        ],
    );
    for admin in ["adm-busy", "adm-slow"] {
        let (code, v) = http(
            "PUT",
            &format!("{base}/v1/templates/spin"),
            admin,
            Some(&looping),
        );
        assert_eq!(code, 201, "{v}");
    }
    let body = serde_json::json!({"model": "smollm2", "template": "spin", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]});
    let url = format!("{base}/v1/chat/completions");
    let codes: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12)
            .map(|_| s.spawn(|| http_json("POST", &url, "sk-busy", &body).0))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ran = codes.iter().filter(|&&c| c == 422).count();
    let refused = codes.iter().filter(|&&c| c == 429).count();
    assert_eq!(ran + refused, 12, "{codes:?}");
    assert!(
        refused >= 8,
        "12 at once with max_concurrent = 2: {codes:?}"
    );
    let calls = |tenant: &str| -> u64 {
        let (_, m) = cachet_tests::curl_status(&[&format!("{base}/metrics")]);
        m.lines()
            .filter(|l| {
                l.starts_with("cachet_template_calls_total{")
                    && l.contains(&format!("tenant=\"{tenant}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    assert_eq!(
        calls("busy"),
        ran as u64,
        "templates ran for refused requests"
    );
    let codes: Vec<u16> = (0..4)
        .map(|_| http_json("POST", &url, "sk-slow", &body).0)
        .collect();
    assert_eq!(codes[2..], [429, 429], "{codes:?}");
    assert_eq!(calls("slow"), 2, "{codes:?}");
    // The templates API's dry run is a run too: refused the same way, before it runs.
    let (code, v) = http_json(
        "POST",
        &format!("{base}/v1/templates/spin/render"),
        "adm-slow",
        &body,
    );
    assert_eq!(code, 429, "{v}");
    assert_eq!(calls("slow"), 2);
}
