//! `cachet serve` in front of two `cachet worker`s: prefix routing sends a repeated prefix to
//! the worker that holds it (exact, from its KV events), round robin does not; a worker that
//! dies is routed around.

use std::process::{Command, Stdio};

use cachet_tests::{free_port, Proc};
use std::time::{Duration, Instant};

/// A config file's `[[tenant]]` entry.
fn tenant(id: &str, key: &str) -> String {
    format!(
        "[[tenant]]\nid = \"{id}\"\napi_key_sha256 = [\"{}\"]\n",
        cachet_gateway::tenants::hex(&cachet_gateway::tenants::hash_key(key))
    )
}

/// A tenants config in `dir` with the one tenant these tests use (key `sk-route`).
fn route_tenant(dir: &std::path::Path) -> std::path::PathBuf {
    let cfg = dir.join("tenants.toml");
    std::fs::write(&cfg, tenant("r", "sk-route")).unwrap();
    cfg
}

/// `cachet ARGS` on SmolLM2: a gateway given `--worker`s runs no engine of its own.
fn cachet(args: &[&str]) -> Proc {
    let model = if args[0] == "serve" && args.contains(&"--worker") {
        cachet_tests::SMOLLM2_GATEWAY
    } else {
        cachet_tests::SMOLLM2_CPU
    };
    Proc(
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .env("CACHET_USAGE_DB", "off")
            .args(args)
            .args(model)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn chat(base: &str, system: &str, question: &str) -> (u16, serde_json::Value) {
    chat_n(base, system, question, 2)
}

fn chat_n(base: &str, system: &str, question: &str, max_tokens: u32) -> (u16, serde_json::Value) {
    chat_as(base, "sk-route", system, question, max_tokens)
}

fn chat_as(
    base: &str,
    key: &str,
    system: &str,
    question: &str,
    max_tokens: u32,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({"model": "smollm2", "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]});
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "60", "-o", "-", "-w", "\n%{http_code}"])
        .args([
            "-H",
            &format!("authorization: Bearer {key}"),
            "-d",
            &body.to_string(),
        ])
        .arg(format!("{base}/v1/chat/completions"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

fn wait_for(url: &str) {
    let t0 = Instant::now();
    while cachet_tests::curl_status(&[url]).0 != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{url} did not come up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until every gateway in `bases` is up and answers a chat (its pool sees its members).
fn ready(bases: &[&str]) {
    for b in bases {
        wait_for(&format!("{b}/health"));
    }
    let t0 = Instant::now();
    while bases.iter().any(|b| chat(b, "warm-up", "hi").0 != 200) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no gateway answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A ~60-token system prompt about `topic` (more than three 16-token blocks).
fn system(topic: &str) -> String {
    format!("You are the {topic} assistant of Northwind Routers. Answer in at most three sentences, politely, and only about Northwind products. If you do not know, say so and offer to open a ticket for the customer.")
}

/// A scratch directory for one test's files.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cachet-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Three questions under one system prompt through `base`: after the first, each must find the
/// prompt cached wherever the first went (waiting for the gateway to learn of its blocks).
fn assert_prefix_reused(base: &str, sys: &str) {
    let (code, first) = chat(base, sys, "Where is my invoice?");
    assert_eq!(code, 200, "{first}");
    for q in ["Can I pay by card?", "Why was I charged twice?"] {
        wait_for_blocks(base, first["usage"]["prompt_tokens"].as_u64().unwrap() / 16);
        let (code, r) = chat(base, sys, q);
        assert_eq!(code, 200, "{r}");
        assert!(cached(&r) >= 32, "prefix routing missed the cache: {r}");
    }
}

fn cached(r: &serde_json::Value) -> u64 {
    r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// Waits until the gateway knows (from the workers' KV events) of at least `n` blocks on one
/// worker.
fn wait_for_blocks(base: &str, n: u64) {
    let t0 = Instant::now();
    loop {
        let (_, m) = cachet_tests::curl_status(&[&format!("{base}/metrics")]);
        let most = m
            .lines()
            .filter(|l| l.starts_with("cachet_worker_cached_blocks{"))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<u64>().ok()))
            .max()
            .unwrap_or(0);
        if most >= n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the gateway saw only {most} of {n} blocks"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Requests each worker got, from the gateway's metrics.
fn routed(base: &str) -> std::collections::BTreeMap<String, u64> {
    let (_, m) = cachet_tests::curl_status(&[&format!("{base}/metrics")]);
    m.lines()
        .filter(|l| l.starts_with("cachet_routed_requests_total{"))
        .map(|l| {
            let (k, n) = l.rsplit_once(' ').unwrap();
            (k.to_string(), n.parse().unwrap())
        })
        .collect()
}

/// Requests each worker got between two `routed` readings.
fn moved(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> Vec<u64> {
    after
        .iter()
        .map(|(k, n)| n - before.get(k).copied().unwrap_or(0))
        .collect()
}

#[test]
fn prefix_routing_finds_the_worker_that_holds_the_prefix_and_survives_a_dead_worker() {
    cachet_tests::smollm2_path();
    let dir = scratch("routing");
    let key = dir.join("hash.key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    let key = key.to_str().unwrap().to_string();
    // Tenant r, and tenant p, who shares only the operator's public prefix (the billing prompt)
    // with r.
    let cfg = route_tenant(&dir);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text += &tenant("p", "sk-public");
    text += &format!(
        "[[public_prefix]]\nname = \"billing\"\nsystem = \"{}\"\n",
        system("billing")
    );
    std::fs::write(&cfg, text).unwrap();
    let cfg = cfg.to_str().unwrap().to_string();
    let (p1, p2, pp, pr) = (free_port(), free_port(), free_port(), free_port());
    let w1 = cachet(&[
        "worker",
        "--listen",
        &format!("127.0.0.1:{p1}"),
        "--hash-key-file",
        &key,
    ]);
    let _w2 = cachet(&[
        "worker",
        "--listen",
        &format!("127.0.0.1:{p2}"),
        "--hash-key-file",
        &key,
    ]);
    let (u1, u2) = (
        format!("http://127.0.0.1:{p1}"),
        format!("http://127.0.0.1:{p2}"),
    );
    wait_for(&format!("{u1}/health"));
    wait_for(&format!("{u2}/health"));
    let gateway = |port: u16, routing: &str| {
        cachet(&[
            "serve",
            "--config",
            &cfg,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--hash-key-file",
            &key,
            "--worker",
            &u1,
            "--worker",
            &u2,
            "--routing",
            routing,
        ])
    };
    let _prefix = gateway(pp, "prefix");
    let _rr = gateway(pr, "round_robin");
    let (bp, br) = (
        format!("http://127.0.0.1:{pp}"),
        format!("http://127.0.0.1:{pr}"),
    );
    ready(&[&bp, &br]);
    // Give the pools a moment to see both workers.
    std::thread::sleep(Duration::from_millis(600));
    // Prefix routing: three questions under one system prompt; after the first, each finds it
    // cached, on whichever worker took the first.
    let sys = system("billing");
    let before = routed(&bp);
    assert_prefix_reused(&bp, &sys);
    let after = routed(&bp);
    assert!(
        moved(&before, &after).contains(&3),
        "all three went to one worker: {before:?} → {after:?}"
    );
    // Another tenant's request under the public prefix is routed to the worker that holds its
    // public blocks (the gateway and the workers hash them alike) and finds exactly those.
    let (code, r) = chat_as(&bp, "sk-public", &sys, "Where is my invoice?", 2);
    assert_eq!(code, 200, "{r}");
    let prompt = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached(&r) >= 48 && cached(&r) < prompt / 16 * 16,
        "the public part only: {r}"
    );
    let now = routed(&bp);
    assert!(
        moved(&before, &now).contains(&4),
        "the fourth went elsewhere: {before:?} → {now:?}"
    );
    // Round robin: the same pattern under a fresh prompt alternates workers, so the second
    // request lands where nothing is cached.
    let sys = system("shipping");
    let (code, first) = chat(&br, &sys, "Where is my parcel?");
    assert_eq!(code, 200);
    wait_for_blocks(&br, first["usage"]["prompt_tokens"].as_u64().unwrap() / 16);
    let (code, r) = chat(&br, &sys, "Can I change the address?");
    assert_eq!(code, 200);
    assert!(
        cached(&r) < 16,
        "round robin should have switched workers: {r}"
    );
    // A dead worker is routed around: every request still succeeds.
    drop(w1);
    for i in 0..4 {
        let (code, r) = chat(&bp, &system("returns"), &format!("Question {i}?"));
        assert_eq!(code, 200, "{r}");
    }
    let (_, m) = cachet_tests::curl_status(&[&format!("{bp}/metrics")]);
    assert!(
        m.contains("cachet_routing_decisions_total{policy=\"prefix\",reason=\"prefix_hit\"}"),
        "{m}"
    );
}

/// The config file lists the pool: the gateway's own engine (`kind = "embedded"`) next to a
/// `cachet worker`. Round robin uses both; prefix routing finds a prefix on whichever holds it,
/// the embedded engine's blocks known exactly from its own KV events.
#[test]
fn the_embedded_engine_and_a_worker_from_the_config_make_one_pool() {
    cachet_tests::smollm2_path();
    let dir = scratch("embedded");
    let key = dir.join("hash.key");
    std::fs::write(&key, "cd".repeat(32)).unwrap();
    let key = key.to_str().unwrap().to_string();
    let pw = free_port();
    let worker_url = format!("http://127.0.0.1:{pw}");
    let _w = cachet(&[
        "worker",
        "--listen",
        &format!("127.0.0.1:{pw}"),
        "--hash-key-file",
        &key,
    ]);
    let cfg = dir.join("cachet.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[tenant]]\nid = \"r\"\napi_key_sha256 = [\"{}\"]\n\n[[upstream]]\nkind = \"embedded\"\n\n[[upstream]]\nkind = \"cachet\"\nurl = \"{worker_url}\"\n",
            cachet_gateway::tenants::hex(&cachet_gateway::tenants::hash_key("sk-route"))
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap().to_string();
    wait_for(&format!("{worker_url}/health"));
    let gateway = |port: u16, routing: &str| {
        cachet(&[
            "serve",
            "--config",
            &cfg,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--hash-key-file",
            &key,
            "--routing",
            routing,
        ])
    };
    let (pr, pp) = (free_port(), free_port());
    let _rr = gateway(pr, "round_robin");
    let _prefix = gateway(pp, "prefix");
    let (br, bp) = (
        format!("http://127.0.0.1:{pr}"),
        format!("http://127.0.0.1:{pp}"),
    );
    ready(&[&br, &bp]);
    // Round robin: four requests, two on each member.
    for i in 0..4 {
        let (code, r) = chat(&br, "You are terse.", &format!("Say {i}."));
        assert_eq!(code, 200, "{r}");
    }
    let (_, m) = cachet_tests::curl_status(&[&format!("{br}/metrics")]);
    for w in ["embedded", worker_url.as_str()] {
        let line = m
            .lines()
            .find(|l| {
                l.starts_with("cachet_routed_requests_total{") && l.contains(&format!("\"{w}\""))
            })
            .unwrap_or_else(|| panic!("no requests routed to {w}: {m}"));
        let n: f64 = line.rsplit_once(' ').unwrap().1.parse().unwrap();
        assert!(n >= 2.0, "{line}");
    }
    // Prefix routing: a long system prompt, then two more questions under it: each finds it
    // cached wherever the first went.
    let sys = &system("billing");
    assert_prefix_reused(&bp, sys);
    let (_, m) = cachet_tests::curl_status(&[&format!("{bp}/metrics")]);
    assert!(
        m.contains("cachet_worker_cached_blocks{worker=\"embedded\"}"),
        "{m}"
    );
}

/// OpenAI-compatible upstreams (here two more `cachet serve`s, reached as any OpenAI server is:
/// text to `/v1/completions`, with an API key): prefix routing sends a repeated system prompt to
/// the server it went to before (approximate routing from request history), where it is cached.
#[test]
fn openai_compatible_upstreams_are_routed_to_from_request_history() {
    cachet_tests::smollm2_path();
    let dir = scratch("openai-up");
    let up_cfg = dir.join("upstream.toml");
    std::fs::write(&up_cfg, tenant("gateway", "sk-up")).unwrap();
    let (p1, p2, pa) = (free_port(), free_port(), free_port());
    let upstream = |port: u16| {
        cachet(&[
            "serve",
            "--config",
            up_cfg.to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
    };
    let (_u1, _u2) = (upstream(p1), upstream(p2));
    let (u1, u2) = (
        format!("http://127.0.0.1:{p1}"),
        format!("http://127.0.0.1:{p2}"),
    );
    let cfg = dir.join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}\n[[upstream]]\nkind = \"openai\"\nurl = \"{u1}\"\napi_key_env = \"CACHET_TEST_UPSTREAM_KEY\"\n\n[[upstream]]\nkind = \"openai\"\nurl = \"{u2}\"\napi_key_env = \"CACHET_TEST_UPSTREAM_KEY\"\n",
            tenant("r", "sk-route")
        ),
    )
    .unwrap();
    let _gateway = Proc(
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .env("CACHET_USAGE_DB", "off")
            .args(["serve", "--config", cfg.to_str().unwrap(), "--listen"])
            .arg(format!("127.0.0.1:{pa}"))
            .args(["--routing", "prefix", "--model", "smollm2"])
            .env("CACHET_TEST_UPSTREAM_KEY", "sk-up")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ba = format!("http://127.0.0.1:{pa}");
    wait_for(&format!("{u1}/health"));
    wait_for(&format!("{u2}/health"));
    ready(&[&ba]);
    // A long request on one upstream while a second system prompt arrives: the second goes to
    // the other (load), so the two prompts live on different servers.
    let other = "You are the billing assistant of Northwind Routers. Answer in at most three sentences, politely, and only about Northwind invoices and payments. Never discuss shipping.";
    let sys = &system("shipping");
    let busy = {
        let ba = ba.clone();
        std::thread::spawn(move || chat_n(&ba, other, "List every invoice field.", 96))
    };
    // Routed once its first token is back (warm-up + this one).
    let t0 = Instant::now();
    while routed(&ba).values().sum::<u64>() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the long request never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = routed(&ba);
    let (code, first) = chat(&ba, sys, "Where is my parcel?");
    assert_eq!(code, 200, "{first}");
    assert_eq!(busy.join().unwrap().0, 200);
    assert!(
        first["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{first}"
    );
    assert!(
        first["usage"]["prompt_tokens"].as_u64().unwrap() > 32,
        "{first}"
    );
    for q in ["Can I change the address?", "How long does delivery take?"] {
        let (code, r) = chat(&ba, sys, q);
        assert_eq!(code, 200, "{r}");
        assert!(cached(&r) >= 32, "history routing missed the cache: {r}");
    }
    // Idle again, both equally loaded: only the history says where the prompt went (without it
    // the tie goes to the first upstream, which never saw it).
    let after = routed(&ba);
    assert!(
        moved(&before, &after).contains(&3),
        "not all on one upstream: {before:?} → {after:?}"
    );
    // Streaming passes through, ending with usage and [DONE].
    let body = serde_json::json!({"model": "smollm2", "max_tokens": 4, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": sys}, {"role": "user", "content": "Hello?"}]});
    let out = Command::new("curl")
        .args([
            "-sS",
            "-N",
            "--max-time",
            "60",
            "-H",
            "authorization: Bearer sk-route",
            "-d",
        ])
        .arg(body.to_string())
        .arg(format!("{ba}/v1/chat/completions"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\"content\"")
            && text.contains("\"usage\"")
            && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
}

/// A worker that freezes (SIGSTOP: the kernel still accepts its connections, nothing answers)
/// is found out by the response-head timeout and skipped: every request still succeeds, within
/// seconds, not after minutes.
#[test]
fn a_frozen_worker_fails_over_in_seconds() {
    cachet_tests::smollm2_path();
    let dir = scratch("frozen");
    let cfg = route_tenant(&dir);
    let (p1, p2, pg) = (free_port(), free_port(), free_port());
    let w1 = cachet(&["worker", "--listen", &format!("127.0.0.1:{p1}")]);
    let _w2 = cachet(&["worker", "--listen", &format!("127.0.0.1:{p2}")]);
    let (u1, u2) = (
        format!("http://127.0.0.1:{p1}"),
        format!("http://127.0.0.1:{p2}"),
    );
    wait_for(&format!("{u1}/health"));
    wait_for(&format!("{u2}/health"));
    let _gw = cachet(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{pg}"),
        "--worker",
        &u1,
        "--worker",
        &u2,
        "--routing",
        "round_robin",
        "--upstream-response-timeout",
        "2",
    ]);
    let base = format!("http://127.0.0.1:{pg}");
    ready(&[&base]);
    std::thread::sleep(Duration::from_millis(600));
    let pid = w1.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    for i in 0..4 {
        let t0 = Instant::now();
        let (code, r) = chat(&base, "You are terse.", &format!("Say {i}."));
        let took = t0.elapsed();
        assert_eq!(code, 200, "{r}");
        assert!(took < Duration::from_secs(8), "request {i} took {took:?}");
    }
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
}

/// The tenant's cache salt reaches an OpenAI-compatible upstream as vLLM's `cache_salt`, so the
/// upstream keeps tenants' prefix caches apart too. The upstream is a real OpenAI-compatible
/// server (a second `cachet serve`, which honours `cache_salt` as vLLM does), serving both
/// gateways as one client: through a gateway with `cache_salt = false`, tenant `s` finds the
/// prompt tenant `r` sent in the upstream's cache; through the default gateway it does not,
/// while `r` still finds its own.
#[test]
fn the_tenant_salt_reaches_openai_compatible_upstreams_as_cache_salt() {
    cachet_tests::smollm2_path();
    let dir = scratch("salt-up");
    let up_cfg = dir.join("upstream.toml");
    std::fs::write(&up_cfg, tenant("gateway", "sk-up")).unwrap();
    let (pu, pa, pb) = (free_port(), free_port(), free_port());
    let _up = cachet(&[
        "serve",
        "--config",
        up_cfg.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{pu}"),
    ]);
    let u = format!("http://127.0.0.1:{pu}");
    let gateway = |port: u16, name: &str, extra: &str| {
        let cfg = dir.join(name);
        std::fs::write(
            &cfg,
            format!(
                "{}{}\n[[upstream]]\nkind = \"openai\"\nurl = \"{u}\"\napi_key_env = \"CACHET_TEST_UPSTREAM_KEY\"\n{extra}",
                tenant("r", "sk-route"),
                tenant("s", "sk-other")
            ),
        )
        .unwrap();
        Proc(
            Command::new(env!("CARGO_BIN_EXE_cachet"))
                .env("CACHET_USAGE_DB", "off")
                .env("CACHET_USAGE_DB", "off")
                .args(["serve", "--config", cfg.to_str().unwrap(), "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .args(cachet_tests::SMOLLM2_GATEWAY)
                .env("CACHET_TEST_UPSTREAM_KEY", "sk-up")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _a = gateway(pa, "salted.toml", "");
    let _b = gateway(pb, "unsalted.toml", "cache_salt = false\n");
    let (a, b) = (
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    );
    wait_for(&format!("{u}/health"));
    ready(&[&a, &b]);
    // Without the salt: one tenant's prompt is a cache hit for the other.
    let sys = system("returns");
    let (code, r) = chat_as(&b, "sk-route", &sys, "Can I return a router?", 2);
    assert_eq!(code, 200, "{r}");
    let (code, r) = chat_as(&b, "sk-other", &sys, "How long do refunds take?", 2);
    assert_eq!(code, 200, "{r}");
    assert!(cached(&r) >= 32, "the test needs the unsalted hit: {r}");
    // With it: the tenant's own prompt hits, another tenant's does not.
    let sys = system("warranty");
    let (code, r) = chat_as(&a, "sk-route", &sys, "Is my router covered?", 2);
    assert_eq!(code, 200, "{r}");
    let (code, r) = chat_as(&a, "sk-route", &sys, "For how long?", 2);
    assert_eq!(code, 200, "{r}");
    assert!(cached(&r) >= 32, "r's own prefix missed: {r}");
    let (code, r) = chat_as(&a, "sk-other", &sys, "Is my router covered?", 2);
    assert_eq!(code, 200, "{r}");
    assert_eq!(
        cached(&r),
        0,
        "tenant s hit r's prefix in the upstream: {r}"
    );
}

/// A request whose client hangs up while it waits in a worker's queue (before its first token)
/// is cancelled in the worker at once: it never runs, so the next request does not wait for it.
#[test]
fn a_request_abandoned_before_its_first_token_never_runs_in_the_worker() {
    use std::io::Read;
    cachet_tests::smollm2_path();
    let dir = scratch("abandon");
    let cfg = route_tenant(&dir);
    let (pw, pg) = (free_port(), free_port());
    let _w = cachet(&[
        "worker",
        "--listen",
        &format!("127.0.0.1:{pw}"),
        "--max-num-seqs",
        "1",
    ]);
    let uw = format!("http://127.0.0.1:{pw}");
    wait_for(&format!("{uw}/health"));
    let _gw = cachet(&[
        "serve",
        "--config",
        cfg.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{pg}"),
        "--worker",
        &uw,
    ]);
    let base = format!("http://127.0.0.1:{pg}");
    ready(&[&base]);
    let addr = format!("127.0.0.1:{pg}");
    let stream = |max_tokens: u32| {
        let body = format!(
            r#"{{"model":"smollm2","prompt":"1, 2, 3, 4, 5, 6,","max_tokens":{max_tokens},"temperature":0,"ignore_eos":true,"stream":true}}"#
        );
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        use std::io::Write;
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-route\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        s
    };
    // A holds the worker's only slot; B waits behind it in the worker's queue.
    let mut a = stream(400);
    let mut buf = [0u8; 4096];
    let mut got = String::new();
    while !got.contains("data: ") {
        let n = a.read(&mut buf).unwrap();
        assert!(n > 0, "{got}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let b = stream(300);
    std::thread::sleep(Duration::from_millis(800));
    // B's client goes away before B's first token, then A's.
    drop(b);
    std::thread::sleep(Duration::from_millis(300));
    drop(a);
    // C runs at once: B (300 tokens, ~10 s here) was never started.
    let t0 = Instant::now();
    let (code, r) = chat(&base, "You are terse.", "Say hi.");
    let took = t0.elapsed();
    assert_eq!(code, 200, "{r}");
    assert!(
        took < Duration::from_secs(4),
        "the next request waited {took:?}: the abandoned one ran"
    );
}
