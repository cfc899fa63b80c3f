//! The flag walk: no flag of `cachet serve`, `worker` or `generate` is accepted and ignored.
//! Every flag their `--help` lists has a place here, and the walk checks it:
//! - **proven**: a test of the suite passes the flag and asserts what it does (found by scanning
//!   the test sources for the flag, the test's name printed);
//! - **shown**: the walk starts the command with a value other than the default and reads that
//!   value in force from its start-up log (the engine's settings, its KV cache, the connection
//!   limits, the template sandbox, the gateway's settings);
//! - **refused**: in a mode that has no use for it (an engine flag on a gateway whose upstreams
//!   run the model, template limits with templates off, CUDA graph flags on the CPU, sampling
//!   flags on a greedy run…) the command stops before any work with an error naming it.
//!
//! A flag none of these places — a new one — fails the walk.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where a command runs for a check.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// `serve` over its own engine (SmolLM2 on the CPU).
    Embedded,
    /// The same with tenants' templates on (`--templates-dir`).
    Templated,
    /// `serve` whose only upstream is a `cachet worker` (no engine of its own).
    Remote,
    Worker,
    Generate,
}

/// How the walk places a flag it finds no test for.
#[derive(Clone, Copy)]
enum Place {
    /// Started in `mode` with `args`, the start-up log shows `shows`.
    Shown(Mode, &'static [&'static str], &'static str),
    /// Refused in `mode` with `args`, the error naming the flag.
    Refused(Mode, &'static [&'static str]),
}

use Mode::*;
use Place::*;

/// The flags the walk checks itself, by command.
fn places() -> BTreeMap<(&'static str, &'static str), Vec<Place>> {
    let engine = engine_places();
    let mut m = BTreeMap::new();
    for cmd in ["serve", "worker"] {
        for (f, p) in &engine {
            let p: Vec<Place> = p
                .iter()
                .map(|p| match (*p, cmd) {
                    (Shown(Worker, a, s), "serve") => Shown(Embedded, a, s),
                    (Refused(Worker, a), "serve") => Refused(Embedded, a),
                    (p, _) => p,
                })
                .collect();
            m.insert((cmd, *f), p);
        }
    }
    // The gateway's own: refused where unused, shown where used.
    let serve: Vec<(&str, Vec<Place>)> = vec![
        (
            "--worker-token",
            vec![Refused(Embedded, &["--worker-token", "t"])],
        ),
        (
            "--worker-ca-file",
            vec![Refused(Remote, &["--worker-ca-file", "/etc/hostname"])],
        ),
        (
            "--request-timeout",
            vec![Shown(
                Embedded,
                &["--request-timeout", "77"],
                "request_timeout_s=77",
            )],
        ),
        (
            "--upstream-first-event-timeout",
            vec![
                Refused(Embedded, &["--upstream-first-event-timeout", "9"]),
                Shown(
                    Remote,
                    &["--upstream-first-event-timeout", "9"],
                    "upstream_timeouts_s=[2, 5, 9, 30]",
                ),
            ],
        ),
        (
            "--upstream-idle-timeout",
            vec![
                Refused(Embedded, &["--upstream-idle-timeout", "9"]),
                Shown(
                    Remote,
                    &["--upstream-idle-timeout", "9"],
                    "upstream_timeouts_s=[2, 5, 120, 9]",
                ),
            ],
        ),
        (
            "--tool-parser",
            vec![Shown(
                Embedded,
                &["--tool-parser", "hermes"],
                "format=hermes",
            )],
        ),
        (
            "--reasoning-parser",
            vec![Shown(
                Embedded,
                &["--reasoning-parser", "think"],
                "split out as reasoning_content",
            )],
        ),
    ];
    for (f, p) in serve {
        m.insert(("serve", f), p);
    }
    for (flag, shown) in [
        ("--template-memory-mib", "memory_bytes: 8388608"),
        ("--template-output-kib", "output_bytes: 8192"),
        ("--template-module-mib", "module_bytes: 8388608"),
        ("--template-instances", "instances: 8"),
        ("--template-max-functions", "max_functions: 8"),
        ("--template-cache-mib", "cache_bytes: 8388608"),
        ("--template-max-versions", "versions: 8"),
        ("--template-storage-mib", "bytes: 8388608"),
    ] {
        let args: &'static [&'static str] = Box::leak(vec![flag, "8"].into_boxed_slice());
        m.insert(
            ("serve", flag),
            vec![Refused(Embedded, args), Shown(Templated, args, shown)],
        );
    }
    // Every engine flag on a gateway that runs no engine.
    for f in [
        "--device",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--max-waiting",
        "--num-gpu-blocks-override",
        "--tensor-parallel-size",
        "--speculative-config",
        "--enable-chunked-prefill",
        "--fair-share",
    ] {
        let value = match f {
            "--device" => "cpu",
            "--gpu-memory-utilization" => "0.2",
            "--speculative-config" => "{\"method\": \"ngram\", \"num_speculative_tokens\": 2}",
            "--enable-chunked-prefill" | "--fair-share" => "false",
            _ => "2",
        };
        let args: &'static [&'static str] = Box::leak(vec![f, value].into_boxed_slice());
        m.entry(("serve", f))
            .or_insert_with(Vec::new)
            .push(Refused(Remote, args));
    }
    let generate = generate_places();
    for (f, p) in generate {
        m.insert(("generate", f), p);
    }
    m
}

