//! `/ready` means ready: 200 while every model has a healthy upstream, 503 naming the model that
//! has none (its only worker not answering) while `/health` (the process is up) stays 200, and
//! 200 again once the worker answers.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cachet_tests::curl_status;

use super::common::*;

#[test]
fn ready_only_while_every_model_has_a_healthy_upstream() {
    // Over its own engine: ready.
    let config = format!(
        "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-r")
    );
    let (server, base) = start(&config);
    let (code, body) = curl_status(&[&format!("{base}/ready")]);
    assert_eq!(code, 200, "{body}");
    drop(server);
    // Over one worker that is not there yet: up, but not ready.
    let wport = free_port();
    let (_gateway, base) = start_with(&config, &["--worker", &format!("http://127.0.0.1:{wport}")]);
    let (code, _) = curl_status(&[&format!("{base}/health")]);
    assert_eq!(code, 200);
    let (code, body) = curl_status(&[&format!("{base}/ready")]);
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("\"models_without_upstream\":[\"smollm2\"]"),
        "{body}"
    );
    // The worker starts: ready once its health check answers.
    let dir = std::env::temp_dir().join(format!("cachet-ready-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("worker.log");
    let mut worker = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .arg("worker")
        .args(cachet_tests::SMOLLM2_CPU)
        .args(["--listen", &format!("127.0.0.1:{wport}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    cachet_tests::wait_proc_listening(&mut worker, "127.0.0.1", wport, "cachet worker", &log);
    let _worker = KillOnDrop(worker);
    let t0 = Instant::now();
    loop {
        let (code, body) = curl_status(&[&format!("{base}/ready")]);
        if code == 200 {
            assert!(body.contains("\"healthy\":1"), "{body}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never ready: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
