//! Workers found by DNS: `cachet serve` with an upstream named by a DNS name (`dns = true`),
//! resolved by a real DNS server (dnsmasq, from Debian) whose records the test changes: each
//! address joins the pool once its worker answers its health check, an address no longer
//! resolved leaves, one whose worker is not up never joins until it is — and requests keep
//! being served throughout.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cachet_tests::{free_port, Proc};

const NAME: &str = "workers.cachet.test";

fn worker(ip: &str, port: u16) -> Proc {
    let log = std::env::temp_dir().join(format!(
        "cachet-discovery-{}-{ip}-{port}.log",
        std::process::id()
    ));
    let mut p = Proc(
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .arg("worker")
            .args(cachet_tests::SMOLLM2_CPU)
            .args(["--listen", &format!("{ip}:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap(),
    );
    cachet_tests::wait_proc_listening(&mut p.0, ip, port, "a worker", &log);
    p
}

/// The pool's members as the gateway's /metrics lists them (`cachet_worker_inflight_requests`).
fn members(base: &str) -> Vec<String> {
    let (_, m) = cachet_tests::curl_status(&[&format!("{base}/metrics")]);
    let mut v: Vec<String> = m
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cachet_worker_inflight_requests{worker=\"")?;
            Some(rest.split('"').next()?.to_string())
        })
        .collect();
    v.sort();
    v
}

fn wait_members(base: &str, want: &[String]) {
    let t0 = Instant::now();
    loop {
        let got = members(base);
        if got == want {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "members {got:?}, waiting for {want:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn chat_ok(base: &str) {
    let (status, body) = cachet_tests::curl_status(&[
        "-H",
        "authorization: Bearer sk-dns",
        "-d",
        r#"{"model": "smollm2", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}"#,
        &format!("{base}/v1/chat/completions"),
    ]);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn workers_named_by_dns_join_after_their_health_check_and_leave_when_gone() {
    let Some(dnsmasq) = ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        eprintln!("skipped: no dnsmasq here (apt install dnsmasq-base; CI installs it)");
        return;
    };
    cachet_tests::smollm2_path();
    let dir = std::env::temp_dir().join(format!("cachet-dns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let hosts = dir.join("hosts");
    let set_hosts = |ips: &[&str]| {
        let text: String = ips.iter().map(|ip| format!("{ip} {NAME}\n")).collect();
        std::fs::write(&hosts, text).unwrap();
    };
    // Two workers on one port, at two loopback addresses.
    let wport = free_port();
    let _w1 = worker("127.0.0.1", wport);
    let _w2 = worker("127.0.0.2", wport);
    set_hosts(&["127.0.0.1", "127.0.0.2"]);
    let dport = free_port();
    let dns = Proc(
        Command::new(dnsmasq)
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
            ])
            .args([
                "--listen-address=127.0.0.1",
                "--local-ttl=0",
                "--log-facility=-",
            ])
            .arg(format!("--port={dport}"))
            .arg(format!("--addn-hosts={}", hosts.display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let reload = || {
        // dnsmasq re-reads its hosts files on SIGHUP.
        assert!(Command::new("kill")
            .args(["-HUP", &dns.0.id().to_string()])
            .status()
            .unwrap()
            .success());
    };
    let cfg = dir.join("gateway.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\n\n[discovery]\nnameserver = \"127.0.0.1:{dport}\"\n\n[[upstream]]\nkind = \"cachet\"\nurl = \"http://{NAME}:{wport}\"\ndns = true\ndns_refresh_secs = 1\n",
            cachet_gateway::tenants::hex(&cachet_gateway::tenants::hash_key("sk-dns"))
        ),
    )
    .unwrap();
    let gport = free_port();
    let glog = std::env::temp_dir().join(format!(
        "cachet-discovery-{}-gateway.log",
        std::process::id()
    ));
    let mut gateway = Proc(
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .env("CACHET_USAGE_DB", "off")
            .args(["serve", "--config", cfg.to_str().unwrap()])
            .args(cachet_tests::SMOLLM2_GATEWAY)
            .args(["--listen", &format!("127.0.0.1:{gport}")])
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&glog).unwrap()))
            .spawn()
            .unwrap(),
    );
    cachet_tests::wait_proc_listening(&mut gateway.0, "127.0.0.1", gport, "the gateway", &glog);
    let base = format!("http://127.0.0.1:{gport}");
    let url = |ip: &str| format!("http://{ip}:{wport}");

    // Both addresses, each with a worker answering: both join.
    wait_members(&base, &[url("127.0.0.1"), url("127.0.0.2")]);
    chat_ok(&base);

    // One address gone from DNS: it leaves; requests go on.
    set_hosts(&["127.0.0.1"]);
    reload();
    wait_members(&base, &[url("127.0.0.1")]);
    chat_ok(&base);

    // A new address with no worker yet: found, but it joins only once its health check answers.
    set_hosts(&["127.0.0.1", "127.0.0.3"]);
    reload();
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(members(&base), vec![url("127.0.0.1")]);
    chat_ok(&base);
    let _w3 = worker("127.0.0.3", wport);
    wait_members(&base, &[url("127.0.0.1"), url("127.0.0.3")]);
    chat_ok(&base);
}