/// The engine flags `serve` and `worker` share (placed for the worker; the same on `serve`'s
/// own engine).
fn engine_places() -> Vec<(&'static str, Vec<Place>)> {
    vec![
        (
            "--max-step-ms",
            vec![Shown(Worker, &["--max-step-ms", "77"], "max_step_ms=77")],
        ),
        (
            "--block-size",
            vec![Shown(Worker, &["--block-size", "32"], "block_size=32")],
        ),
        (
            "--enable-prefix-caching",
            vec![Shown(
                Worker,
                &["--enable-prefix-caching", "false"],
                "enable_prefix_caching=false",
            )],
        ),
        (
            "--scheduling-policy",
            vec![Shown(
                Worker,
                &["--scheduling-policy", "shortest-first"],
                "policy=ShortestFirst",
            )],
        ),
        (
            "--fair-prefill-cap",
            vec![Shown(
                Worker,
                &["--fair-prefill-cap", "99"],
                "fair_prefill_cap=99",
            )],
        ),
        (
            "--cache-shares",
            vec![Shown(
                Worker,
                &["--cache-shares", "false"],
                "cache_shares=false",
            )],
        ),
        (
            "--max-waiting-tokens",
            vec![Shown(
                Worker,
                &["--max-waiting-tokens", "12345"],
                "max_waiting_tokens=12345",
            )],
        ),
        (
            "--kv-cache-dtype",
            vec![Shown(Worker, &["--kv-cache-dtype", "fp8"], "dtype=fp8")],
        ),
        (
            "--quantization",
            vec![Shown(
                Worker,
                &["--quantization", "fp8"],
                "quantization=fp8",
            )],
        ),
        (
            "--enforce-eager",
            vec![Refused(Worker, &["--enforce-eager"])],
        ),
        (
            "--cuda-graph-sizes",
            vec![Refused(Worker, &["--cuda-graph-sizes", "1,2"])],
        ),
        (
            "--max-cancels-per-client",
            vec![Shown(
                Worker,
                &["--max-cancels-per-client", "7"],
                "max_cancels_per_client: 7",
            )],
        ),
        (
            "--grace-period",
            vec![Shown(Worker, &["--grace-period", "7"], "grace: 7s")],
        ),
        (
            "--otlp-endpoint",
            vec![Shown(
                Worker,
                &["--otlp-endpoint", "http://127.0.0.1:9"],
                "exporting request traces over OTLP",
            )],
        ),
        (
            "--otlp-service-name",
            vec![
                Refused(Worker, &["--otlp-service-name", "w"]),
                Shown(
                    Worker,
                    &[
                        "--otlp-endpoint",
                        "http://127.0.0.1:9",
                        "--otlp-service-name",
                        "w7",
                    ],
                    "service=\"w7\"",
                ),
            ],
        ),
        ("--verbose", vec![Shown(Worker, &["-v"], "DEBUG")]),
    ]
}

