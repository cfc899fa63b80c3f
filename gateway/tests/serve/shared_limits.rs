//! Two `cachet serve` replicas sharing one tenant's limits through a real Redis, behind a plain
//! TCP balancer (nginx's stream module, round robin per connection): together they admit what
//! the tenant's limit allows, not twice that; when Redis goes away each falls back to its share.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::common::*;

/// One chat request on a connection of its own (`Connection: close`); its HTTP status.
fn chat_status(addr: &str, key: &str) -> u16 {
    let body = r#"{"model":"smollm2","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}"#;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return 0;
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// nginx as a plain TCP balancer on `port` over `backends` (round robin, one connection each).
fn nginx_balancer(dir: &Path, port: u16, backends: &[u16]) -> cachet_tests::Proc {
    let servers: String = backends
        .iter()
        .map(|p| format!("    server 127.0.0.1:{p};\n"))
        .collect();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\nworker_processes 1;\npid {pid};\nerror_log {log};\nevents {{ worker_connections 1024; }}\nstream {{\n  upstream replicas {{\n{servers}  }}\n  server {{ listen 127.0.0.1:{port}; proxy_pass replicas; }}\n}}\n",
            pid = dir.join("nginx.pid").display(),
            log = dir.join("nginx.log").display(),
        ),
    )
    .unwrap();
    let p = cachet_tests::Proc(
        std::process::Command::new("nginx")
            .args(["-c", conf.to_str().unwrap(), "-g", "daemon off;"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nginx (apt install nginx-light libnginx-mod-stream; CI installs them)"),
    );
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "nginx did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    p
}

/// `cachet_requests_total{tenant, status}` on one replica's /metrics.
fn served(base: &str, tenant: &str, status: &str) -> u64 {
    let (_, m) = curl(&[&format!("{base}/metrics")]);
    let want = format!("cachet_requests_total{{tenant=\"{tenant}\",status=\"{status}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&want)?.trim().parse().ok())
        .unwrap_or(0)
}

fn metric(base: &str, name: &str) -> f64 {
    let (_, m) = curl(&[&format!("{base}/metrics")]);
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

#[test]
fn two_replicas_behind_a_tcp_balancer_admit_one_limit_between_them() {
    if !Path::new("/usr/lib/nginx/modules/ngx_stream_module.so").exists() {
        eprintln!("skipped: no nginx stream module here (apt install nginx-light libnginx-mod-stream; CI installs them)");
        return;
    }
    let Some(mut redis) = cachet_tests::RedisServer::start() else {
        eprintln!("skipped: no redis-server here (apt install redis-server; CI installs it)");
        return;
    };
    const RPM: u64 = 60;
    // The load below keeps both cores busy; a 2 s Redis timeout (default 100 ms) keeps a slow
    // moment of a loaded CI machine from counting as Redis being down. The kill below is
    // refused at once, so the fallback is still seen without waiting.
    let config = format!(
        "[[tenant]]\nid = \"capped\"\napi_key_sha256 = [\"{}\"]\nrequests_per_minute = {RPM}\n\n[shared_limits]\nredis_url = \"{}\"\nreplicas = 2\ntimeout_ms = 2000\n",
        key_hash("sk-capped"),
        redis.url
    );
    // No usage records: replicas sharing limits would need one shared store (PostgreSQL).
    let (_a, base_a) = start_with(&config, &["--usage-db", "off"]);
    let (_b, base_b) = start_with(&config, &["--usage-db", "off"]);
    let port = |b: &str| b.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let dir = std::env::temp_dir().join(format!("cachet-shared-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lb_port = cachet_tests::free_port();
    let _lb = nginx_balancer(&dir, lb_port, &[port(&base_a), port(&base_b)]);
    let lb = format!("127.0.0.1:{lb_port}");
    // OpenAI's rate-limit headers count the one bucket in Redis down, whichever replica
    // answers (alone, each replica's own share would be 30).
    for (base, left) in [(&base_a, "59"), (&base_b, "58")] {
        let (_, head) = curl(&[
            "-si",
            "-H",
            "Authorization: Bearer sk-capped",
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"model":"smollm2","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]}"#,
            &format!("{base}/v1/chat/completions"),
        ]);
        assert!(
            head.contains("x-ratelimit-limit-requests: 60\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("x-ratelimit-remaining-requests: {left}\r\n")),
            "{head}"
        );
    }
    const FIRST: u64 = 2;

    // Eight clients as fast as they can for 20 s: far over the limit (1 a second, a minute's
    // worth as burst), through the balancer — and on until the burst is spent, where a loaded
    // machine serves the admitted requests slowly (refusals come at once after that; at most
    // two minutes).
    let run = Duration::from_secs(20);
    let (ok, limited, other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (ok, limited, other, stop, lb) = (
                ok.clone(),
                limited.clone(),
                other.clone(),
                stop.clone(),
                lb.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match chat_status(&lb, "sk-capped") {
                        200 => ok.fetch_add(1, Ordering::Relaxed),
                        429 => limited.fetch_add(1, Ordering::Relaxed),
                        _ => other.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(run);
    while t0.elapsed() < Duration::from_secs(120)
        && limited.load(Ordering::Relaxed) <= 2 * ok.load(Ordering::Relaxed)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let admitted = (ok.load(Ordering::Relaxed) + FIRST) as f64;
    // The bucket: a minute's worth at once, then RPM / 60 a second.
    let allowed = RPM as f64 + RPM as f64 / 60.0 * elapsed;
    let (a_ok, b_ok) = (
        served(&base_a, "capped", "200"),
        served(&base_b, "capped", "200"),
    );
    let report = format!(
        "admitted {admitted} in {elapsed:.1} s (limit allows {allowed:.0}; replica A {a_ok}, B {b_ok}), 429 {}, other {}",
        limited.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed)
    );
    eprintln!("{report}");
    assert_eq!(other.load(Ordering::Relaxed), 0, "{report}");
    assert!(
        limited.load(Ordering::Relaxed) > 2 * admitted as u64,
        "the load was not over the limit: {report}"
    );
    // Each replica alone would admit its own minute's worth: together they hold one limit.
    assert!(
        (admitted - allowed).abs() <= 0.05 * allowed,
        "not within 5% of the limit: {report}"
    );
    assert!(
        a_ok > 0 && b_ok > 0,
        "the balancer used one replica: {report}"
    );
    assert_eq!(a_ok + b_ok, admitted as u64, "{report}");
    assert_eq!(metric(&base_a, "cachet_shared_limit_errors_total"), 0.0);
    assert_eq!(metric(&base_a, "cachet_shared_limits_up"), 1.0);

    // Redis goes away: each replica admits its share (half the limit, a fresh local bucket
    // already charged with what it admitted) and says so in /metrics.
    redis.kill();
    let statuses: Vec<u16> = (0..6).map(|_| chat_status(&lb, "sk-capped")).collect();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    for base in [&base_a, &base_b] {
        assert!(
            metric(base, "cachet_shared_limit_errors_total") >= 1.0,
            "{base}"
        );
        assert!(
            metric(base, "cachet_shared_limit_fallbacks_total") >= 1.0,
            "{base}"
        );
        assert_eq!(metric(base, "cachet_shared_limits_up"), 0.0, "{base}");
    }
}
