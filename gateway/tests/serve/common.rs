//! What the `cachet serve` tests share: a server started on SmolLM2 (CPU) with a tenants
//! config, test certificates, and small HTTP clients (curl, raw sockets).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use cachet_tests::free_port;

/// A running `cachet serve`, killed when dropped, and the scratch directory it was started with
/// (its config and usage records), removed then.
pub struct Server(pub Child, PathBuf);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// The `openai`, `prometheus_client` and `jsonschema` (the reference validator) packages,
/// pip-installed under the target directory.
pub fn openai_site() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-openai");
    cachet_tests::pip_target(
        dir,
        &["openai", "prometheus_client", "jsonschema"],
        "jsonschema",
    )
}

/// The official `anthropic` client (with `openai` and `jsonschema`) from PyPI, installed once.
pub fn anthropic_site() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-anthropic");
    cachet_tests::pip_target(dir, &["anthropic", "openai", "jsonschema"], "jsonschema")
}

/// The OpenAI Agents SDK (`openai-agents`, with its `openai`) from PyPI, installed once.
pub fn agents_site() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-agents");
    cachet_tests::pip_target(dir, &["openai-agents==0.25.0"], "agents")
}

/// Runs `tests/python/<script>` with `site` on its PYTHONPATH and `env`; asserts it exits 0 and
/// ends with "all checks passed"; returns what it printed.
pub fn python_check(script: &str, site: &std::path::Path, env: &[(&str, &str)]) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/python")
        .join(script);
    let out = Command::new("python3")
        .arg(&path)
        .env("PYTHONPATH", site)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(out.status.success(), "{script}: {text}");
    assert!(text.contains("all checks passed"), "{script}: {text}");
    text
}

/// POSTs JSON `body` to `base` + `path` with `key` as the bearer token; (status, JSON reply).
pub fn post_json(
    base: &str,
    path: &str,
    key: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let (b, auth, url) = (
        body.to_string(),
        format!("Authorization: Bearer {key}"),
        format!("{base}{path}"),
    );
    let (code, text) = cachet_tests::curl_status(&[
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        &b,
        &url,
    ]);
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{code}: {text}"));
    (code, v)
}

pub fn key_hash(key: &str) -> String {
    cachet_gateway::tenants::hex(&cachet_gateway::tenants::hash_key(key))
}

/// SmolLM2's flags for `cachet serve` with `config` (its text) and `extra` flags: a gateway with
/// upstreams and no embedded engine among them gets [`cachet_tests::SMOLLM2_GATEWAY`], others
/// [`cachet_tests::SMOLLM2_CPU`].
pub fn smollm2_serving(config: &str, extra: &[&str]) -> &'static [&'static str] {
    let remote = extra.contains(&"--worker") || config.contains("[[upstream]]");
    if remote && !config.contains("\"embedded\"") {
        cachet_tests::SMOLLM2_GATEWAY
    } else {
        cachet_tests::SMOLLM2_CPU
    }
}

/// A child process, killed when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cachet serve` and waits for its port.
pub fn start(config: &str) -> (Server, String) {
    start_with(config, &[])
}

