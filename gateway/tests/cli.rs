//! The `cachet` command as a user runs it.

use std::process::Command;

use cachet_tests::{fixtures, ids_of, read_json, smollm2_path};

fn cachet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn help_explains_every_subcommand() {
    let out = cachet(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for sub in ["generate", "logits", "model", "kernels"] {
        assert!(text.contains(sub), "{text}");
    }
    for sub in [
        &["generate", "--help"][..],
        &["logits", "--help"],
        &["model", "fetch", "--help"],
        &["kernels", "build", "--help"],
    ] {
        let out = cachet(sub);
        assert!(out.status.success(), "{sub:?}");
        assert!(
            String::from_utf8(out.stdout).unwrap().contains("--"),
            "{sub:?}"
        );
    }
}

/// A case of tiny-gqa-llama3's transformers reference: it, its prompt ids, and them as `--ids`.
fn reference_case() -> (serde_json::Value, Vec<u32>, String) {
    let reference = read_json("tiny-gqa-llama3_reference.json");
    let case = reference["cases"][2].clone();
    let ids = ids_of(&case["ids"]);
    let arg = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    (case, ids, arg)
}

#[test]
fn logits_prints_transformers_top_k_as_json() {
    let (case, _, ids_arg) = reference_case();
    let dir = fixtures().join("tiny-gqa-llama3");
    let out = cachet(&[
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--ids",
        &ids_arg,
        "--top",
        "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let last: Vec<f64> = case["logits"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let mut order: Vec<usize> = (0..last.len()).collect();
    order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
    let got = got.as_array().unwrap();
    assert_eq!(got.len(), 3);
    for (rank, g) in got.iter().enumerate() {
        let id = g["id"].as_u64().unwrap() as usize;
        assert_eq!(id, order[rank]);
        assert!((g["logit"].as_f64().unwrap() - last[id]).abs() < 1e-3);
    }
}

#[test]
fn logits_of_the_last_rows_as_one_step_match_transformers() {
    // The last three tokens as one step after the rest is prefilled (a verification step's
    // shape): each row's logits are transformers' at that position.
    let (case, ids, ids_arg) = reference_case();
    let model = fixtures().join("tiny-gqa-llama3");
    let dump = std::env::temp_dir().join(format!("cachet-rows-{}.f32", std::process::id()));
    let run = |rows: &str| {
        cachet(&[
            "logits",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            &ids_arg,
            "--decode-last",
            rows,
            "--dump",
            dump.to_str().unwrap(),
        ])
    };
    let out = run("3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<f32> = std::fs::read(&dump)
        .unwrap()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want = case["logits"].as_array().unwrap();
    let vocab = got.len() / 3;
    assert_eq!(got.len(), 3 * vocab);
    for (r, row) in got.chunks(vocab).enumerate() {
        let w = want[want.len() - 3 + r].as_array().unwrap();
        assert_eq!(w.len(), vocab);
        for (g, w) in row.iter().zip(w) {
            assert!((*g as f64 - w.as_f64().unwrap()).abs() < 1e-3, "row {r}");
        }
    }
    for bad in ["0", &(ids.len() + 1).to_string()] {
        let out = run(bad);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("give 1 to the prompt's length"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_file(dump);
}

#[test]
fn generate_streams_the_answer() {
    let model = smollm2_path();
    let out = cachet(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "16",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8(out.stdout).unwrap().contains("Paris"));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = fixtures().join("tiny-gqa-llama3");
    let out = cachet(&[
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--ids",
        "1,99999",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside the vocabulary"));
    let out = cachet(&["generate", "--model", "/no/such/model", "--prompt", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let out = cachet(&["model", "fetch", "gpt-17"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        text.contains("neither a Hugging Face id") && text.contains("smollm2"),
        "{text}"
    );
    // --tokenizer with a real model is refused, not ignored.
    let out = cachet(&[
        "worker",
        "--model",
        dir.to_str().unwrap(),
        "--tokenizer",
        "smollm2",
        "--device",
        "cpu",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tokenizer smollm2 is for --load-format dummy"),
        "{err}"
    );
    // A bad --speculative-config is refused before any model is loaded, saying what to fix.
    for (cfg, says) in [
        ("{\"method\": \"eagle\"}", "use \"ngram\""),
        (
            "{\"num_speculative_tokens\": 99}",
            "num_speculative_tokens must be",
        ),
        ("{\"lookahead\": 3}", "unknown field"),
        ("ngram", "must be a JSON object"),
    ] {
        let out = cachet(&[
            "worker",
            "--model",
            "/no/such/model",
            "--speculative-config",
            cfg,
        ]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{cfg}: {err}");
    }
    // A worker reachable from other machines must have a token: refused before loading anything.
    let out = cachet(&[
        "worker",
        "--model",
        "/no/such/model",
        "--listen",
        "0.0.0.0:0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--auth-token"), "{err}");
    // A worker URL the gateway's client cannot reach, or a CA file it cannot use, is refused at
    // start, not on every request after it.
    let config = std::env::temp_dir().join(format!("cachet-cli-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    for (flags, says) in [
        (
            &["--worker", "127.0.0.1:9"][..],
            "not an http:// or https:// URL",
        ),
        (
            &[
                "--worker",
                "http://127.0.0.1:9",
                "--worker-ca-file",
                "/no/such/ca.pem",
            ],
            "is for https:// upstreams",
        ),
        (
            &[
                "--worker",
                "https://127.0.0.1:9",
                "--worker-ca-file",
                "/no/such/ca.pem",
            ],
            "/no/such/ca.pem",
        ),
    ] {
        let mut args = vec![
            "serve",
            "--model",
            "/no/such/model",
            "--config",
            config.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let out = cachet(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--worker") && err.contains(says),
            "{flags:?}: {err}"
        );
    }
    std::fs::remove_file(&config).ok();
}

/// Without chunked prefill a step holds a whole prompt: a step token limit set below the longest
/// prompt the server accepts is refused at start-up, naming both flags (left as it was, a longer
/// prompt would wait forever).
#[test]
fn unchunked_steps_shorter_than_the_longest_prompt_are_refused() {
    use std::io::Read;
    cachet_tests::smollm2_path();
    let cfg = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/configs/small-gqa-d64.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args([
            "worker",
            "--model",
            cfg.to_str().unwrap(),
            "--load-format",
            "dummy",
            "--tokenizer",
            "smollm2",
            "--device",
            "cpu",
            "--listen",
            "127.0.0.1:0",
            "--enable-chunked-prefill",
            "false",
            "--max-num-batched-tokens",
            "64",
            "--max-model-len",
            "128",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the worker started instead of refusing the limits");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("--max-num-batched-tokens 64 is below --max-model-len 128"),
        "{err}"
    );
}

/// The TTFT experiment's machinery end to end at toy scale (a random 2-layer model on the CPU):
/// servers per configuration, the server-side split in every record, the report and the plots.
/// (The numbers themselves come from the H200: BENCHMARKS.md.)
#[test]
fn the_ttft_experiment_runs_and_writes_its_report() {
    cachet_tests::smollm2_path();
    let out = std::env::temp_dir().join(format!("cachet-ttft-{}", std::process::id()));
    let cfg = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/configs/small-gqa-d64.json");
    let o = cachet(&[
        "bench",
        "ttft",
        "--model",
        cfg.to_str().unwrap(),
        "--device",
        "cpu",
        "--gpu-memory-utilization",
        "0.05",
        "--requests",
        "8",
        "--load",
        "2",
        "--max-tokens",
        "4",
        "--warmup",
        "2",
        "--configs",
        "baseline,all-on",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("All on vs baseline, cold") && report.contains("| all-on | warm |"),
        "{report}"
    );
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let runs = raw["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    // --load: the baseline's capacity was measured first and the rate is twice it (rounded).
    let capacity = raw["baseline_capacity_rps"].as_f64().unwrap();
    let rate = raw["rate_rps"].as_f64().unwrap();
    assert!(
        capacity > 0.0 && (rate - 2.0 * capacity).abs() <= 0.051,
        "{capacity} {rate}"
    );
    assert!(
        report.contains("× the baseline's capacity, measured first"),
        "{report}"
    );
    let hit = |i: usize| {
        let r = runs[i]["records"].as_array().unwrap();
        assert!(r.iter().all(|x| x["error"].is_null()), "{r:?}");
        assert!(r
            .iter()
            .all(|x| x["prefill_ms"].as_f64().unwrap() > 0.0 && x["output_tokens"] == 4));
        r.iter()
            .map(|x| x["cached_tokens"].as_u64().unwrap())
            .sum::<u64>()
    };
    // The baseline caches nothing; all-on (normalization + prefix cache) reuses the shared prefix.
    assert_eq!(hit(0) + hit(1), 0);
    assert!(hit(3) > 0);
    for f in ["ttft-cdf-cold.svg", "ttft-cdf-warm.svg", "ttft-parts.svg"] {
        assert!(std::fs::read_to_string(out.join(f))
            .unwrap()
            .contains("</svg>"));
    }
}

/// `cachet bench forward` over tensor-parallel ranks (the CPU's here) with dummy weights made
/// split: it runs its decode and prefill rows, timing the ranks' all-reduces on the way.
#[test]
fn bench_forward_runs_a_model_split_over_ranks() {
    let config = fixtures().join("../../examples/configs/tiny-mha-tied.json");
    let out = cachet(&[
        "bench",
        "forward",
        "--model",
        config.to_str().unwrap(),
        "--load-format",
        "dummy",
        "--device",
        "cpu",
        "--tensor-parallel-size",
        "2",
        "--decode-contexts",
        "32",
        "--decode-batches",
        "2",
        "--decode-context",
        "32",
        "--prefill",
        "32",
        "--cached-prefix",
        "0:0",
        "--sampling-batches",
        "1",
        "--graph-batches",
        "1",
        "--max-model-len",
        "256",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "decode batch 1, ctx 32",
        "decode batch 2, ctx 32",
        "prefill 32 tokens",
    ] {
        assert!(text.contains(row), "{row}: {text}");
    }
}

/// `cachet kernels build` compiles into the cache a start reads (NVRTC from PyPI, no GPU), and
/// finds them there the next time; a malformed architecture is refused.
#[test]
fn kernels_build_fills_the_kernel_cache_ahead_of_a_start() {
    let site = cachet_tests::pip_target(
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvrtc-pip"),
        &["nvidia-cuda-nvrtc==13.0.*"],
        "nvidia/cu13/lib/libnvrtc.so.13",
    );
    let cache = std::env::temp_dir().join(format!("cachet-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let build = |arch: &str| {
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .args(["kernels", "build", "--arch", arch])
            .env("CACHET_CACHE_DIR", &cache)
            .env("LD_LIBRARY_PATH", site.join("nvidia/cu13/lib"))
            .output()
            .unwrap()
    };
    let out = build("sm_90");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && text.contains("sm_90: compiled in"),
        "{text}"
    );
    let cubins: Vec<String> = std::fs::read_dir(cache.join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        cubins.len() == 1 && cubins[0].contains("-sm_90-") && cubins[0].ends_with(".cubin"),
        "{cubins:?}"
    );
    let out = build("sm_90");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && text.contains("sm_90: already in"),
        "{text}"
    );
    let out = build("90");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("e.g. sm_90"));
    let _ = std::fs::remove_dir_all(&cache);
}
