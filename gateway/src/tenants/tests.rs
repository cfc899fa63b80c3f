use std::time::{Duration, Instant};

use super::*;

const KEY: [u8; 32] = [5; 32];

/// `f` run to completion (admission on local limits never waits).
fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn admit(t: &Arc<Tenant>, prompt_tokens: u64, now: Instant) -> Result<Permit, Denied> {
    block_on(t.admit(prompt_tokens, now))
}

fn example() -> TenantRegistry {
    let text = include_str!("../../../examples/cachet.toml");
    crate::config::tenant_registry(text, &KEY, Instant::now()).unwrap()
}

#[test]
fn the_example_config_loads_and_keys_authenticate() {
    let reg = example();
    assert_eq!(reg.tenants().len(), 2);
    assert_eq!(
        reg.authenticate("sk-acme-example-key").unwrap().id(),
        "acme"
    );
    assert_eq!(
        reg.authenticate("sk-free-example-key").unwrap().id(),
        "free-tier"
    );
    assert_eq!(
        reg.authenticate("sk-acme-example-keY").unwrap_err(),
        Denied::BadKey
    );
    assert_eq!(reg.authenticate("").unwrap_err(), Denied::BadKey);
}

#[test]
fn salts_isolate_tenants_unless_they_share_a_group() {
    let text = format!(
        "{}\n[[tenant]]\nid = \"other\"\napi_key_sha256 = [\"{}\"]\ncache_share_group = \"public-demo\"\n",
        include_str!("../../../examples/cachet.toml"),
        hex(&hash_key("k3"))
    );
    let reg = crate::config::tenant_registry(&text, &KEY, Instant::now()).unwrap();
    let acme = reg.authenticate("sk-acme-example-key").unwrap();
    let free = reg.authenticate("sk-free-example-key").unwrap();
    let other = reg.authenticate("k3").unwrap();
    assert_ne!(acme.salt, free.salt);
    assert_eq!(free.salt, other.salt, "same cache_share_group, same salt");
    // A different deployment key gives different salts.
    let reg2 = crate::config::tenant_registry(
        include_str!("../../../examples/cachet.toml"),
        &[6; 32],
        Instant::now(),
    )
    .unwrap();
    assert_ne!(
        reg2.authenticate("sk-acme-example-key").unwrap().salt,
        acme.salt
    );
}

#[test]
fn model_allow_lists_apply() {
    let reg = example();
    assert!(reg
        .authenticate("sk-acme-example-key")
        .unwrap()
        .allows_model("anything"));
    let free = reg.authenticate("sk-free-example-key").unwrap();
    assert!(free.allows_model("smollm2"));
    assert!(!free.allows_model("llama3-8b"));
}

#[test]
fn concurrency_cap_and_permits() {
    let free = example().authenticate("sk-free-example-key").unwrap();
    let t = Instant::now();
    let a = admit(&free, 10, t).unwrap();
    let _b = admit(&free, 10, t).unwrap();
    assert!(matches!(
        admit(&free, 10, t),
        Err(Denied::RateLimited {
            limit: "concurrent-requests",
            ..
        })
    ));
    assert_eq!(free.inflight(), 2, "a refusal gives its slot back");
    drop(a);
    assert!(admit(&free, 10, t).is_ok());
}

