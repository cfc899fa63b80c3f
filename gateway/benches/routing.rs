//! The multi-worker benchmark: 4 `cachet worker`s (SmolLM2 on the CPU, small KV pools) behind
//! `cachet serve`, an open-loop Poisson workload (tenants, Zipf prefix groups whose system prompts
//! carry the time and the user id, multi-turn sessions; `workload::routing_workload`), run four
//! ways side by side: round-robin vs prefix routing, each with normalization off and on; plus
//! the oracle (the same prompts without volatile fields, on one worker holding all the KV
//! blocks). Reports token-level prefix hit rate, TTFT P50/P95 and throughput, and draws the TTFT
//! CDFs (SVG).
//!
//!     cargo bench -p cachet-gateway --bench routing
//!     CACHET_BENCH_RATIOS=0.5,0.75,1.2 CACHET_BENCH_REQUESTS=120 CACHET_BENCH_RATE=1.5 cargo bench ...
//!
//! The working-set ratio sizes each worker's KV pool: total KV blocks = unique prompt blocks of
//! the (normalized) workload ÷ ratio.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::loader::{self, fetch};
use cachet_backend::tokenizer::{ChatMessage, TextTokenizer};
use cachet_bench::workload::{percentile, routing_workload, ChatItem, RoutingWorkloadConfig};
use cachet_tests::{free_port, Proc};
use http_body_util::{BodyExt, Full};

const WORKERS: usize = 4;
const BLOCK: usize = 16;

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn wait_health(url: &str) {
    let t0 = Instant::now();
    loop {
        let ok = Command::new("curl")
            .args(["-sf", "--max-time", "2", url])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{url} did not come up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn spawn(args: &[String]) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_cachet"))
            .args(args)
            .env("RAYON_NUM_THREADS", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

struct Setup {
    dir: PathBuf,
    key: String,
    config: String,
}

fn setup() -> Setup {
    let dir = std::env::temp_dir().join(format!("cachet-routing-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("hash.key");
    std::fs::write(&key, "5a".repeat(32)).unwrap();
    let mut cfg = String::new();
    for t in 0..4 {
        for (suffix, normalize) in [
            ("", "relocate"),
            ("-after", "relocate-after"),
            ("-off", "off"),
        ] {
            cfg.push_str(&format!(
                "[[tenant]]\nid = \"t{t}{suffix}\"\napi_key_sha256 = [\"{}\"]\nnormalize = \"{normalize}\"\n\n",
                cachet_gateway::tenants::hex(&cachet_gateway::tenants::hash_key(&format!("sk-t{t}{suffix}")))
            ));
        }
    }
    let config = dir.join("tenants.toml");
    std::fs::write(&config, cfg).unwrap();
    Setup {
        key: key.to_str().unwrap().into(),
        config: config.to_str().unwrap().into(),
        dir,
    }
}

/// Unique full blocks of the prompts (a token-block chain per prompt), as the engine would key
/// them per tenant.
fn working_set_blocks(tok: &TextTokenizer, items: &[ChatItem]) -> usize {
    let mut seen = HashSet::new();
    for it in items {
        let msgs: Vec<ChatMessage> = it
            .messages
            .iter()
            .map(|(r, c)| ChatMessage::new(r.clone(), c.clone()))
            .collect();
        let ids = tok.encode(&tok.render_chat(&msgs, true).unwrap()).unwrap();
        let mut h = blake3::Hasher::new();
        h.update(&(it.tenant as u64).to_le_bytes());
        for chunk in ids.chunks_exact(BLOCK) {
            for t in chunk {
                h.update(&t.to_le_bytes());
            }
            seen.insert(*h.finalize().as_bytes());
        }
    }
    seen.len()
}

#[derive(Debug, Clone, Default)]
struct RunResult {
    name: String,
    hit_rate: f64,
    /// Totals over the run: prompt tokens sent and those served from a cache.
    prompt_tokens: u64,
    cached_tokens: u64,
    ttft_ms: Vec<f64>,
    throughput: f64,
    errors: usize,
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// One streamed chat: (TTFT, prompt tokens, cached tokens), or an error.
async fn one(
    client: &Client,
    url: &str,
    key: &str,
    it: &ChatItem,
) -> Result<(Duration, u64, u64), String> {
    let messages: Vec<serde_json::Value> = it
        .messages
        .iter()
        .map(|(r, c)| serde_json::json!({"role": r, "content": c}))
        .collect();
    let body = serde_json::json!({"model": "smollm2", "messages": messages, "max_tokens": it.max_tokens,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true}, "user": it.user_id});
    let req = hyper::Request::post(url)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let t0 = Instant::now();
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(cachet_gateway::http::client::error_text(resp).await);
    }
    let mut body = resp.into_body();
    let mut ttft = None;
    let mut text = String::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(d) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&d));
            if ttft.is_none() && text.contains("\"content\"") {
                ttft = Some(t0.elapsed());
            }
        }
    }
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
        .ok_or("no usage in the stream")?;
    Ok((
        ttft.unwrap_or_else(|| t0.elapsed()),
        usage["prompt_tokens"].as_u64().unwrap_or(0),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    ))
}