/// Starts `cachet serve` with TLS; returns the https:// base URL.
pub fn start_tls(config: &str, cert: &std::path::Path, key: &std::path::Path) -> (Server, String) {
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

pub fn start_with(config: &str, extra: &[&str]) -> (Server, String) {
    start_under(config, extra, None, None)
}

/// Starts `cachet serve` with `extra` flags, under an open-file limit (`ulimit -n`) if given,
/// its stderr (the log) into `log` if given.
pub fn start_under(
    config: &str,
    extra: &[&str],
    open_files: Option<u32>,
    log: Option<&std::path::Path>,
) -> (Server, String) {
    cachet_tests::smollm2_path();
    let model = smollm2_serving(config, extra);
    start_model(config, model, extra, open_files, log)
}

/// Starts `cachet serve` on the model `model_args` name (`--model …` and its device flags).
pub fn start_model(
    config: &str,
    model_args: &[&str],
    extra: &[&str],
    open_files: Option<u32>,
    log: Option<&std::path::Path>,
) -> (Server, String) {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("cachet-serve-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("tenants.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut cmd = match open_files {
        // `exec` keeps the pid: the test can watch the server's own CPU time.
        Some(n) => {
            let mut c = Command::new("sh");
            c.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\"")])
                .arg(env!("CARGO_BIN_EXE_cachet"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_cachet")),
    };
    cmd.arg("serve")
        .args(model_args)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(&cfg)
        .args(extra)
        .stdout(Stdio::null());
    // Its log goes where the test asked, else beside its config: shown if it fails to start.
    let log = log.map_or_else(|| dir.join("serve.log"), PathBuf::from);
    cmd.stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    // Each server keeps its usage records in its own directory, unless the test names a store
    // (or a state directory, where the default store is).
    if !extra.contains(&"--usage-db") && !extra.contains(&"--state-dir") {
        cmd.arg("--usage-db")
            .arg(format!("sqlite:{}", dir.join("usage.db").display()));
    }
    let mut server = Server(cmd.spawn().unwrap(), dir);
    cachet_tests::wait_proc_listening(&mut server.0, "127.0.0.1", port, "cachet serve", &log);
    (server, format!("http://127.0.0.1:{port}"))
}

/// A test CA and a server certificate for localhost / 127.0.0.1 signed by it, as PEM files.
pub fn make_certs(dir: &std::path::Path, tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (ca, crt, key, _) = make_certs_with_client(dir, tag);
    (ca, crt, key)
}

/// As [`make_certs`], with a client certificate signed by the same CA (for mutual TLS):
/// (CA, server cert, server key, (client cert, client key)).
#[allow(clippy::type_complexity)]
pub fn make_certs_with_client(
    dir: &std::path::Path,
    tag: &str,
) -> (PathBuf, PathBuf, PathBuf, (PathBuf, PathBuf)) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
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
    let client_key = KeyPair::generate().unwrap();
    let mut client_params = CertificateParams::new(vec!["cachet-gateway".to_string()]).unwrap();
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = client_params.signed_by(&client_key, &issuer).unwrap();
    let (cc, ck) = (
        dir.join(format!("client-{tag}.pem")),
        dir.join(format!("client-{tag}.key")),
    );
    std::fs::write(&cc, client.pem()).unwrap();
    std::fs::write(&ck, client_key.serialize_pem()).unwrap();
    (ca, crt, k, (cc, ck))
}

pub use cachet_tests::wait_listening;

/// Waits up to two minutes until the server at `base` answers `/health`.
pub fn wait_health(base: &str) {
    let t0 = Instant::now();
    while !curl(&[&format!("{base}/health")]).0 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{base} did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A chat request to `base` as `key` (body `body`): the response body, then `STATUS=<code>`.
pub fn chat_with_status(base: &str, key: &str, body: &str) -> String {
    curl(&[
        "-H",
        &format!("Authorization: Bearer {key}"),
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
        "-w",
        "\nSTATUS=%{http_code}",
        &format!("{base}/v1/chat/completions"),
    ])
    .1
}

pub fn curl(args: &[&str]) -> (bool, String) {
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

/// Sends a raw HTTP/1.1 POST and returns the connection (the response is left to the caller).
pub fn post_raw(addr: &str, key: &str, path: &str, body: &str) -> std::net::TcpStream {
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

/// One HTTP call with curl: (status, JSON body).
pub fn http(
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
    let code = code.trim().parse().unwrap_or(0);
    let body = match serde_json::from_str(json) {
        Ok(v) => v,
        // No answer: what curl says went wrong, for the assertion's message.
        Err(_) if code == 0 => serde_json::json!({"curl": String::from_utf8_lossy(&out.stderr)}),
        Err(_) => serde_json::Value::Null,
    };
    (code, body)
}

pub fn http_json(
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

/// A TCP connection to `base` from local address `from` (any 127.x address is this machine).
pub fn connect_from(base: &str, from: &str) -> TcpStream {
    let addr: SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: IpAddr = from.parse().unwrap();
    s.bind(&SocketAddr::new(local, 0).into()).unwrap();
    s.connect(&addr.into()).unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// `GET /health` from `from`: (status line, seconds it took).
pub fn health_from(base: &str, from: &str) -> (String, f64) {
    let t0 = Instant::now();
    let mut s = connect_from(base, from);
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    (
        out.lines().next().unwrap_or("").to_string(),
        t0.elapsed().as_secs_f64(),
    )
}

/// A short chat (two tokens, greedy) for tenant `b` from `from`: seconds to the whole answer.
pub fn chat_secs(base: &str, from: &str) -> f64 {
    let body = r#"{"model":"smollm2","messages":[{"role":"user","content":"Say hi."}],"max_tokens":2,"temperature":0}"#;
    let t0 = Instant::now();
    let out = chat_closing(connect_from(base, from), "sk-b", body);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    t0.elapsed().as_secs_f64()
}

/// Sends a chat completion with `key` on `s`, asking the server to close the connection after
/// it; returns the whole response.
pub fn chat_closing(mut s: TcpStream, key: &str, body: &str) -> String {
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}
