//! TLS: HTTP/2 and HTTP/1.1 by ALPN, and a certificate reloaded without a restart.

use std::time::{Duration, Instant};

use super::common::*;

#[test]
fn tls_serves_http2_and_http1_and_reloads_its_certificate() {
    let dir = std::env::temp_dir().join(format!("cachet-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca1, crt1, key1) = make_certs(&dir, "one");
    let (crt, key) = (dir.join("live.pem"), dir.join("live.key"));
    std::fs::copy(&crt1, &crt).unwrap();
    std::fs::copy(&key1, &key).unwrap();
    let config = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-tls")
    );
    let (_server, url) = start_tls(&config, &crt, &key);
    let base = url.replace("https://", "http://");
    let body = r#"{"model":"smollm2","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":16,"temperature":0}"#;
    for (flag, want) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let (ok, out) = curl(&[
            flag,
            "--cacert",
            ca1.to_str().unwrap(),
            "-H",
            "Authorization: Bearer sk-tls",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            "-w",
            "\nHTTP_VERSION=%{http_version}",
            &format!("{url}/v1/chat/completions"),
        ]);
        assert!(ok, "{flag}: {out}");
        assert!(out.contains("Paris"), "{flag}: {out}");
        assert!(
            out.contains(&format!("HTTP_VERSION={want}")),
            "{flag} negotiated: {out}"
        );
    }
    // Plain HTTP on the TLS port is refused; an unknown CA is refused.
    let (ok, _) = curl(&[&format!("{base}/health")]);
    assert!(!ok, "plain HTTP must not be served on the TLS port");
    let (ca2, crt2, key2) = make_certs(&dir, "two");
    let (ok, _) = curl(&["--cacert", ca2.to_str().unwrap(), &format!("{url}/health")]);
    assert!(!ok, "a certificate from another CA must not verify yet");
    // Replace the files: the new certificate is served without a restart.
    std::fs::copy(&key2, &key).unwrap();
    std::fs::copy(&crt2, &crt).unwrap();
    let t0 = Instant::now();
    loop {
        let (ok, out) = curl(&["--cacert", ca2.to_str().unwrap(), &format!("{url}/health")]);
        if ok {
            assert!(out.contains("ok"), "{out}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "certificate not reloaded: {out}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}
