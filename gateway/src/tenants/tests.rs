use std::time::{Duration, Instant};

use crate::config::{upstreams_from_toml, UpstreamConfig};

use super::*;

const KEY: [u8; 32] = [5; 32];

fn example() -> TenantRegistry {
    let text = include_str!("../../../examples/cachet.toml");
    TenantRegistry::from_toml(text, &KEY, Instant::now()).unwrap()
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
    let reg = TenantRegistry::from_toml(&text, &KEY, Instant::now()).unwrap();
    let acme = reg.authenticate("sk-acme-example-key").unwrap();
    let free = reg.authenticate("sk-free-example-key").unwrap();
    let other = reg.authenticate("k3").unwrap();
    assert_ne!(acme.salt, free.salt);
    assert_eq!(free.salt, other.salt, "same cache_share_group, same salt");
    // A different deployment key gives different salts.
    let reg2 = TenantRegistry::from_toml(
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
    let a = free.admit(10, t).unwrap();
    let _b = free.admit(10, t).unwrap();
    assert!(matches!(
        free.admit(10, t),
        Err(Denied::RateLimited {
            limit: "concurrent-requests",
            ..
        })
    ));
    assert_eq!(free.inflight(), 2, "a refusal gives its slot back");
    drop(a);
    assert!(free.admit(10, t).is_ok());
}

#[test]
fn requests_and_tokens_per_minute_with_retry_after() {
    let text = format!(
        "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\nrequests_per_minute = 2\ntokens_per_minute = 600\n",
        hex(&hash_key("k"))
    );
    let t0 = Instant::now();
    let reg = TenantRegistry::from_toml(&text, &KEY, t0).unwrap();
    let t = reg.authenticate("k").unwrap();
    drop(t.admit(100, t0).unwrap());
    drop(t.admit(100, t0).unwrap());
    match t.admit(100, t0) {
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
        t.admit(700, t1),
        Err(Denied::TooLarge {
            asked: 700,
            capacity: 600,
            ..
        })
    ));
    // Generated tokens are charged after the fact and delay the next request.
    t.charge_tokens(600, t1);
    match t.admit(100, t1) {
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
        TenantRegistry::from_toml(text, &KEY, Instant::now())
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

#[test]
fn upstreams_are_read_from_the_config_and_bad_ones_refused() {
    let ok = r#"
[[tenant]]
id = "a"
api_key_sha256 = ["0000000000000000000000000000000000000000000000000000000000000000"]

[[upstream]]
kind = "embedded"

[[upstream]]
kind = "cachet"
url = "http://10.0.0.2:9000/"
"#;
    assert_eq!(
        upstreams_from_toml(ok).unwrap(),
        vec![
            UpstreamConfig::Embedded {},
            UpstreamConfig::Cachet {
                url: "http://10.0.0.2:9000/".into(),
                ca_file: None,
            }
        ]
    );
    assert!(upstreams_from_toml("").unwrap().is_empty());
    let err = |t: &str| upstreams_from_toml(t).unwrap_err().to_string();
    assert!(err("[[upstream]]\nkind = \"vllm\"\n").contains("unknown variant `vllm`"));
    assert!(err("[[upstream]]\nkind = \"cachet\"\n").contains("missing field `url`"));
    assert!(err("[[upstream]]\nkind = \"cachet\"\nurl = \"10.0.0.2\"\n").contains("not an http"));
    // Every remote kind takes https:// (the system's roots), with a CA file of its own if named:
    // only for https://, and one that reads as PEM certificates — checked at load.
    let ca = std::env::temp_dir().join(format!("cachet-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, "not a certificate\n").unwrap();
    for kind in ["cachet", "openai"] {
        let up = |url: &str, extra: &str| {
            format!("[[upstream]]\nkind = \"{kind}\"\nurl = \"{url}\"\n{extra}")
        };
        assert!(
            upstreams_from_toml(&up("https://10.0.0.2:9000", "")).is_ok(),
            "{kind}"
        );
        let e = err(&up(
            "http://10.0.0.2:9000",
            "ca_file = \"/etc/ssl/x.pem\"\n",
        ));
        assert!(
            e.contains("ca_file") && e.contains("plain HTTP"),
            "{kind}: {e}"
        );
        let e = err(&up(
            "https://10.0.0.2:9000",
            "ca_file = \"/no/such/ca.pem\"\n",
        ));
        assert!(e.contains("/no/such/ca.pem"), "{kind}: {e}");
        let e = err(&up(
            "https://10.0.0.2:9000",
            &format!("ca_file = \"{}\"\n", ca.display()),
        ));
        assert!(e.contains("no CERTIFICATE"), "{kind}: {e}");
    }
    std::fs::remove_file(&ca).unwrap();
    assert!(
        err("[[upstream]]\nkind = \"embedded\"\n[[upstream]]\nkind = \"embedded\"\n")
            .contains("listed twice")
    );
    assert!(
        err("[[upstream]]\nkind = \"embedded\"\nurl = \"http://x\"\n").contains("unknown field")
    );
    // And the tenants part still parses the same file.
    TenantRegistry::from_toml(ok, &[0; 32], std::time::Instant::now()).unwrap();
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
    let held = t.admit(60, t0).unwrap();
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
        t2.admit(1, t0),
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
        t2.admit(60, t0),
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
    assert!(t3.admit(30, t0).is_ok());
    assert!(t3.admit(1, t0).is_err());
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
    let mut p = t.admit_request(t0).unwrap();
    assert!(matches!(
        p.charge_prompt(80, t0),
        Err(Denied::TooLarge { .. })
    ));
    drop(p);
    // The requests/min unit came back: a fitting request still gets in.
    let mut p = t.admit_request(t0).unwrap();
    p.charge_prompt(20, t0).unwrap();
}
