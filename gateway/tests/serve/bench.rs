//! `cachet bench serve` against a real `cachet serve` (SmolLM2 on the CPU): what the load
//! generator reports agrees with what the server answered; a server that refuses every request
//! makes it fail, saying why.

use std::process::Command;

use super::common::*;

fn bench_serve(base: &str, key: &str, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args(["bench", "serve", "--base-url", base, "--api-key", key])
        .args(extra)
        .output()
        .unwrap()
}

/// `cachet serve` with one tenant, `acme`, whose key is `sk-test-acme`.
fn start_acme() -> (Server, String) {
    start(&format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-test-acme")
    ))
}

#[test]
fn bench_serve_loads_a_server_and_reports_what_it_answered() {
    let (_server, base) = start_acme();
    let json = std::env::temp_dir().join(format!("cachet-bench-serve-{}.json", std::process::id()));
    let o = bench_serve(
        &base,
        "sk-test-acme",
        &[
            "--dataset",
            "shared-prefix",
            "--num-prefixes",
            "2",
            "--prefix-len",
            "32",
            "--input-len",
            "8",
            "--output-len",
            "6",
            "--num-prompts",
            "8",
            // Two slots, four requests each back to back: each slot's kept-alive connection
            // carries its next request as soon as the last one's stream ends.
            "--max-concurrency",
            "2",
            "--ignore-eos",
            "--json-out",
            json.to_str().unwrap(),
        ],
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for line in [
        "Serving Benchmark Result",
        "Model:                                  smollm2",
        "Successful requests:                    8",
        "Total input tokens:                     320",
        "Total generated tokens:                 48",
        "Median TTFT (ms):",
        "P99 ITL (ms):",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        (v["completed"].as_u64(), v["failed"].as_u64()),
        (Some(8), Some(0))
    );
    // The server's usage counted every id of the prompt and every token asked for.
    for r in v["requests"].as_array().unwrap() {
        assert_eq!(r["prompt_tokens"], 40, "{r}");
        assert_eq!(r["completion_tokens"], 6, "{r}");
        let (ttft, e2e) = (
            r["ttft_ms"].as_f64().unwrap(),
            r["e2e_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < ttft && ttft <= e2e, "{r}");
        let gaps = r["itl_ms"].as_array().unwrap().len();
        assert!(
            (1..=5).contains(&gaps),
            "6 tokens stream in 2-6 chunks: {r}"
        );
    }
    assert!(v["tpot"]["p50_ms"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_file(&json);

    // Refused requests are counted as failed, the first one's error shown, and the run fails.
    let args = [
        "--model",
        "smollm2",
        "--num-prompts",
        "2",
        "--output-len",
        "2",
    ];
    let o = bench_serve(&base, "sk-wrong", &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("2 request(s) failed")
            && err.contains("401")
            && err.contains("no request succeeded"),
        "{err}"
    );
    // Without --model it asks /v1/models, and says what the server answered.
    let o = bench_serve(&base, "sk-wrong", &args[2..]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("/v1/models: 401"),
        "{err}"
    );
}

/// Stopped by SIGTERM (a time limit on a GPU machine), `bench serve` still reports the requests
/// that finished, marked as interrupted, instead of dying with nothing printed.
#[test]
fn bench_serve_stopped_by_sigterm_reports_what_finished() {
    let (_server, base) = start_acme();
    let json = std::env::temp_dir().join(format!("cachet-bench-term-{}.json", std::process::id()));
    let child = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args([
            "bench",
            "serve",
            "--base-url",
            &base,
            "--api-key",
            "sk-test-acme",
        ])
        .args([
            "--input-len",
            "8",
            "--output-len",
            "8",
            "--num-prompts",
            "2000",
        ])
        .args(["--max-concurrency", "2", "--ignore-eos", "--json-out"])
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Long enough for some of the 2,000 requests to finish on a slow machine, far from all.
    std::thread::sleep(std::time::Duration::from_secs(10));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let o = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("Serving Benchmark Result")
            && text.contains("Interrupted (signal): finished"),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["interrupted"], true);
    assert_eq!(v["num_prompts"], 2000);
    let done = v["completed"].as_u64().unwrap();
    assert!((1..2000).contains(&done), "{done} finished");
    assert_eq!(
        v["requests"].as_array().unwrap().len() as u64,
        done + v["failed"].as_u64().unwrap()
    );
    assert!(
        o.status.success(),
        "some requests finished: a report, exit 0"
    );
    std::fs::remove_file(&json).ok();
}
