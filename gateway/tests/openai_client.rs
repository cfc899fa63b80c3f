//! `cachet serve` (SmolLM2 on the CPU) against the official `openai` Python client, installed from
//! PyPI under the target directory on first use.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use cachet_tests::free_port;

/// The `openai` and `prometheus_client` packages, pip-installed under the target directory.
fn openai_site() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-openai");
    cachet_tests::pip_target(dir, &["openai", "prometheus_client"], "prometheus_client")
}

fn key_hash(key: &str) -> String {
    cachet_gateway::tenants::hex(&cachet_gateway::tenants::hash_key(key))
}

/// Starts `cachet serve` and waits for its port.
fn start(config: &str) -> (Server, String) {
    start_with(config, &[])
}

/// Starts `cachet serve` with TLS; returns the https:// base URL.
fn start_tls(config: &str, cert: &std::path::Path, key: &std::path::Path) -> (Server, String) {
    let (server, base) = start_with(
        config,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    (server, base.replace("http://", "https://"))
}

fn start_with(config: &str, extra: &[&str]) -> (Server, String) {
    cachet_tests::smollm2_path();
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("cachet-serve-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("tenants.toml");
    std::fs::write(&cfg, config).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args([
            "serve",
            "--model",
            "smollm2",
            "--device",
            "cpu",
            "--gpu-memory-utilization",
            "0.1",
            "--listen",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(&cfg)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let base = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "cachet serve did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, base)
}

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

#[test]
fn sigterm_drains_streams_in_flight_and_refuses_new_connections() {
    use std::io::{Read, Write};
    let config = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-drain")
    );
    let (mut server, base) = start(&config);
    let addr = base.trim_start_matches("http://").to_string();
    let body = r#"{"model":"smollm2","messages":[{"role":"user","content":"Tell me a long story."}],"max_tokens":64,"temperature":0,"stream":true}"#;
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer sk-drain\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Wait for the first streamed bytes, then ask the server to stop.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data: ") {
        let n = conn.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "connection closed before streaming: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    let st = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    // New connections are refused once the listener is closed.
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&addr).is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "still accepting after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The stream in flight runs to its end.
    loop {
        let n = conn.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&got).contains("data: [DONE]") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.contains("\"finish_reason\":\"length\"")
            || text.contains("\"finish_reason\":\"stop\""),
        "the stream finished: {text}"
    );
    assert!(text.contains("data: [DONE]"));
    let status = server.0.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// A test CA and a server certificate for localhost / 127.0.0.1 signed by it, as PEM files.
fn make_certs(dir: &std::path::Path, tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("cachet test CA {tag}"));
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (ca, crt, k) = (
        dir.join(format!("ca-{tag}.pem")),
        dir.join(format!("server-{tag}.pem")),
        dir.join(format!("server-{tag}.key")),
    );
    std::fs::write(&ca, ca_cert.pem()).unwrap();
    std::fs::write(&crt, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (ca, crt, k)
}

fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "60"])
        .args(args)
        .output()
        .expect("curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

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

#[test]
fn slow_and_oversized_request_heads_are_cut_off() {
    use std::io::{Read, Write};
    let config = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-limits")
    );
    let (_server, base) = start_with(
        &config,
        &["--header-read-timeout", "1", "--max-header-bytes", "16384"],
    );
    let addr = base.trim_start_matches("http://").to_string();
    // Slowloris: half a request head, then silence. The server closes the connection.
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let t0 = Instant::now();
    let mut buf = Vec::new();
    let _ = slow.read_to_end(&mut buf);
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "slow client kept for {:?}",
        t0.elapsed()
    );
    assert!(
        !String::from_utf8_lossy(&buf).contains("200 OK"),
        "{}",
        String::from_utf8_lossy(&buf)
    );
    // An oversized head gets 431 (or the connection is closed), and the server keeps serving.
    let mut big = std::net::TcpStream::connect(&addr).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let filler = "a".repeat(64 * 1024);
    let _ = big.write_all(
        format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\n\r\n").as_bytes(),
    );
    let mut resp = Vec::new();
    let _ = big.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    assert!(
        !text.contains("200 OK"),
        "an oversized head was served: {text}"
    );
    let (ok, out) = curl(&[&format!("{base}/health")]);
    assert!(ok && out.contains("ok"), "{out}");
}

#[test]
fn idle_connections_are_closed_but_quiet_requests_are_not() {
    use std::io::{Read, Write};
    let config = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-idle")
    );
    let (_server, base) = start_with(
        &config,
        &["--idle-timeout", "1", "--header-read-timeout", "30"],
    );
    let addr = base.trim_start_matches("http://").to_string();
    // An HTTP/2 connection (prior knowledge) that only says hello: no header-read timer applies
    // here, so it is the idle timeout that ends it, with a GOAWAY frame, about a second later
    // (and this peer, which never answers the GOAWAY's PING, is dropped a second after that).
    let mut idle = std::net::TcpStream::connect(&addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .unwrap();
    let t0 = Instant::now();
    let mut got = Vec::new();
    let _ = idle.read_to_end(&mut got);
    let waited = t0.elapsed();
    assert!(
        waited > Duration::from_millis(700) && waited < Duration::from_secs(10),
        "idle HTTP/2 connection closed after {waited:?}"
    );
    // Frames: 3-byte length, 1-byte type; GOAWAY is type 7.
    let mut types = Vec::new();
    let mut at = 0;
    while at + 9 <= got.len() {
        let len = (got[at] as usize) << 16 | (got[at + 1] as usize) << 8 | got[at + 2] as usize;
        types.push(got[at + 3]);
        at += 9 + len;
    }
    assert!(types.contains(&7), "no GOAWAY among frames {types:?}");
    // A request that stays quiet for longer than the idle timeout (a non-streaming generation)
    // is not cut.
    let body =
        r#"{"model":"smollm2","prompt":"1, 2, 3, 4, 5, 6,","max_tokens":80,"temperature":0}"#;
    let t0 = Instant::now();
    let (ok, out) = curl(&[
        "--http2-prior-knowledge",
        "-H",
        "authorization: Bearer sk-idle",
        "-H",
        "content-type: application/json",
        "-d",
        body,
        &format!("{base}/v1/completions"),
    ]);
    let took = t0.elapsed();
    assert!(ok && out.contains("\"completion_tokens\":80"), "{out}");
    assert!(
        took > Duration::from_millis(1200),
        "the generation took only {took:?}; the test needs one longer than the idle timeout"
    );
}

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

