//! The operator API end to end: two `cachet serve` replicas on one real PostgreSQL. A change made
//! on either replica is in effect on the other within a second (measured), keys are shown once,
//! suspensions refuse, limits change, every change is audited, and a restarted replica finds
//! everything where it was.

use std::time::{Duration, Instant};

use super::common::*;

const OP_KEY: &str = "op-secret-alice";

/// The status of `GET /v1/models` as `key` (authenticates, nothing else).
fn models_status(base: &str, key: &str) -> u16 {
    let (_, out) = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        &format!("Authorization: Bearer {key}"),
        &format!("{base}/v1/models"),
    ]);
    out.trim().parse().unwrap_or(0)
}

/// How long until `key` gets `want` from `base` (polled every 10 ms; at most 5 s).
fn until(base: &str, key: &str, want: u16) -> Duration {
    let t0 = Instant::now();
    loop {
        let got = models_status(base, key);
        if got == want {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{base}: still {got}, not {want}, after 5 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn op(method: &str, url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    http_json(method, url, OP_KEY, &body)
}

const CHAT: &str =
    r#"{"model":"smollm2","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}"#;

#[test]
fn operator_changes_reach_every_replica_within_a_second() {
    let Some(pg) = cachet_tests::PgServer::start() else {
        eprintln!("skipped: no PostgreSQL server binaries here (apt install postgresql)");
        return;
    };
    let config = format!(
        "[[tenant]]\nid = \"boot\"\napi_key_sha256 = [\"{}\"]\n\n[operator]\ndatabase = \"{}\"\npoll_ms = 200\n\n[[operator.key]]\nname = \"alice\"\nsha256 = \"{}\"\n",
        key_hash("sk-boot"),
        pg.url,
        key_hash(OP_KEY)
    );
    let (a, base_a) = start(&config);
    let (_b, base_b) = start(&config);
    wait_health(&base_a);
    wait_health(&base_b);
    // The file's tenant, imported once (by whichever replica came first), works on both.
    assert_eq!(models_status(&base_a, "sk-boot"), 200);
    assert_eq!(models_status(&base_b, "sk-boot"), 200);

    only_operator_keys_open_the_api(&base_a);

    // A tenant made on A: its key, shown once, works on B within a second.
    let (status, made) = op(
        "POST",
        &format!("{base_a}/operator/v1/tenants"),
        serde_json::json!({"id": "acme", "requests_per_minute": 600, "share": 2, "key_label": "prod"}),
    );
    assert_eq!(status, 201, "{made}");
    let key = made["api_key"]["key"].as_str().unwrap().to_string();
    let key_id = made["api_key"]["key_id"].as_str().unwrap().to_string();
    assert_eq!(
        models_status(&base_a, &key),
        200,
        "the replica that made it applies it at once"
    );
    let mut delays = vec![until(&base_b, &key, 200)];
    let (status, shown) = op(
        "GET",
        &format!("{base_b}/operator/v1/tenants/acme"),
        serde_json::json!({}),
    );
    assert_eq!(status, 200);
    assert_eq!(shown["keys"][0]["key_id"], key_id.as_str());
    assert_eq!(shown["keys"][0]["label"], "prod");
    let text = shown.to_string();
    assert!(
        !text.contains(&key) && !text.contains(&key_hash(&key)),
        "neither the key nor its hash is shown again: {text}"
    );
    assert_eq!(shown["config"]["share"], 2.0);

    // Suspended on B: refused on A within a second (403 tenant_suspended), then resumed.
    let (status, _) = op(
        "POST",
        &format!("{base_b}/operator/v1/tenants/acme/suspend"),
        serde_json::json!({"reason": "unpaid invoice"}),
    );
    assert_eq!(status, 200);
    delays.push(until(&base_a, &key, 403));
    let refused = chat_with_status(&base_a, &key, CHAT);
    assert!(
        refused.contains("tenant_suspended") && refused.contains("STATUS=403"),
        "{refused}"
    );
    let (status, _) = op(
        "POST",
        &format!("{base_b}/operator/v1/tenants/acme/resume"),
        serde_json::json!({}),
    );
    assert_eq!(status, 200);
    delays.push(until(&base_a, &key, 200));

    // Rotated on A without grace: the old key stops on B within a second, the new one works.
    let (status, rotated) = op(
        "POST",
        &format!("{base_a}/operator/v1/tenants/acme/keys/{key_id}/rotate"),
        serde_json::json!({}),
    );
    assert_eq!(status, 201, "{rotated}");
    let new_key = rotated["key"]["key"].as_str().unwrap().to_string();
    delays.push(until(&base_b, &key, 401));
    assert_eq!(models_status(&base_b, &new_key), 200);

    // An admin key (templates), then revoked.
    let (status, admin) = op(
        "POST",
        &format!("{base_a}/operator/v1/tenants/acme/keys"),
        serde_json::json!({"kind": "admin", "label": "ci"}),
    );
    assert_eq!(status, 201, "{admin}");
    assert_eq!(admin["key"]["kind"], "admin");
    let admin_id = admin["key"]["key_id"].as_str().unwrap().to_string();
    let (status, _) = op(
        "DELETE",
        &format!("{base_a}/operator/v1/tenants/acme/keys/{admin_id}"),
        serde_json::json!({}),
    );
    assert_eq!(status, 200);
    let (status, again) = op(
        "DELETE",
        &format!("{base_a}/operator/v1/tenants/acme/keys/{admin_id}"),
        serde_json::json!({}),
    );
    assert_eq!(status, 409, "{again}");

    // Limits changed on A are B's limits within a second: one request a minute.
    let (status, _) = op(
        "PATCH",
        &format!("{base_a}/operator/v1/tenants/acme"),
        serde_json::json!({"requests_per_minute": 1}),
    );
    assert_eq!(status, 200);
    std::thread::sleep(Duration::from_secs(1));
    assert!(chat_with_status(&base_b, &new_key, CHAT).contains("STATUS=200"));
    let limited = chat_with_status(&base_b, &new_key, CHAT);
    assert!(
        limited.contains("STATUS=429") && limited.contains("requests-per-minute"),
        "{limited}"
    );

    bad_changes_are_refused_and_audited(&base_a, &base_b);

    // A restarted replica: everything where it was; the file's tenant was imported once only.
    drop(a);
    let (_a2, base_a2) = start(&config);
    wait_health(&base_a2);
    assert_eq!(models_status(&base_a2, &new_key), 200);
    assert_eq!(models_status(&base_a2, &key), 401);
    assert_eq!(models_status(&base_a2, "sk-boot"), 200);
    let (_, all) = op(
        "GET",
        &format!("{base_b}/operator/v1/audit"),
        serde_json::json!({}),
    );
    let imports = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "tenant.import")
        .count();
    assert_eq!(imports, 1);

    for d in &delays {
        assert!(
            *d < Duration::from_secs(1),
            "a change took {d:?} to reach the other replica"
        );
    }
    println!("changes reached the other replica after {delays:?}");
}

/// Only operator keys open the operator API.
fn only_operator_keys_open_the_api(base_a: &str) {
    for key in ["", "sk-boot", "op-secret-alicE"] {
        let (status, body) = http_json(
            "GET",
            &format!("{base_a}/operator/v1/tenants"),
            key,
            &serde_json::json!({}),
        );
        assert_eq!(status, 401, "{key}: {body}");
        assert_eq!(body["error"]["code"], "invalid_operator_key");
    }
}

/// Bad changes are refused by field and change nothing; the audit log, read on B, has who did
/// what, when, newest first; both replicas' /metrics say the store answers and each is at the
/// newest revision.
fn bad_changes_are_refused_and_audited(base_a: &str, base_b: &str) {
    let (status, bad) = op(
        "PATCH",
        &format!("{base_a}/operator/v1/tenants/acme"),
        serde_json::json!({"share": 0}),
    );
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("share must be"),
        "{bad}"
    );
    let (status, bad) = op(
        "PATCH",
        &format!("{base_a}/operator/v1/tenants/acme"),
        serde_json::json!({"requests_per_minut": 5}),
    );
    assert_eq!(
        (status, bad["error"]["param"].as_str()),
        (400, Some("requests_per_minut")),
        "{bad}"
    );
    let (status, _) = op(
        "POST",
        &format!("{base_a}/operator/v1/tenants"),
        serde_json::json!({"id": "acme"}),
    );
    assert_eq!(status, 409);
    let (status, _) = op(
        "GET",
        &format!("{base_a}/operator/v1/tenants/nobody"),
        serde_json::json!({}),
    );
    assert_eq!(status, 404);

    // The audit log, read on B: who did what, when, newest first.
    let (status, audit) = op(
        "GET",
        &format!("{base_b}/operator/v1/audit?tenant=acme&limit=50"),
        serde_json::json!({}),
    );
    assert_eq!(status, 200);
    let actions: Vec<&str> = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "tenant.update",
            "key.revoke",
            "key.create",
            "key.rotate",
            "tenant.resume",
            "tenant.suspend",
            "tenant.create"
        ]
    );
    assert!(audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["actor"] == "alice"));
    assert_eq!(audit["data"][5]["detail"]["reason"], "unpaid invoice");

    // Both replicas' /metrics: the store answers, and each is at the newest revision.
    let newest = audit["data"][0]["revision"].as_i64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for base in [&base_a, &base_b] {
        let (_, m) = curl(&[&format!("{base}/metrics")]);
        assert!(m.contains("cachet_operator_store_up 1"), "{m}");
        assert!(
            m.contains(&format!("cachet_operator_revision {newest}")),
            "{base}: not at revision {newest}"
        );
    }
}