#[test]
fn requests_and_tokens_per_minute_with_retry_after() {
    let text = format!(
        "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\nrequests_per_minute = 2\ntokens_per_minute = 600\n",
        hex(&hash_key("k"))
    );
    let t0 = Instant::now();
    let reg = crate::config::tenant_registry(&text, &KEY, t0).unwrap();
    let t = reg.authenticate("k").unwrap();
    drop(admit(&t, 100, t0).unwrap());
    drop(admit(&t, 100, t0).unwrap());
    match admit(&t, 100, t0) {
        Err(Denied::RateLimited {
            limit: "requests-per-minute",
            retry_after,
            ..
        }) => assert_eq!(retry_after, Duration::from_secs(30)),
        other => panic!("{other:?}"),
    }
    let t1 = t0 + Duration::from_secs(30);
    // 400 of 600 tokens left (+300 refilled, capped at 600): a 700-token prompt can never fit.
    assert!(matches!(
        admit(&t, 700, t1),
        Err(Denied::TooLarge {
            asked: 700,
            capacity: 600,
            ..
        })
    ));
    // Generated tokens are charged after the fact and delay the next request.
    t.charge_tokens(600, t1);
    match admit(&t, 100, t1) {
        Err(Denied::RateLimited {
            limit: "tokens-per-minute",
            retry_after,
            ..
        }) => assert_eq!(retry_after, Duration::from_secs(10)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_configs_say_what_to_fix() {
    let err = |text: &str| {
        crate::config::tenant_registry(text, &KEY, Instant::now())
            .unwrap_err()
            .to_string()
    };
    assert!(err("[[tenant]]\nid = \"a\"\napi_key_sha256 = []\n").contains("hash-key"));
    assert!(err("[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"abc\"]\n").contains("64 hex digits"));
    let h = hex(&hash_key("x"));
    assert!(err(&format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{h}\"]\nrequests_per_minute = 0\n"
    ))
    .contains("requests_per_minute must be > 0"));
    for share in ["0.0", "-1.0", "1001.0", "nan"] {
        assert!(err(&format!(
            "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{h}\"]\nshare = {share}\n"
        ))
        .contains("share must be 0.01 to 1000"));
    }
    assert!(err(&format!("[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{h}\"]\n[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{h}\"]\n")).contains("unique"));
    assert!(err(&format!("[[tenant]]\nid = \"a\"\napi_key = \"{h}\"\n")).contains("unknown field"));
    // Only the operator declares public prefixes: a tenant's table has no such setting.
    assert!(err(&format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{h}\"]\npublic_prefix = \"You are\"\n"
    ))
    .contains("unknown field"));
    for budget in ["0.0", "-5.0", "nan"] {
        assert!(err(&format!(
            "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{h}\"]\nbudget_usd = {budget}\n"
        ))
        .contains("budget_usd must be a positive number"));
    }
    assert!(err(&format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{h}\"]\nbudget_period = \"day\"\n"
    ))
    .contains("set both"));
    assert!(err(&format!(
        "[[tenant]]\nid = \"(public)\"\napi_key_sha256 = [\"{h}\"]\n"
    ))
    .contains("public prefix's share"));
}

fn one_tenant(limits: &str) -> Vec<TenantConfig> {
    let text = format!(
        "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\n{limits}\n",
        hex(&hash_key("k"))
    );
    crate::config::ConfigFile::parse(&text).unwrap().tenant
}

#[test]
fn a_config_reload_keeps_buckets_and_requests_in_flight() {
    let t0 = Instant::now();
    let reg = TenantRegistry::from_configs(
        one_tenant("requests_per_minute = 2\ntokens_per_minute = 100\nmax_concurrent = 1"),
        &KEY,
        t0,
    )
    .unwrap();
    let t = reg.authenticate("k").unwrap();
    let held = admit(&t, 60, t0).unwrap();
    // Reloaded with the same limits: the request in flight still holds the only slot, and the
    // buckets are as they were (one request and 60 tokens used), not refilled.
    let same = TenantRegistry::reloaded(
        one_tenant("requests_per_minute = 2\ntokens_per_minute = 100\nmax_concurrent = 1"),
        &KEY,
        t0,
        Some(&reg),
    )
    .unwrap();
    let t2 = same.authenticate("k").unwrap();
    assert_eq!(t2.inflight(), 1);
    assert!(matches!(
        admit(&t2, 1, t0),
        Err(Denied::RateLimited {
            limit: "concurrent-requests",
            ..
        })
    ));
    drop(held);
    assert_eq!(
        t2.inflight(),
        0,
        "the old permit frees the new tenant's slot"
    );
    assert!(matches!(
        admit(&t2, 60, t0),
        Err(Denied::RateLimited {
            limit: "tokens-per-minute",
            ..
        })
    ));
    // A lower rate keeps the level within its new capacity: 40 of 100 left, capped at 30.
    let lower =
        TenantRegistry::reloaded(one_tenant("tokens_per_minute = 30"), &KEY, t0, Some(&same))
            .unwrap();
    let t3 = lower.authenticate("k").unwrap();
    assert!(admit(&t3, 30, t0).is_ok());
    assert!(admit(&t3, 1, t0).is_err());
}

