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

/// An OpenAI-compatible upstream over TLS: `cachet serve` with a test CA's certificate as the
/// upstream of a second gateway (`kind = "openai"`, an https:// URL). With `ca_file` naming that
/// CA the gateway trusts it and a chat goes through (the upstream's answer); without it the
/// system's roots do not, the upstream never turns healthy, the chat is refused with 503, and
/// the gateway's log says why (the certificate's issuer).
#[test]
fn an_https_upstream_is_trusted_through_its_ca_file_and_not_without() {
    use std::process::{Command, Stdio};
    let dir = std::env::temp_dir().join(format!("cachet-tls-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, crt, key) = make_certs(&dir, "up");
    let up_config = format!(
        "[[tenant]]\nid = \"gateway\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-up")
    );
    let (_upstream, up_url) = start_tls(&up_config, &crt, &key);
    assert!(up_url.starts_with("https://"));
    let body = r#"{"model":"smollm2","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":16,"temperature":0}"#;
    for trusted in [true, false] {
        let ca_line = if trusted {
            format!("ca_file = \"{}\"\n", ca.display())
        } else {
            String::new()
        };
        let cfg = dir.join(format!("gateway-{trusted}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\n\n[[upstream]]\nkind = \"openai\"\nurl = \"{up_url}\"\napi_key_env = \"CACHET_TEST_TLS_UPSTREAM_KEY\"\n{ca_line}",
                key_hash("sk-gw")
            ),
        )
        .unwrap();
        let port = free_port();
        let log = dir.join(format!("gateway-{trusted}.log"));
        let _gateway = cachet_tests::Proc(
            Command::new(env!("CARGO_BIN_EXE_cachet"))
                .env("CACHET_USAGE_DB", "off")
                .env("CACHET_TEST_TLS_UPSTREAM_KEY", "sk-up")
                .args(["serve", "--config", cfg.to_str().unwrap(), "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .args(cachet_tests::SMOLLM2_GATEWAY)
                .stdout(Stdio::null())
                .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
                .spawn()
                .unwrap(),
        );
        let base = format!("http://127.0.0.1:{port}");
        wait_health(&base);
        let chat = || chat_with_status(&base, "sk-gw", body);
        if trusted {
            // Once its first health check has passed, the upstream answers.
            let t0 = Instant::now();
            let out = loop {
                let out = chat();
                if out.contains("STATUS=200") || t0.elapsed() > Duration::from_secs(60) {
                    break out;
                }
                std::thread::sleep(Duration::from_millis(500));
            };
            assert!(out.contains("STATUS=200") && out.contains("Paris"), "{out}");
        } else {
            // Never served; refused with 503 once the health check has failed (until then a
            // request may meet the handshake's failure itself).
            let t0 = Instant::now();
            loop {
                let out = chat();
                assert!(
                    !out.contains("STATUS=200"),
                    "served through an untrusted upstream: {out}"
                );
                if out.contains("STATUS=503") {
                    break;
                }
                assert!(t0.elapsed() < Duration::from_secs(30), "{out}");
                std::thread::sleep(Duration::from_millis(500));
            }
            let text = std::fs::read_to_string(&log).unwrap();
            assert!(
                text.contains("UnknownIssuer") || text.contains("certificate"),
                "the log names the certificate: {text}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Mutual TLS between gateway and worker: a `cachet worker` serving TLS that requires client
/// certificates from a test CA (listening on every address: a client CA is authentication
/// enough to start without a token). A gateway presenting a certificate of that CA chats
/// through it; one without is refused at the handshake (503, the reason in its log), and so
/// is curl without a certificate, while curl with one reaches the worker.
#[test]
fn a_worker_requiring_client_certificates_serves_only_the_gateway_that_has_one() {
    use std::process::{Command, Stdio};
    let dir = std::env::temp_dir().join(format!("cachet-mtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, crt, key, (client_crt, client_key)) = make_certs_with_client(&dir, "mtls");
    let wport = free_port();
    let wlog = dir.join("worker.log");
    let mut worker = cachet_tests::Proc(
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .arg("worker")
            .args(cachet_tests::SMOLLM2_CPU)
            .args(["--listen", &format!("0.0.0.0:{wport}")])
            .arg("--tls-cert")
            .arg(&crt)
            .arg("--tls-key")
            .arg(&key)
            .arg("--tls-client-ca")
            .arg(&ca)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&wlog).unwrap()))
            .spawn()
            .unwrap(),
    );
    cachet_tests::wait_proc_listening(&mut worker.0, "127.0.0.1", wport, "the worker", &wlog);
    let wurl = format!("https://127.0.0.1:{wport}");
    // curl: refused without a client certificate, served with one.
    let (ok, out) = curl(&["--cacert", ca.to_str().unwrap(), &format!("{wurl}/health")]);
    assert!(!ok, "served without a client certificate: {out}");
    let (ok, out) = curl(&[
        "--cacert",
        ca.to_str().unwrap(),
        "--cert",
        client_crt.to_str().unwrap(),
        "--key",
        client_key.to_str().unwrap(),
        &format!("{wurl}/health"),
    ]);
    assert!(ok && out.contains("ok"), "{out}");
    let cfg = dir.join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\n",
            key_hash("sk-gw")
        ),
    )
    .unwrap();
    let body = r#"{"model":"smollm2","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":8,"temperature":0}"#;
    for with_cert in [true, false] {
        let port = free_port();
        let log = dir.join(format!("gateway-{with_cert}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cachet"));
        cmd.env("CACHET_USAGE_DB", "off")
            .args(["serve", "--config", cfg.to_str().unwrap()])
            .args(["--listen", &format!("127.0.0.1:{port}"), "--worker", &wurl])
            .arg("--worker-ca-file")
            .arg(&ca)
            .args(cachet_tests::SMOLLM2_GATEWAY)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
        if with_cert {
            cmd.arg("--worker-client-cert")
                .arg(&client_crt)
                .arg("--worker-client-key")
                .arg(&client_key);
        }
        let _gateway = cachet_tests::Proc(cmd.spawn().unwrap());
        let base = format!("http://127.0.0.1:{port}");
        wait_health(&base);
        let chat = || chat_with_status(&base, "sk-gw", body);
        if with_cert {
            let t0 = Instant::now();
            loop {
                let out = chat();
                if out.contains("STATUS=200") {
                    assert!(out.contains("Paris"), "{out}");
                    break;
                }
                assert!(t0.elapsed() < Duration::from_secs(30), "{out}");
                std::thread::sleep(Duration::from_millis(300));
            }
        } else {
            std::thread::sleep(Duration::from_secs(2));
            let out = chat();
            assert!(out.contains("STATUS=503"), "{out}");
            let text = std::fs::read_to_string(&log).unwrap();
            assert!(
                text.to_lowercase().contains("certificate"),
                "the log does not say why: {text}"
            );
        }
    }
}