/// Starts `workers` workers with `blocks` KV blocks each and a gateway routing with `policy`;
/// runs `items` open-loop with the tenants' keys (`-off` keys: normalization off).
fn run(
    s: &Setup,
    name: &str,
    policy: &str,
    // The tenant key suffix of a normalization mode: "" relocate, "-after" relocate-after, "-off".
    normalize: &'static str,
    workers: usize,
    blocks: usize,
    items: &[ChatItem],
) -> RunResult {
    let mut procs = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..workers {
        let port = free_port();
        procs.push(spawn(&[
            "worker".into(),
            "--model".into(),
            "smollm2".into(),
            "--device".into(),
            "cpu".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--hash-key-file".into(),
            s.key.clone(),
            "--num-gpu-blocks-override".into(),
            blocks.to_string(),
            "--max-model-len".into(),
            "2048".into(),
        ]));
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    for u in &urls {
        wait_health(&format!("{u}/health"));
    }
    let gport = free_port();
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--model".into(),
        "smollm2".into(),
        "--device".into(),
        "cpu".into(),
        "--num-gpu-blocks-override".into(),
        "16".into(),
        "--config".into(),
        s.config.clone(),
        "--listen".into(),
        format!("127.0.0.1:{gport}"),
        "--hash-key-file".into(),
        s.key.clone(),
        "--routing".into(),
        policy.into(),
        "--max-model-len".into(),
        "2048".into(),
    ];
    for u in &urls {
        args.push("--worker".into());
        args.push(u.clone());
    }
    procs.push(spawn(&args));
    let base = format!("http://127.0.0.1:{gport}");
    wait_health(&format!("{base}/health"));
    std::thread::sleep(Duration::from_millis(1500)); // the pool's first health polls
    let url = format!("{base}/v1/chat/completions");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client: Client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let items: Vec<ChatItem> = items.to_vec();
    let results = rt.block_on(async move {
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for it in items {
            let (client, url) = (client.clone(), url.clone());
            let key = format!("sk-t{}{normalize}", it.tenant);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(start + it.at).await;
                let r = one(&client, &url, &key, &it).await;
                (r, start.elapsed())
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    drop(procs);
    let (mut prompt, mut cached, mut errors) = (0u64, 0u64, 0);
    let mut ttft = Vec::new();
    let mut last = Duration::ZERO;
    for (r, done) in &results {
        match r {
            Ok((t, p, c)) => {
                ttft.push(t.as_secs_f64() * 1e3);
                prompt += p;
                cached += c;
                last = last.max(*done);
            }
            Err(e) => {
                errors += 1;
                if errors <= 3 {
                    eprintln!("{name}: {e}");
                }
            }
        }
    }
    RunResult {
        name: name.into(),
        hit_rate: cached as f64 / prompt.max(1) as f64,
        prompt_tokens: prompt,
        cached_tokens: cached,
        throughput: ttft.len() as f64 / last.as_secs_f64().max(1e-9),
        ttft_ms: ttft,
        errors,
    }
}

fn main() {
    let path = fetch::fetch(fetch::known_model("smollm2").unwrap(), true).unwrap();
    let tok = loader::load(path.to_str().unwrap(), false)
        .unwrap()
        .tokenizer
        .unwrap();
    let s = setup();
    let ratios: Vec<f64> = std::env::var("CACHET_BENCH_RATIOS")
        .unwrap_or_else(|_| "0.75".into())
        .split(',')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    let cfg = RoutingWorkloadConfig {
        num_requests: env_or("CACHET_BENCH_REQUESTS", 120),
        rate: env_or("CACHET_BENCH_RATE", 1.5),
        ..Default::default()
    };
    let items = routing_workload(&cfg);
    let plain = routing_workload(&RoutingWorkloadConfig {
        volatile_header: false,
        ..cfg.clone()
    });
    let ws = working_set_blocks(&tok, &plain);
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("routing");
    std::fs::create_dir_all(&out_dir).unwrap();
    println!("workload: {} requests at {} req/s, {} tenants, {} prefix groups (Zipf {}), sessions up to {} turns; working set {ws} blocks of {BLOCK} tokens", cfg.num_requests, cfg.rate, cfg.tenants, cfg.groups, cfg.zipf, cfg.max_turns);
    let mut raw = Vec::new();
    for ratio in ratios {
        let blocks = ((ws as f64 / ratio) / WORKERS as f64).ceil() as usize;
        println!(
            "\n### working set {ratio}× of the KV capacity: {WORKERS} workers × {blocks} blocks\n"
        );
        // CACHET_BENCH_CONFIGS picks a subset: rr-off, rr-on, prefix-off, prefix-on, prefix-after,
        // single-on, single-after, oracle ("-after": normalization with the context block after
        // the new message).
        let want = std::env::var("CACHET_BENCH_CONFIGS")
            .unwrap_or_else(|_| "rr-off,rr-on,prefix-off,prefix-on,single-on,oracle".into());
        let on = |k: &str| want.split(',').any(|x| x.trim() == k);
        let mode_name = |suffix: &str| match suffix {
            "" => "normalization on",
            "-after" => "normalization on (after)",
            _ => "normalization off",
        };
        let mut runs = Vec::new();
        for (key, policy, normalize) in [
            ("rr-off", "round_robin", "-off"),
            ("rr-on", "round_robin", ""),
            ("prefix-off", "prefix", "-off"),
            ("prefix-on", "prefix", ""),
            ("prefix-after", "prefix", "-after"),
        ] {
            if on(key) {
                let name = format!("{policy}, {}", mode_name(normalize));
                runs.push(run(&s, &name, policy, normalize, WORKERS, blocks, &items));
            }
        }
        for (key, normalize) in [("single-on", ""), ("single-after", "-after")] {
            if on(key) {
                let name = format!(
                    "single cache (one worker, all blocks), {}",
                    mode_name(normalize)
                );
                runs.push(run(
                    &s,
                    &name,
                    "round_robin",
                    normalize,
                    1,
                    blocks * WORKERS,
                    &items,
                ));
            }
        }
        let oracle = if on("oracle") {
            let name = "oracle (no volatile fields, one shared cache)";
            run(&s, name, "round_robin", "", 1, blocks * WORKERS, &plain)
        } else {
            RunResult::default()
        };
        println!("| configuration | prefix hit rate (tokens) | TTFT P50 (ms) | TTFT P95 (ms) | throughput (req/s) | errors |");
        println!("|---|---|---|---|---|---|");
        for r in runs
            .iter()
            .chain(std::iter::once(&oracle))
            .filter(|r| !r.name.is_empty())
        {
            println!(
                "| {} | {:.1}% | {:.0} | {:.0} | {:.2} | {} |",
                r.name,
                100.0 * r.hit_rate,
                percentile(&r.ttft_ms, 50.0),
                percentile(&r.ttft_ms, 95.0),
                r.throughput,
                r.errors
            );
        }
        if runs.len() >= 4 && !oracle.name.is_empty() {
            let (rr, pn) = (&runs[0], &runs[3]);
            println!("\nnormalization on, prefix routing: {:.2}× the oracle's hit rate; {:.2}× round-robin (normalization off) throughput; TTFT P95 {:.2}× lower", pn.hit_rate / oracle.hit_rate.max(1e-9), pn.throughput / rr.throughput.max(1e-9), percentile(&rr.ttft_ms, 95.0) / percentile(&pn.ttft_ms, 95.0).max(1e-9));
        }
        // The oracle's prompts lack the volatile values, so its token count is smaller: the
        // relocated values (never cacheable) bound a normalized run's rate at prompt_o / prompt_n
        // of the oracle's. Cached tokens compare the reuse itself.
        if !oracle.name.is_empty() {
            println!("\n| vs the oracle | hit rate | cached tokens | prompt tokens |");
            println!("|---|---|---|---|");
            for r in runs.iter().filter(|r| r.name.contains("normalization on")) {
                println!(
                    "| {} | {:.3}× | {:.3}× ({} / {}) | {:.3}× (ceiling of the rate ratio {:.3}×) |",
                    r.name,
                    r.hit_rate / oracle.hit_rate.max(1e-9),
                    r.cached_tokens as f64 / oracle.cached_tokens.max(1) as f64,
                    r.cached_tokens,
                    oracle.cached_tokens,
                    r.prompt_tokens as f64 / oracle.prompt_tokens.max(1) as f64,
                    oracle.prompt_tokens as f64 / r.prompt_tokens.max(1) as f64
                );
            }
        }
        let mut plot = runs.clone();
        if !oracle.name.is_empty() {
            plot.push(oracle.clone());
        }
        std::fs::write(
            out_dir.join(format!("ttft-cdf-{ratio}.svg")),
            cachet_bench::report::cdf_svg(
                &plot
                    .iter()
                    .map(|r| (r.name.clone(), r.ttft_ms.clone()))
                    .collect::<Vec<_>>(),
                &format!(
                    "TTFT CDF, working set {ratio}× of KV capacity, {} requests",
                    cfg.num_requests
                ),
                "time to first token (log scale)",
            ),
        )
        .unwrap();
        for r in &plot {
            raw.push(serde_json::json!({"ratio": ratio, "name": r.name, "hit_rate": r.hit_rate, "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens, "throughput": r.throughput, "errors": r.errors, "ttft_ms": r.ttft_ms}));
        }
    }
    std::fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&raw).unwrap(),
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&s.dir);
}