/// `generate`'s flags.
fn generate_places() -> Vec<(&'static str, Vec<Place>)> {
    vec![
        (
            "--block-size",
            vec![Shown(Generate, &["--block-size", "32"], "block_size=32")],
        ),
        (
            "--enforce-eager",
            vec![Refused(Generate, &["--enforce-eager"])],
        ),
        (
            "--kv-cache-dtype",
            vec![Shown(Generate, &["--kv-cache-dtype", "fp8"], "dtype=fp8")],
        ),
        (
            "--quantization",
            vec![Shown(
                Generate,
                &["--quantization", "fp8"],
                "quantized to FP8",
            )],
        ),
        (
            "--system",
            vec![Shown(
                Generate,
                &["--chat", "--system", "Answer in French."],
                "prompt_tokens=20",
            )],
        ),
        ("--top-p", vec![Refused(Generate, &["--top-p", "0.5"])]),
        ("--top-k", vec![Refused(Generate, &["--top-k", "5"])]),
        ("--seed", vec![Refused(Generate, &["--seed", "5"])]),
        (
            "--ignore-eos",
            vec![Shown(
                Generate,
                &["--chat", "--ignore-eos", "--max-tokens", "40"],
                "generated=40",
            )],
        ),
        (
            "--prefill-chunk",
            vec![Shown(
                Generate,
                &[
                    "-v",
                    "--prompt",
                    "The capital of France is",
                    "--prefill-chunk",
                    "2",
                ],
                "prefill pass from=2 to=4",
            )],
        ),
        (
            "--ids-out",
            vec![Shown(Generate, &["--ids-out", "/dev/null"], "ids written")],
        ),
        ("--verbose", vec![Shown(Generate, &["-v"], "DEBUG")]),
    ]
}

/// The flags `cachet CMD --help` lists.
fn flags_of(cmd: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args([cmd, "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut flags = Vec::new();
    for line in text.lines() {
        let l = line.trim_start();
        let l = l
            .strip_prefix("-v, ")
            .or_else(|| l.strip_prefix("-m, "))
            .or_else(|| l.strip_prefix("-c, "))
            .or_else(|| l.strip_prefix("-p, "))
            .unwrap_or(l);
        if let Some(rest) = l.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect();
            let f = format!("--{name}");
            // Only the lines that start an option (its help text is indented further).
            if line.len() - l.len() <= 6 && !flags.contains(&f) {
                flags.push(f);
            }
        }
    }
    flags
}

/// Test functions of the suite that pass `flag` (name, source file), by a scan of the test sources.
fn tests_passing(flag: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    let mut stack = vec![root.join("gateway/tests"), root.join("tests/tests")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("flags.rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, chunk) in text.split("#[test]").enumerate().skip(1) {
                    let _ = i;
                    if chunk.contains(&format!("\"{flag}\"")) {
                        let name = chunk
                            .split("fn ")
                            .nth(1)
                            .map(|s| s.split('(').next().unwrap_or("").trim().to_string())
                            .unwrap_or_default();
                        found.push(format!(
                            "{}::{name}",
                            p.file_stem().unwrap().to_string_lossy()
                        ));
                    }
                }
            }
        }
    }
    found
}

struct Scratch {
    dir: PathBuf,
    embedded: PathBuf,
    remote: PathBuf,
    templates: PathBuf,
}

