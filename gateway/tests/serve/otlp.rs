//! Request traces over OTLP, received by a test receiver that decodes them with the
//! OpenTelemetry project's own protobuf classes (opentelemetry-proto): one trace from the
//! client's `traceparent` through a gateway to a `cachet worker`, and through a gateway to an
//! OpenAI-compatible upstream (another `cachet serve`), each hop a child of the one before, with
//! the request's phases and the engine's queue / prefill / decode.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::common::*;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// `cachet ARGS` on SmolLM2 (CPU) listening on a free port, exporting to `otlp` as `service`.
fn cachet_proc(
    args: &[&str],
    otlp: &str,
    service: &str,
    env: &[(&str, &str)],
) -> (cachet_tests::Proc, u16) {
    let port = cachet_tests::free_port();
    let log = std::env::temp_dir().join(format!(
        "cachet-otlp-{}-{service}-{port}.log",
        std::process::id()
    ));
    // A gateway's flags follow its config (no engine flags where its upstreams run the model).
    let config = args
        .iter()
        .position(|a| *a == "--config")
        .map(|i| std::fs::read_to_string(args[i + 1]).unwrap())
        .unwrap_or_default();
    let model = match args[0] {
        "serve" => smollm2_serving(&config, args),
        _ => cachet_tests::SMOLLM2_CPU,
    };
    let mut p = cachet_tests::Proc(
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .args(args)
            .args(model)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--otlp-endpoint", otlp, "--otlp-service-name", service])
            .env("CACHET_USAGE_DB", "off")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap(),
    );
    cachet_tests::wait_proc_listening(&mut p.0, "127.0.0.1", port, service, &log);
    (p, port)
}

fn spans(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits (the exporters send batches every few seconds) until `done` holds for the spans.
fn wait_spans(file: &Path, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let s = spans(file);
        if done(&s) {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "spans never arrived: {}",
            serde_json::to_string_pretty(&s).unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn server_span<'a>(all: &'a [Value], service: &str) -> &'a Value {
    all.iter()
        .find(|s| s["service"] == service && s["kind"] == 2)
        .unwrap_or_else(|| panic!("no request span of {service}"))
}

fn children<'a>(all: &'a [Value], parent: &Value) -> Vec<&'a Value> {
    all.iter()
        .filter(|s| s["parent_span_id"] == parent["span_id"])
        .collect()
}

/// The request span of `service`: child of `parent_span`, in the client's trace, with children
/// named `phases` that lie within it.
fn check_hop<'a>(all: &'a [Value], service: &str, parent_span: &str, phases: &[&str]) -> &'a Value {
    let root = server_span(all, service);
    assert_eq!(root["trace_id"], CLIENT_TRACE, "{service}: {root}");
    assert_eq!(root["parent_span_id"], parent_span, "{service}: {root}");
    assert_eq!(
        root["attributes"]["http.response.status_code"], 200,
        "{root}"
    );
    let kids = children(all, root);
    for p in phases {
        let k = kids
            .iter()
            .find(|k| k["name"] == *p)
            .unwrap_or_else(|| panic!("{service}: no `{p}` span among {kids:?}"));
        assert_eq!(k["trace_id"], CLIENT_TRACE);
        let (s, e) = (k["start"].as_u64().unwrap(), k["end"].as_u64().unwrap());
        // Within the request span, allowing a millisecond for clock conversions.
        assert!(s <= e, "{service} {p}: {k}");
        assert!(
            s + 1_000_000 >= root["start"].as_u64().unwrap()
                && e <= root["end"].as_u64().unwrap() + 1_000_000,
            "{service} {p} outside its request: {k} in {root}"
        );
    }
    root
}