#[test]
fn a_prompt_refused_for_tokens_gives_its_request_unit_back() {
    let t0 = Instant::now();
    let reg = TenantRegistry::from_configs(
        one_tenant("requests_per_minute = 1\ntokens_per_minute = 50"),
        &KEY,
        t0,
    )
    .unwrap();
    let t = reg.authenticate("k").unwrap();
    // Admitted first (before the template runs), then refused once the prompt is known.
    let mut p = block_on(t.admit_request(t0)).unwrap();
    assert!(matches!(
        p.charge_prompt(80, t0),
        Err(Denied::TooLarge { .. })
    ));
    drop(p);
    // The requests/min unit came back: a fitting request still gets in.
    let mut p = block_on(t.admit_request(t0)).unwrap();
    p.charge_prompt(20, t0).unwrap();
}

/// Two replicas' registries of `tenants` (TOML) sharing the Redis at `url` (each its own
/// connection and lease ids, as two processes have), `extra` lines in `[shared_limits]`.
fn replicas(tenants: &str, url: &str, extra: &str) -> (TenantRegistry, TenantRegistry) {
    let text = format!("{tenants}\n[shared_limits]\nredis_url = \"{url}\"\n{extra}");
    let make = || {
        let file = crate::config::ConfigFile::parse(&text).unwrap();
        let store = shared::SharedLimits::new(file.shared_limits.unwrap()).unwrap();
        TenantRegistry::with_shared_limits(file.tenant, &KEY, Instant::now(), Some(store)).unwrap()
    };
    (make(), make())
}

