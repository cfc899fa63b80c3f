//! `cachet worker`: token ids in, the in-process engine's tokens out; KV events that name
//! exactly the block hashes the gateway computes with the shared deployment key.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cachet_backend::block_hash::HashContext;
use cachet_backend::engine::EngineConfig;
use cachet_gateway::protocol::{GenerateRequest, KvWire, StateReply, WireEvent};
use cachet_tests::{curl_status, free_port, Proc};

#[test]
fn a_worker_generates_the_engines_tokens_and_reports_its_blocks_exactly() {
    cachet_tests::smollm2_path();
    let key = [7u8; 32];
    let dir = std::env::temp_dir().join(format!("cachet-worker-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("hash.key");
    std::fs::write(&key_file, cachet_gateway::tenants::hex(&key)).unwrap();
    let port = free_port();
    let log = dir.join("worker.log");
    let mut w = Proc(
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .arg("worker")
            .args(cachet_tests::SMOLLM2_CPU)
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--auth-token",
                "tok",
            ])
            .arg("--hash-key-file")
            .arg(&key_file)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap(),
    );
    cachet_tests::wait_proc_listening(&mut w.0, "127.0.0.1", port, "the worker", &log);
    let base = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    while curl_status(&[&format!("{base}/health")]).0 != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the worker listens but is not healthy"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let auth = "authorization: Bearer tok";
    // Auth, state, key id.
    assert_eq!(curl_status(&[&format!("{base}/v1/state")]).0, 401);
    let (code, body) = curl_status(&["-H", auth, &format!("{base}/v1/state")]);
    assert_eq!(code, 200, "{body}");
    let st: StateReply = serde_json::from_str(&body).unwrap();
    assert_eq!(st.model, "smollm2");
    assert_eq!(st.key_id, cachet_gateway::worker::key_id(&key));
    assert_eq!(st.block_size, 16);
    // Follow the KV events from here on.
    let mut events = Proc(
        Command::new("curl")
            .args(["-sSN", "-H", auth, &format!("{base}/v1/kv_events")])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (etx, erx) = std::sync::mpsc::channel::<KvWire>();
    let out = events.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if etx.send(serde_json::from_str(&line).unwrap()).is_err() {
                return;
            }
        }
    });
    match erx.recv_timeout(Duration::from_secs(10)).unwrap() {
        KvWire::Snapshot { blocks, .. } => assert!(blocks.is_empty()),
        other => panic!("the stream must open with a snapshot, got {other:?}"),
    }
    // Generate greedily from token ids.
    let m = cachet_tests::smollm2();
    let tok = m.tokenizer.clone().unwrap();
    let prompt = tok
        .encode(
            &tok.render_chat(
                &[cachet_backend::tokenizer::ChatMessage::new(
                    "user",
                    "What is the capital of France? Answer in one short sentence, please.",
                )],
                true,
            )
            .unwrap(),
        )
        .unwrap();
    let salt = [3u8; 32];
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: 12,
        sampling: Default::default(),
        constraint: None,
        stop: vec![],
        stop_token_ids: vec![],
        ignore_eos: true,
        salt: cachet_gateway::tenants::hex(&salt),
        public_blocks: 0,
        priority: 0,
        tag: "t".into(),
        share: 1.0,
        timeout_ms: Some(120_000),
    };
    let body = serde_json::to_string(&req).unwrap();
    let (code, out) = curl_status(&["-H", auth, "-d", &body, &format!("{base}/v1/generate")]);
    assert_eq!(code, 200, "{out}");
    let wire: Vec<WireEvent> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<u32> = wire
        .iter()
        .filter_map(|e| match e {
            WireEvent::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    match wire.last().unwrap() {
        WireEvent::Finished { usage, .. } => {
            assert_eq!(
                (usage.prompt_tokens, usage.completion_tokens),
                (prompt.len(), 12)
            )
        }
        other => panic!("{other:?}"),
    }
    // The same tokens as the engine in-process.
    let e = cachet_tests::engine(
        cachet_tests::DeviceKind::Cpu,
        m,
        64,
        EngineConfig::default(),
    );
    let mut r = cachet_tests::greedy_request(prompt.clone(), 12);
    r.ignore_eos = true;
    let local = cachet_tests::collect(e.handle().submit(r).unwrap());
    assert_eq!(ids, local.tokens);
    // The stored blocks are the hashes of the prompt's (and output's) full blocks, computed here
    // with the shared key and the tenant's salt.
    let want = HashContext::new(key, salt, "smollm2", 16).hash_all(&prompt);
    let mut stored = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while want.iter().any(|h| !stored.contains(&h.to_hex())) {
        let left = deadline.saturating_duration_since(Instant::now());
        match erx.recv_timeout(left) {
            Ok(KvWire::Stored { blocks, .. }) => stored.extend(blocks),
            Ok(_) => {}
            Err(_) => panic!("missing stored blocks; got {stored:?}"),
        }
    }
    a_new_subscribers_snapshot_holds(&base, auth, &want);
    bad_input_gets_clear_errors(&base, auth, req);
}

/// A new subscriber to the worker's KV events gets a snapshot holding `want`.
fn a_new_subscribers_snapshot_holds(
    base: &str,
    auth: &str,
    want: &[cachet_backend::block_hash::BlockHash],
) {
    let (code, snap) = curl_status(&[
        "-H",
        auth,
        "--max-time",
        "2",
        &format!("{base}/v1/kv_events"),
    ]);
    assert!(code == 200 || code == 0, "{code}");
    let first: KvWire = serde_json::from_str(snap.lines().next().unwrap()).unwrap();
    match first {
        KvWire::Snapshot { blocks, .. } => {
            for h in want {
                assert!(blocks.contains(&h.to_hex()));
            }
        }
        other => panic!("{other:?}"),
    }
}

/// Bad input to `/v1/generate` gets a 400 that names what to fix; `req` is a good request.
fn bad_input_gets_clear_errors(base: &str, auth: &str, req: GenerateRequest) {
    let (code, out) = curl_status(&[
        "-H",
        auth,
        "-d",
        "{not json",
        &format!("{base}/v1/generate"),
    ]);
    assert_eq!(code, 400, "{out}");
    let mut bad = req.clone();
    bad.salt = "abc".into();
    let (code, out) = curl_status(&[
        "-H",
        auth,
        "-d",
        &serde_json::to_string(&bad).unwrap(),
        &format!("{base}/v1/generate"),
    ]);
    assert!(code == 400 && out.contains("salt"), "{code} {out}");
    let send = |bad: &GenerateRequest| {
        curl_status(&[
            "-H",
            auth,
            "-d",
            &serde_json::to_string(bad).unwrap(),
            &format!("{base}/v1/generate"),
        ])
    };
    let mut bad = req.clone();
    bad.prompt = vec![];
    let (code, out) = send(&bad);
    assert!(code == 400 && out.contains("no tokens"), "{code} {out}");
    // Every number in range: max_tokens = usize::MAX is refused with the model's length (it
    // used to wrap into a small total), and so are absurd lists and a zero timeout.
    let mut bad = req.clone();
    bad.max_tokens = usize::MAX;
    let (code, out) = send(&bad);
    assert!(
        code == 400 && out.contains("exceeds max_model_len"),
        "{code} {out}"
    );
    let mut bad = req.clone();
    bad.stop = (0..17).map(|i| format!("s{i}")).collect();
    let (code, out) = send(&bad);
    assert!(
        code == 400 && out.contains("stop takes up to 16"),
        "{code} {out}"
    );
    let mut bad = req.clone();
    bad.stop_token_ids = vec![1; 257];
    let (code, out) = send(&bad);
    assert!(
        code == 400 && out.contains("stop_token_ids"),
        "{code} {out}"
    );
    let mut bad = req.clone();
    bad.tag = "t".repeat(300);
    let (code, out) = send(&bad);
    assert!(code == 400 && out.contains("tag"), "{code} {out}");
    let mut bad = req;
    bad.timeout_ms = Some(0);
    let (code, out) = send(&bad);
    assert!(code == 400 && out.contains("timeout_ms"), "{code} {out}");
}
