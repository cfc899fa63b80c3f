//! The open port under pressure: graceful drain, slow and oversized heads, idle connections,
//! a full engine queue and clients that go away.

use std::process::Command;
use std::time::{Duration, Instant};

use super::common::*;

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
    let mut head = String::from_utf8_lossy(&chunk[..n]).to_string();
    assert!(head.contains("200 OK"), "{head}");
    // A's first token: A runs (not queued), so the queue's one place is B's. (The response
    // head comes before the engine takes A up.)
    while !head.contains("data:") {
        let n = a.read(&mut chunk).unwrap();
        assert!(n > 0, "A's stream ended: {head}");
        head.push_str(&String::from_utf8_lossy(&chunk[..n]));
    }
    // B waits in the engine's queue (limit 1)...
    let mut b = post_raw(
        &addr,
        "sk-queue",
        "/v1/completions",
        r#"{"model":"smollm2","prompt":"The capital of France is","max_tokens":3,"temperature":0}"#,
    );
    // (Waiting for the engine to report it queued: on a loaded machine the gateway's work on B
    // can take longer than any fixed pause.)
    let t0 = Instant::now();
    loop {
        let (_, metrics) = curl(&[&format!("{base}/metrics")]);
        let waiting = metrics
            .lines()
            .filter(|l| l.starts_with("cachet_num_requests_waiting"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>();
        if waiting >= 1.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "B never queued: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// One lane serves every connection here (`--io-threads 1`); a 600 KB prompt's normalization and
/// tokenization (seconds in a debug build) goes to the blocking pool, so `/health` on other
/// connections of that lane keeps answering at once meanwhile — a tenant's huge prompts do not
/// stall everyone else's requests on its lane.
#[test]
fn a_huge_prompt_does_not_hold_up_the_other_connections_on_its_lane() {
    use std::io::{Read, Write};
    let config = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-lane")
    );
    let (_server, base) = start_with(&config, &["--io-threads", "1"]);
    wait_health(&base);
    let addr = base.trim_start_matches("http://").to_string();
    // Not all ASCII: ASCII text takes the tokenizer's fast path (~10× faster), and this prompt
    // must take long to prepare — as a non-English one does.
    let words = [
        "routeur",
        "micrologiciel",
        "paquet",
        "le",
        "de",
        "VLAN",
        "tunnel",
        "bail",
        "réseau",
    ];
    let text: String = (0..100_000)
        .map(|i| words[(i * 7 + i / 3) % words.len()])
        .collect::<Vec<_>>()
        .join(" ");
    let body = serde_json::json!({"model": "smollm2", "max_tokens": 1,
        "messages": [{"role": "user", "content": text}]})
    .to_string();
    let big = {
        let (addr, body) = (addr.clone(), body.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut s = post_raw(&addr, "sk-lane", "/v1/chat/completions", &body);
            let mut out = String::new();
            let mut buf = [0u8; 4096];
            while !out.contains("}}") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "closed: {out}");
                out.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            (t0.elapsed(), out)
        })
    };
    let health = |addr: &str| {
        let t0 = Instant::now();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        t0.elapsed()
    };
    std::thread::sleep(Duration::from_millis(100));
    let mut answered = Vec::new();
    while !big.is_finished() {
        answered.push(health(&addr));
    }
    let (took, out) = big.join().unwrap();
    // Refused after it was tokenized: too long for SmolLM2.
    assert!(
        out.contains("400 Bad Request") && out.contains("its max_model_len"),
        "{out}"
    );
    let slowest = answered.iter().max().copied().unwrap_or_default();
    println!(
        "huge prompt answered in {took:?}; {} health checks meanwhile, slowest {slowest:?}",
        answered.len()
    );
    assert!(
        answered.len() >= 3,
        "only {} health checks answered in the {took:?} the huge prompt took",
        answered.len()
    );
    assert!(
        slowest * 4 < took,
        "a health check took {slowest:?} while the huge prompt took {took:?}: the lane was held"
    );
}
