//! SIGHUP re-reads the tenants config; a broken one is refused and the previous one stays.

use std::process::Command;
use std::time::{Duration, Instant};

use super::common::*;

#[test]
fn sighup_reloads_the_tenants_config_and_refuses_a_broken_one() {
    let first = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-old")
    );
    let (server, base) = start(&first);
    let cfg_path = std::env::temp_dir()
        .join(format!(
            "cachet-serve-{}-{}",
            std::process::id(),
            base.rsplit(':').next().unwrap()
        ))
        .join("tenants.toml");
    let models = |key: &str| {
        curl(&[
            "-H",
            &format!("Authorization: Bearer {key}"),
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{base}/v1/models"),
        ])
        .1
    };
    assert_eq!(models("sk-old"), "200");
    assert_eq!(models("sk-new"), "401");
    let hup = || {
        assert!(Command::new("kill")
            .args(["-HUP", &server.0.id().to_string()])
            .status()
            .unwrap()
            .success())
    };
    std::fs::write(
        &cfg_path,
        format!(
            "[[tenant]]\nid = \"b\"\napi_key_sha256 = [\"{}\"]\n",
            key_hash("sk-new")
        ),
    )
    .unwrap();
    hup();
    let t0 = Instant::now();
    while models("sk-new") != "200" {
        assert!(t0.elapsed() < Duration::from_secs(10), "reload not applied");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(models("sk-old"), "401", "the old key is gone");
    // A broken config is refused; the last good one stays.
    std::fs::write(
        &cfg_path,
        "[[tenant]]\nid = \"c\"\napi_key_sha256 = [\"not-hex\"]\n",
    )
    .unwrap();
    hup();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(models("sk-new"), "200");
}
