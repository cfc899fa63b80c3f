//! The official `openai` Python client (from PyPI) against `cachet serve` over TLS.

use std::path::PathBuf;
use std::process::Command;

use super::common::*;

#[test]
fn the_official_openai_client_works_against_cachet_serve_over_tls() {
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n\n[[tenant]]\nid = \"limited\"\napi_key_sha256 = [\"{}\"]\nrequests_per_minute = 2\n",
        key_hash("sk-test-acme"),
        key_hash("sk-test-limited")
    );
    let site = openai_site();
    let dir = std::env::temp_dir().join(format!("cachet-openai-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, crt, key) = make_certs(&dir, "openai");
    let (_server, base) = start_tls(&config, &crt, &key);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/openai_check.py");
    let out = Command::new("python3")
        .arg(&script)
        .env("PYTHONPATH", &site)
        .env("BASE_URL", &base)
        .env("CA_FILE", &ca)
        .env("KEY", "sk-test-acme")
        .env("LIMITED_KEY", "sk-test-limited")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(text.contains("all checks passed"));
}