fn scratch() -> Scratch {
    let dir = std::env::temp_dir().join(format!("cachet-flags-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    let tenant = "[[tenant]]\nid = \"a\"\napi_key_sha256 = [\"00\"]\n";
    let tenant = tenant.replace("\"00\"", &format!("\"{}\"", "0".repeat(64)));
    std::fs::write(dir.join("embedded.toml"), &tenant).unwrap();
    std::fs::write(
        dir.join("remote.toml"),
        format!("{tenant}[[upstream]]\nkind = \"cachet\"\nurl = \"http://127.0.0.1:9\"\n"),
    )
    .unwrap();
    Scratch {
        embedded: dir.join("embedded.toml"),
        remote: dir.join("remote.toml"),
        templates: dir.join("templates"),
        dir,
    }
}

/// The command line of `mode` with `args`.
fn command(s: &Scratch, mode: Mode, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cachet"));
    let port = cachet_tests::free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    match mode {
        Embedded | Templated => {
            c.args(["serve", "--model", "smollm2", "--config"])
                .arg(&s.embedded);
            c.args(["--listen", &listen, "--usage-db", "off"]);
            c.args(["--device", "cpu", "--gpu-memory-utilization", "0.1"]);
            if matches!(mode, Templated) {
                c.arg("--templates-dir").arg(&s.templates);
            }
        }
        Remote => {
            c.args(["serve", "--model", "smollm2", "--config"])
                .arg(&s.remote);
            c.args(["--listen", &listen, "--usage-db", "off"]);
        }
        Worker => {
            c.args(["worker", "--model", "smollm2", "--listen", &listen]);
            c.args(["--device", "cpu", "--gpu-memory-utilization", "0.1"]);
        }
        Generate => {
            c.args(["generate", "--model", "smollm2", "--device", "cpu"]);
            if !args.contains(&"--prompt") {
                c.args(["--prompt", "Bonjour"]);
            }
            if !args.contains(&"--max-tokens") {
                c.args(["--max-tokens", "2"]);
            }
        }
    }
    c.args(args).env("NO_COLOR", "1").env_remove("RUST_LOG");
    c
}

/// Runs `cmd` until its log shows `want`, it exits, or 60 s pass; the log.
fn log_until(mut cmd: Command, want: &str) -> String {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut log = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(b) => log.extend(b),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
        if String::from_utf8_lossy(&log).contains(want) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    String::from_utf8_lossy(&log).into_owned()
}

#[test]
fn every_flag_is_honoured_or_refused() {
    cachet_tests::smollm2_path();
    let places = places();
    let s = scratch();
    let mut unplaced = Vec::new();
    let mut report = Vec::new();
    for cmd in ["serve", "worker", "generate"] {
        for flag in flags_of(cmd) {
            if flag == "--help" {
                continue;
            }
            let ours = places.get(&(cmd, flag.as_str()));
            let proofs = tests_passing(&flag);
            if ours.is_none() && proofs.is_empty() {
                unplaced.push(format!("{cmd} {flag}"));
                continue;
            }
            if !proofs.is_empty() {
                report.push(format!(
                    "{cmd} {flag}: passed by {}",
                    proofs[..proofs.len().min(2)].join(", ")
                ));
            }
            for place in ours.into_iter().flatten() {
                match place {
                    Refused(mode, args) => {
                        let out = command(&s, *mode, args).output().unwrap();
                        let err = String::from_utf8_lossy(&out.stderr);
                        assert!(
                            !out.status.success() && err.contains(&format!("{flag} is ")),
                            "{cmd} {flag} in {mode:?} {args:?}: not refused by name:\n{err}"
                        );
                        report.push(format!(
                            "{cmd} {flag}: refused in {mode:?}: {}",
                            err.trim().lines().last().unwrap_or("")
                        ));
                    }
                    Shown(mode, args, want) => {
                        let log = log_until(command(&s, *mode, args), want);
                        assert!(
                            log.contains(want),
                            "{cmd} {flag} in {mode:?} {args:?}: the log does not show `{want}`:\n{log}"
                        );
                        report.push(format!("{cmd} {flag}: shown in {mode:?} as `{want}`"));
                    }
                }
            }
        }
    }
    println!("{}", report.join("\n"));
    assert!(
        unplaced.is_empty(),
        "flags neither proven, shown nor refused: {unplaced:?}"
    );
    let _ = std::fs::remove_dir_all(&s.dir);
}