/// Sends a raw HTTP/1.1 POST and returns the connection (the response is left to the caller).
fn post_raw(addr: &str, key: &str, path: &str, body: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

#[test]
fn a_full_engine_queue_gets_503_and_a_disconnect_cancels_at_once() {
    use std::io::Read;
    let config = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-queue")
    );
    let (_server, base) = start_with(&config, &["--max-num-seqs", "1", "--max-waiting", "1"]);
    let addr = base.trim_start_matches("http://").to_string();
    // A: a long stream occupies the only engine slot (500 tokens: ~20 s on 2 cores).
    let mut a = post_raw(
        &addr,
        "sk-queue",
        "/v1/completions",
        r#"{"model":"smollm2","prompt":"1, 2, 3, 4, 5, 6,","max_tokens":500,"temperature":0,"stream":true}"#,
    );
    let mut chunk = [0u8; 4096];
    let n = a.read(&mut chunk).unwrap();
    assert!(
        String::from_utf8_lossy(&chunk[..n]).contains("200 OK"),
        "{}",
        String::from_utf8_lossy(&chunk[..n])
    );
    // B waits in the engine's queue (limit 1)...
    let mut b = post_raw(
        &addr,
        "sk-queue",
        "/v1/completions",
        r#"{"model":"smollm2","prompt":"The capital of France is","max_tokens":3,"temperature":0}"#,
    );
    std::thread::sleep(Duration::from_millis(500));
    // ...so C is refused at once with 503, Retry-After and OpenAI's error shape.
    let out = Command::new("curl")
        .args([
            "-sS",
            "-i",
            "--max-time",
            "30",
            "-H",
            "authorization: Bearer sk-queue",
        ])
        .args(["-H", "content-type: application/json", "-d"])
        .arg(r#"{"model":"smollm2","prompt":"Hello","max_tokens":3}"#)
        .arg(format!("{base}/v1/completions"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 503"), "{text}");
    assert!(text.contains("retry-after: "), "{text}");
    assert!(text.contains("\"code\":\"overloaded\""), "{text}");
    // A's client goes away: its request is cancelled at once, so B (which could not start while
    // A held the only slot) finishes long before A's 500 tokens would have.
    drop(a);
    let t0 = Instant::now();
    let mut resp = Vec::new();
    while !String::from_utf8_lossy(&resp).contains("\"usage\"") {
        let n = b.read(&mut chunk).unwrap();
        assert!(n > 0, "B's connection closed early");
        resp.extend_from_slice(&chunk[..n]);
    }
    let waited = t0.elapsed();
    assert!(
        String::from_utf8_lossy(&resp).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    assert!(
        waited < Duration::from_secs(8),
        "B waited {waited:?} after A's client left"
    );
}

/// One HTTP call with curl: (status, JSON body).
fn http(
    method: &str,
    url: &str,
    key: &str,
    body: Option<&std::path::Path>,
) -> (u16, serde_json::Value) {
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "--max-time",
        "60",
        "-X",
        method,
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
    ])
    .args(["-H", &format!("authorization: Bearer {key}")]);
    if let Some(p) = body {
        c.arg("--data-binary").arg(format!("@{}", p.display()));
    }
    let out = c.arg(url).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (json, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(json).unwrap_or(serde_json::Value::Null),
    )
}

fn http_json(
    method: &str,
    url: &str,
    key: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let f = std::env::temp_dir().join(format!(
        "cachet-body-{}-{}.json",
        std::process::id(),
        free_port()
    ));
    std::fs::write(&f, body.to_string()).unwrap();
    let r = http(method, url, key, Some(&f));
    let _ = std::fs::remove_file(f);
    r
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
    std::fs::write(
        &looping,
        wat::parse_str(
            r#"(module (memory (export "memory") 1)
                (func (export "cachet_abi_version") (result i32) i32.const 1)
                (func (export "cachet_alloc") (param i32) (result i32) i32.const 1024)
                (func (export "cachet_render") (param i32 i32) (result i64) (loop br 0) i64.const 0))"#,
        )
        .unwrap(),
    )
    .unwrap();
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
    let (server, base) = start_with(&config, &["--templates-dir", &dir_s]);
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
    let chat = |q: &str, template: &str| {
        serde_json::json!({"model": "smollm2", "messages": [{"role": "user", "content": q}],
            "template": template, "max_tokens": 4, "temperature": 0, "user": "user-7"})
    };
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
    // Version 2 (the clock template), activated atomically.
    let (code, v) = http("PUT", &format!("{t}/support"), "adm-acme", Some(&clock));
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
    // A hostile template fails only its own request, with a clear status, and is counted.
    let (code, _) = http("PUT", &format!("{t}/loop"), "adm-acme", Some(&looping));
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
    // Templates survive a restart.
    drop(server);
    let (_server, base) = start_with(&config, &["--templates-dir", &dir_s]);
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