fn tenant_toml(id: &str, key: &str, limits: &str) -> String {
    format!(
        "[[tenant]]\nid = \"{id}\"\napi_key_sha256 = [\"{}\"]\n{limits}\n",
        hex(&hash_key(key))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_limits_hold_across_replicas_through_a_real_redis() {
    let Some(redis) = cachet_tests::RedisServer::start() else {
        eprintln!("skipped: no redis-server here (apt install redis-server; CI installs it)");
        return;
    };
    let tenants = [
        tenant_toml("rpm", "k-rpm", "requests_per_minute = 10"),
        tenant_toml("conc", "k-conc", "max_concurrent = 2"),
        tenant_toml("tpm", "k-tpm", "tokens_per_minute = 100"),
        tenant_toml("free", "k-free", ""),
    ]
    .concat();
    let (a, b) = replicas(&tenants, &redis.url, "replicas = 2");
    let now = Instant::now;

    // requests/min: one bucket of 10 for both replicas, taken alternately.
    let (ra, rb) = (
        a.authenticate("k-rpm").unwrap(),
        b.authenticate("k-rpm").unwrap(),
    );
    let mut admitted = 0;
    let mut retry = None;
    for i in 0..30 {
        let t = if i % 2 == 0 { &ra } else { &rb };
        match t.admit_request(now()).await {
            Ok(_) => admitted += 1,
            Err(Denied::RateLimited {
                limit: "requests-per-minute",
                retry_after,
                ..
            }) => retry = Some(retry_after),
            Err(e) => panic!("{e:?}"),
        }
    }
    // 10 in the bucket, plus at most one refilled while the loop ran (10 a minute).
    assert!((10..=11).contains(&admitted), "admitted {admitted} of 30");
    let retry = retry.expect("refusals");
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(6),
        "{retry:?}"
    );

    // Concurrency: two slots across both replicas; a release on one frees a slot on the other.
    let (ca, cb) = (
        a.authenticate("k-conc").unwrap(),
        b.authenticate("k-conc").unwrap(),
    );
    let p1 = ca.admit_request(now()).await.unwrap();
    let _p2 = cb.admit_request(now()).await.unwrap();
    assert!(matches!(
        cb.admit_request(now()).await,
        Err(Denied::RateLimited {
            limit: "concurrent-requests",
            ..
        })
    ));
    drop(p1);
    let mut freed = false;
    for _ in 0..200 {
        if cb.admit_request(now()).await.is_ok() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        freed,
        "the slot released on replica A was never admitted on B"
    );

    // tokens/min: A's prompt is charged in Redis (after A's admission returns, not waited
    // for: one loopback round trip), so B then sees what is left.
    let (ta, tb) = (
        a.authenticate("k-tpm").unwrap(),
        b.authenticate("k-tpm").unwrap(),
    );
    let mut pa = ta.admit_request(now()).await.unwrap();
    pa.charge_prompt(60, now()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    match tb
        .admit_request(now())
        .await
        .unwrap()
        .charge_prompt(60, now())
    {
        Err(Denied::RateLimited {
            limit: "tokens-per-minute",
            retry_after,
            ..
        }) => assert!(
            retry_after > Duration::ZERO && retry_after <= Duration::from_secs(13),
            "{retry_after:?}"
        ),
        other => panic!("{other:?}"),
    }
    tb.admit_request(now())
        .await
        .unwrap()
        .charge_prompt(35, now())
        .unwrap();
    // A prompt over the whole minute's worth can never fit.
    assert!(matches!(
        tb.admit_request(now())
            .await
            .unwrap()
            .charge_prompt(101, now()),
        Err(Denied::TooLarge {
            asked: 101,
            capacity: 100,
            ..
        })
    ));

    // A tenant without limits never asks Redis.
    let store = b.shared_limits().unwrap().clone();
    let before = store.errors.load(std::sync::atomic::Ordering::Relaxed);
    drop(
        b.authenticate("k-free")
            .unwrap()
            .admit_request(now())
            .await
            .unwrap(),
    );
    assert_eq!(
        store.errors.load(std::sync::atomic::Ordering::Relaxed),
        before
    );
    assert!(!store.is_down());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_a_replica_admits_its_share_or_refuses_as_configured() {
    // Nothing listens on this port: every Redis call fails at once.
    let dead = format!("redis://127.0.0.1:{}/0", cachet_tests::free_port());
    let tenants = [
        tenant_toml(
            "rpm",
            "k-rpm",
            "requests_per_minute = 10\nmax_concurrent = 4",
        ),
        tenant_toml("free", "k-free", ""),
    ]
    .concat();
    let (a, _) = replicas(&tenants, &dead, "replicas = 2");
    let t = a.authenticate("k-rpm").unwrap();
    // This replica's share: 10 / 2 requests a minute, 4 / 2 at once.
    let (p1, p2) = (
        t.admit_request(Instant::now()).await.unwrap(),
        t.admit_request(Instant::now()).await.unwrap(),
    );
    assert!(matches!(
        t.admit_request(Instant::now()).await,
        Err(Denied::RateLimited {
            limit: "concurrent-requests",
            ..
        })
    ));
    drop((p1, p2));
    let mut admitted = 2;
    while t.admit_request(Instant::now()).await.is_ok() {
        admitted += 1;
        assert!(admitted <= 6, "more than this replica's share");
    }
    assert_eq!(admitted, 5);
    let s = a.shared_limits().unwrap();
    assert!(s.is_down());
    assert!(s.errors.load(std::sync::atomic::Ordering::Relaxed) >= 6);
    assert!(s.fallbacks.load(std::sync::atomic::Ordering::Relaxed) >= 6);

    // on_error = "closed": refused with the reason, as a 503 that says to retry.
    let (c, _) = replicas(&tenants, &dead, "on_error = \"closed\"");
    let refused = c
        .authenticate("k-rpm")
        .unwrap()
        .admit_request(Instant::now())
        .await
        .unwrap_err();
    assert!(matches!(refused, Denied::LimitsUnavailable { .. }));
    let e = crate::http::error::ApiError::from(refused);
    assert_eq!(e.status, hyper::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(e.retry_after, Some(Duration::from_secs(1)));
    assert!(e.message.contains("Redis"), "{}", e.message);
    // A tenant without limits needs no Redis either way.
    assert!(c
        .authenticate("k-free")
        .unwrap()
        .admit_request(Instant::now())
        .await
        .is_ok());
}