#[test]
fn a_clients_trace_continues_through_gateways_workers_and_openai_upstreams() {
    cachet_tests::smollm2_path();
    let site = cachet_tests::pip_target(
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-otlp-proto"),
        &["opentelemetry-proto"],
        "opentelemetry",
    );
    let dir = std::env::temp_dir().join(format!("cachet-otlp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("spans.jsonl");
    let rport = cachet_tests::free_port();
    let _receiver = cachet_tests::Proc(
        Command::new("python3")
            .arg(
                std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../tests/python/otlp_receiver.py"),
            )
            .args([&rport.to_string(), file.to_str().unwrap()])
            .env("PYTHONPATH", &site)
            .spawn()
            .unwrap(),
    );
    wait_listening("127.0.0.1", rport, "the OTLP receiver");
    let otlp = format!("http://127.0.0.1:{rport}");

    // A worker, and a gateway in front of it.
    let (_worker, wport) = cachet_proc(&["worker"], &otlp, "worker", &[]);
    let front_cfg = dir.join("front.toml");
    std::fs::write(
        &front_cfg,
        format!(
            "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\n\n[[upstream]]\nkind = \"cachet\"\nurl = \"http://127.0.0.1:{wport}\"\n",
            key_hash("sk-trace")
        ),
    )
    .unwrap();
    let (_front, fport) = cachet_proc(
        &["serve", "--config", front_cfg.to_str().unwrap()],
        &otlp,
        "front",
        &[],
    );
    // A gateway with its own engine, as the OpenAI-compatible upstream of a third.
    let up_cfg = dir.join("upstream.toml");
    std::fs::write(
        &up_cfg,
        format!(
            "[[tenant]]\nid = \"gw\"\napi_key_sha256 = [\"{}\"]\n",
            key_hash("sk-upstream")
        ),
    )
    .unwrap();
    let (_up, uport) = cachet_proc(
        &["serve", "--config", up_cfg.to_str().unwrap()],
        &otlp,
        "engine-gateway",
        &[],
    );
    let edge_cfg = dir.join("edge.toml");
    std::fs::write(
        &edge_cfg,
        format!(
            "[[tenant]]\nid = \"t\"\napi_key_sha256 = [\"{}\"]\n\n[[upstream]]\nkind = \"openai\"\nurl = \"http://127.0.0.1:{uport}\"\napi_key_env = \"CACHET_TEST_TRACE_KEY\"\n",
            key_hash("sk-trace")
        ),
    )
    .unwrap();
    let (_edge, eport) = cachet_proc(
        &["serve", "--config", edge_cfg.to_str().unwrap()],
        &otlp,
        "edge",
        &[("CACHET_TEST_TRACE_KEY", "sk-upstream")],
    );

    let traceparent = format!("traceparent: 00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    for port in [fport, eport] {
        let (ok, out) = curl(&[
            "-H",
            "authorization: Bearer sk-trace",
            "-H",
            &traceparent,
            "-d",
            r#"{"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}"#,
            &format!("http://127.0.0.1:{port}/v1/chat/completions"),
        ]);
        assert!(ok && out.contains("\"choices\""), "{out}");
    }
    let need = ["front", "worker", "edge", "engine-gateway"];
    let all = wait_spans(&file, |s| {
        need.iter().all(|svc| {
            s.iter()
                .any(|x| x["service"] == *svc && x["kind"] == 2 && x["end"].as_u64() > Some(0))
        }) && s.iter().filter(|x| x["name"] == "decode").count() >= 4
    });
    let phases = [
        "auth",
        "normalize",
        "tokenize",
        "route",
        "queue",
        "prefill",
        "decode",
    ];
    // Client → front gateway → worker.
    let front = check_hop(&all, "front", CLIENT_SPAN, &phases);
    assert_eq!(front["attributes"]["cachet.tenant"], "t");
    let worker = check_hop(
        &all,
        "worker",
        front["span_id"].as_str().unwrap(),
        &["queue", "prefill", "decode"],
    );
    assert_eq!(worker["attributes"]["gen_ai.usage.output_tokens"], 4);
    // Client → edge gateway → the upstream gateway's own engine, as an OpenAI server.
    let edge = check_hop(&all, "edge", CLIENT_SPAN, &phases);
    let up = check_hop(
        &all,
        "engine-gateway",
        edge["span_id"].as_str().unwrap(),
        &["auth", "tokenize", "route", "queue", "prefill", "decode"],
    );
    assert_eq!(up["attributes"]["cachet.tenant"], "gw");
    assert!(
        up["attributes"]["gen_ai.usage.input_tokens"]
            .as_i64()
            .unwrap()
            > 0
    );
}
