//! `cachet bench ttft`: the seed article's TTFT experiment, reproduced through the gateway.
//!
//! The workload is the article's shape (`workload::seed_workload` with a volatile header): every
//! prompt starts with a shared support-bot system prompt and few-shot examples carrying the
//! request's timestamp and user id (as real apps do), then the user's input; a mix of short and
//! long inputs; Poisson arrivals; a fixed seed; fixed output lengths (`ignore_eos`). Each
//! configuration runs in a fresh `cachet serve` process, cold (nothing before the measured pass)
//! and warm (after a warm-up pass), one after the other on the same device:
//!
//! - **baseline**: no prefix cache, no normalization, no chunked prefill, FCFS, no CUDA graphs,
//!   no speculation, bf16 weights and KV;
//! - **all-on**: every optimization;
//! - with `--ablation`, each optimization alone on top of the baseline; `-<optimization>` runs
//!   all-on without it (what it adds beside the others).
//!
//! Per request it records the client's TTFT and end-to-end time, and the server's split of it
//! (`x-cachet-timings`: prepare = parse + template + normalize + tokenize, queue, prefill), then
//! writes the raw records (`results.json`), a report (`report.md`: P50 / P95 / P99 table, the
//! headline ratios) and plots (TTFT CDFs, stacked bars of the median parts) into `--out`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use cachet_bench::workload::{percentile, seed_workload, SeedWorkloadConfig, WorkItem};
use clap::Args;
use http_body_util::{BodyExt, Full};

use super::super::engine_args::LoadFormat;
use super::super::generate::DeviceKind;

#[derive(Args, Debug)]
pub struct TtftArgs {
    /// Model: a config.json with `--load-format dummy` (the default: the Llama-3-8B shape), or a
    /// model name / path.
    #[arg(long, short, default_value = "examples/configs/llama3-8b.json")]
    pub model: String,
    #[arg(long, value_enum, default_value_t = LoadFormat::Dummy)]
    pub load_format: LoadFormat,
    /// Tokenizer and chat template for dummy weights.
    #[arg(long, default_value = "smollm2")]
    pub tokenizer: String,
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    #[arg(long, default_value_t = 4096)]
    pub max_model_len: usize,
    /// Measured requests per run.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Mean arrivals per second (Poisson): pick one that loads the device, or use --load.
    #[arg(long, default_value_t = 4.0)]
    pub rate: f64,
    /// Set the rate to this share of the baseline's capacity, measured first (a burst of
    /// requests to a baseline server: completed requests per second), e.g. 0.9; overrides --rate.
    #[arg(long)]
    pub load: Option<f64>,
    /// The baseline's measured capacity (req/s), when --load measured it.
    #[arg(skip)]
    pub capacity: Option<f64>,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Output tokens per request (fixed: ignore_eos).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Share of long user inputs.
    #[arg(long, default_value_t = 0.3)]
    pub long_fraction: f64,
    /// Requests of the warm-up pass of a warm run.
    #[arg(long, default_value_t = 16)]
    pub warmup: usize,
    /// Configurations: baseline, all-on, +OPTIMIZATION (it alone on the baseline) or
    /// -OPTIMIZATION (all-on without it). Optimizations: prefix-cache, normalization,
    /// chunked-prefill, shortest-first, cuda-graphs, speculation, fp8-kv, fp8-weights.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "baseline,all-on",
        allow_hyphen_values = true
    )]
    pub configs: Vec<String>,
    /// Also run each optimization alone.
    #[arg(long)]
    pub ablation: bool,
    /// Runs per configuration: cold, warm.
    #[arg(long, value_delimiter = ',', default_value = "cold,warm")]
    pub modes: Vec<String>,
    /// Where results, report and plots go.
    #[arg(long, default_value = "target/cachet-bench/ttft")]
    pub out: PathBuf,
    /// More `cachet serve` arguments for every run (e.g. "--max-num-seqs 128").
    #[arg(long, allow_hyphen_values = true)]
    pub serve_args: Option<String>,
}

const OPTIMIZATIONS: [&str; 8] = [
    "prefix-cache",
    "normalization",
    "chunked-prefill",
    "shortest-first",
    "cuda-graphs",
    "speculation",
    "fp8-kv",
    "fp8-weights",
];

/// The optimizations a configuration name turns on.
fn optimizations(name: &str) -> anyhow::Result<Vec<&'static str>> {
    let find = |o: &str| OPTIMIZATIONS.iter().copied().find(|&x| x == o);
    match name {
        "baseline" => Ok(vec![]),
        "all-on" => Ok(OPTIMIZATIONS.to_vec()),
        n => match (n.split_at_checked(1), n.get(1..).and_then(find)) {
            (Some(("+", _)), Some(o)) => Ok(vec![o]),
            (Some(("-", _)), Some(o)) => {
                Ok(OPTIMIZATIONS.into_iter().filter(|&x| x != o).collect())
            }
            _ => bail!(
                "unknown configuration `{n}`: use baseline, all-on, +<optimization> (it alone) or \
                 -<optimization> (all-on without it), where an optimization is one of {}",
                OPTIMIZATIONS.join(", ")
            ),
        },
    }
}

/// One request's measurements.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Record {
    arrival_s: f64,
    ttft_ms: f64,
    e2e_ms: f64,
    prompt_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
    prepare_ms: f64,
    queue_ms: f64,
    prefill_ms: f64,
    itl_ms: f64,
    error: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
struct RunResult {
    config: String,
    mode: String,
    records: Vec<Record>,
    wall_s: f64,
}

impl RunResult {
    fn ok(&self) -> impl Iterator<Item = &Record> {
        self.records.iter().filter(|r| r.error.is_none())
    }
    fn col(&self, f: impl Fn(&Record) -> f64) -> Vec<f64> {
        self.ok().map(f).collect()
    }
    fn label(&self) -> String {
        format!("{}, {}", self.config, self.mode)
    }
}

/// A `cachet serve` child, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use cachet_gateway::http::client::{self as http_client, Client, ClientError};

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn get(client: &Client, url: &str, key: &str) -> Result<(u16, Bytes), ClientError> {
    let req = http_client::request("GET", url, Some(key), Bytes::new());
    let resp = http_client::send(client, req, Duration::from_secs(30)).await?;
    let status = resp.status().as_u16();
    Ok((status, http_client::read_body(resp).await?))
}

/// One streamed chat request with server timings.
async fn one(client: &Client, url: &str, key: &str, model: &str, it: &WorkItem) -> Record {
    let body = serde_json::json!({"model": model, "max_tokens": it.max_tokens, "ignore_eos": true,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true}, "user": it.user_id,
        "messages": [{"role": "system", "content": it.system}, {"role": "user", "content": it.user}]});
    let req = hyper::Request::post(url)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .header("x-cachet-timings", "1")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("valid request");
    let t0 = Instant::now();
    let mut rec = Record::default();
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            rec.error = Some(e.to_string());
            return rec;
        }
    };
    if !resp.status().is_success() {
        rec.error = Some(http_client::error_text(resp).await);
        return rec;
    }
    let mut body = resp.into_body();
    let mut text = String::new();
    let mut ttft = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    text.push_str(&String::from_utf8_lossy(&d));
                    if ttft.is_none() && text.contains("\"content\":\"") && {
                        // The role chunk carries an empty content; a token's chunk does not.
                        text.lines().any(|l| {
                            l.contains("\"content\":\"") && !l.contains("\"content\":\"\"")
                        })
                    } {
                        ttft = Some(t0.elapsed());
                    }
                }
            }
            Err(e) => {
                rec.error = Some(e.to_string());
                return rec;
            }
        }
    }
    rec.e2e_ms = t0.elapsed().as_secs_f64() * 1e3;
    rec.ttft_ms = ttft.map_or(rec.e2e_ms, |t| t.as_secs_f64() * 1e3);
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned());
    match usage {
        Some(u) => {
            rec.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
            rec.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
            rec.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            let t = &u["cachet_timings"];
            let ms = |k: &str| t[k].as_f64().unwrap_or(0.0);
            rec.prepare_ms = ms("prepare_ms");
            rec.queue_ms = ms("queue_ms");
            rec.prefill_ms = ms("prefill_ms");
            rec.itl_ms = ms("mean_itl_ms");
        }
        None => {
            rec.error = Some(format!(
                "no usage in the stream: {}",
                text.chars().take(300).collect::<String>()
            ))
        }
    }
    rec
}

/// Runs `items` open-loop (each at its arrival time).
async fn pass(
    client: &Client,
    url: &str,
    key: &str,
    model: &str,
    items: &[WorkItem],
) -> (Vec<Record>, f64) {
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = items
        .iter()
        .cloned()
        .map(|it| {
            let (client, url, key, model) = (
                client.clone(),
                url.to_string(),
                key.to_string(),
                model.to_string(),
            );
            tokio::spawn(async move {
                tokio::time::sleep_until(start + it.at).await;
                let mut r = one(&client, &url, &key, &model, &it).await;
                r.arrival_s = it.at.as_secs_f64();
                r
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Record {
            error: Some(e.to_string()),
            ..Default::default()
        }));
    }
    (out, start.elapsed().as_secs_f64())
}

fn run_one(
    a: &TtftArgs,
    tenants: &std::path::Path,
    config: &str,
    mode: &str,
    items: &[WorkItem],
    warmup: &[WorkItem],
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<RunResult> {
    let on = optimizations(config)?;
    let has = |o: &str| on.contains(&o);
    let port = free_port()?;
    let exe = std::env::current_exe().context("finding the cachet binary")?;
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--model".into(),
        a.model.clone(),
        "--device".into(),
        format!("{:?}", a.device).to_lowercase(),
        "--gpu-memory-utilization".into(),
        a.gpu_memory_utilization.to_string(),
        "--max-model-len".into(),
        a.max_model_len.to_string(),
        "--config".into(),
        tenants.display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--max-waiting".into(),
        "100000".into(),
        "--max-waiting-tokens".into(),
        "100000000".into(),
        "--enable-prefix-caching".into(),
        has("prefix-cache").to_string(),
        "--enable-chunked-prefill".into(),
        has("chunked-prefill").to_string(),
        "--scheduling-policy".into(),
        if has("shortest-first") {
            "shortest-first"
        } else {
            "fcfs"
        }
        .into(),
    ];
    if a.load_format == LoadFormat::Dummy {
        args.extend([
            "--load-format".into(),
            "dummy".into(),
            "--tokenizer".into(),
            a.tokenizer.clone(),
        ]);
    }
    // Off, graphs are turned off on a GPU; the CPU runs every step eagerly anyway (and
    // refuses the flag).
    if !has("cuda-graphs") && a.device != super::super::generate::DeviceKind::Cpu {
        args.push("--enforce-eager".into());
    }
    if has("fp8-kv") {
        args.extend(["--kv-cache-dtype".into(), "fp8".into()]);
    }
    if has("fp8-weights") {
        args.extend(["--quantization".into(), "fp8".into()]);
    }
    if has("speculation") {
        args.extend([
            "--speculative-config".into(),
            r#"{"method": "ngram", "num_speculative_tokens": 4}"#.into(),
        ]);
    }
    if let Some(extra) = &a.serve_args {
        args.extend(extra.split_whitespace().map(String::from));
    }
    let log = std::fs::File::create(a.out.join("logs").join(format!("{config}-{mode}.log")))?;
    let mut server = Server(
        Command::new(exe)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting cachet serve")?,
    );
    let base = format!("http://127.0.0.1:{port}");
    let key = if has("normalization") {
        "sk-norm"
    } else {
        "sk-raw"
    };
    let client: Client = http_client::client(Duration::from_secs(2));
    rt.block_on(async {
        let t0 = Instant::now();
        loop {
            if let Ok((200, _)) = get(&client, &format!("{base}/health"), key).await {
                break;
            }
            if let Ok(Some(status)) = server.0.try_wait() {
                bail!("cachet serve exited ({status}) before it was ready (see logs/{config}-{mode}.log)");
            }
            if t0.elapsed() > Duration::from_secs(900) {
                bail!("cachet serve did not come up in 15 minutes (see logs/{config}-{mode}.log)");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (_, models) = get(&client, &format!("{base}/v1/models"), key)
            .await
            .map_err(anyhow::Error::msg)?;
        let models: serde_json::Value = serde_json::from_slice(&models)?;
        let model = models["data"][0]["id"]
            .as_str()
            .context("no model in /v1/models")?
            .to_string();
        let url = format!("{base}/v1/chat/completions");
        if mode == "warm" {
            pass(&client, &url, key, &model, warmup).await;
        }
        let (records, wall_s) = pass(&client, &url, key, &model, items).await;
        Ok(RunResult {
            config: config.into(),
            mode: mode.into(),
            records,
            wall_s,
        })
    })
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        percentile(v, p)
    }
}

pub fn run(mut a: TtftArgs) -> anyhow::Result<()> {
    if a.ablation {
        for o in OPTIMIZATIONS {
            let n = format!("+{o}");
            if !a.configs.contains(&n) {
                a.configs.push(n);
            }
        }
    }
    for c in &a.configs {
        optimizations(c)?;
    }
    for m in &a.modes {
        if m != "cold" && m != "warm" {
            bail!("unknown mode `{m}`: use cold and/or warm");
        }
    }
    std::fs::create_dir_all(a.out.join("logs"))
        .with_context(|| format!("creating {}", a.out.display()))?;
    let tenants = a.out.join("tenants.toml");
    let tenant = |id: &str, key: &str, normalize: &str| {
        format!(
            "[[tenant]]\nid = \"{id}\"\napi_key_sha256 = [\"{}\"]\nnormalize = \"{normalize}\"\n\n",
            cachet_gateway::tenants::hex(&cachet_gateway::tenants::hash_key(key))
        )
    };
    std::fs::write(
        &tenants,
        tenant("norm", "sk-norm", "relocate") + &tenant("raw", "sk-raw", "off"),
    )?;
    let wl = SeedWorkloadConfig {
        num_requests: a.requests,
        rate: a.rate,
        seed: a.seed,
        long_fraction: a.long_fraction,
        max_tokens: a.max_tokens,
        volatile_header: true,
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    if let Some(f) = a.load {
        measure_capacity(&mut a, f, &tenants, &wl, &rt)?;
    }
    let wl = SeedWorkloadConfig { rate: a.rate, ..wl };
    let items = seed_workload(&wl);
    let warmup = seed_workload(&SeedWorkloadConfig {
        num_requests: a.warmup,
        seed: a.seed + 1000,
        ..wl.clone()
    });
    let mut results = Vec::new();
    for config in &a.configs {
        for mode in &a.modes {
            eprintln!("running {config}, {mode} ...");
            let r = run_one(&a, &tenants, config, mode, &items, &warmup, &rt)?;
            let errors = r.records.iter().filter(|x| x.error.is_some()).count();
            if errors > 0 {
                let first = r
                    .records
                    .iter()
                    .find_map(|x| x.error.clone())
                    .unwrap_or_default();
                eprintln!(
                    "  {errors} of {} requests failed, e.g.: {first}",
                    r.records.len()
                );
            }
            results.push(r);
        }
    }
    std::fs::write(
        a.out.join("results.json"),
        serde_json::to_string(&serde_json::json!({
            "args": format!("{a:?}"),
            "rate_rps": a.rate,
            "baseline_capacity_rps": a.capacity,
            "requests": a.requests,
            "seed": a.seed,
            "runs": results,
        }))?,
    )?;
    let report = report(&a, &results);
    print!("{report}");
    std::fs::write(a.out.join("report.md"), &report)?;
    write_plots(&a, &results)?;
    eprintln!("results, report and plots in {}", a.out.display());
    Ok(())
}

/// `--load`: the baseline's capacity from a burst of requests, and the rate that is `f` of it.
fn measure_capacity(
    a: &mut TtftArgs,
    f: f64,
    tenants: &std::path::Path,
    wl: &SeedWorkloadConfig,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        f > 0.0,
        "--load must be positive (a share of the capacity, e.g. 0.9)"
    );
    let burst: Vec<WorkItem> = seed_workload(&SeedWorkloadConfig {
        num_requests: a.requests.min(400),
        seed: a.seed + 2000,
        ..wl.clone()
    })
    .into_iter()
    .map(|mut it| {
        it.at = Duration::ZERO;
        it
    })
    .collect();
    eprintln!(
        "measuring the baseline's capacity: a burst of {} requests ...",
        burst.len()
    );
    let r = run_one(a, tenants, "baseline", "capacity", &burst, &[], rt)?;
    let done = r.records.iter().filter(|x| x.error.is_none()).count();
    anyhow::ensure!(
        done > 0,
        "no request of the capacity burst completed (server log: {})",
        a.out.join("logs/baseline-capacity.log").display()
    );
    let cap = done as f64 / r.wall_s;
    a.capacity = Some(cap);
    a.rate = (f * cap * 10.0).round() / 10.0;
    eprintln!("baseline capacity {cap:.1} req/s: rate {} req/s", a.rate);
    Ok(())
}

/// The TTFT CDF of each mode and the median TTFT's parts, as SVG plots in `--out`.
fn write_plots(a: &TtftArgs, results: &[RunResult]) -> anyhow::Result<()> {
    for mode in &a.modes {
        let series: Vec<(String, Vec<f64>)> = results
            .iter()
            .filter(|r| &r.mode == mode)
            .map(|r| (r.config.clone(), r.col(|x| x.ttft_ms)))
            .collect();
        std::fs::write(
            a.out.join(format!("ttft-cdf-{mode}.svg")),
            cachet_bench::report::cdf_svg(
                &series,
                &format!("TTFT, {mode} ({} requests at {} req/s)", a.requests, a.rate),
                "time to first token (log scale)",
            ),
        )?;
    }
    let bars: Vec<(String, Vec<f64>)> = results
        .iter()
        .map(|r| {
            let (p, q, f) = (
                pct(&r.col(|x| x.prepare_ms), 50.0),
                pct(&r.col(|x| x.queue_ms), 50.0),
                pct(&r.col(|x| x.prefill_ms), 50.0),
            );
            let ttft = pct(&r.col(|x| x.ttft_ms), 50.0);
            (r.label(), vec![p, q, f, (ttft - p - q - f).max(0.0)])
        })
        .collect();
    std::fs::write(
        a.out.join("ttft-parts.svg"),
        cachet_bench::report::stacked_bars_svg(
            &bars,
            &[
                "prepare (parse, normalize, tokenize)",
                "queue (+ KV allocation)",
                "prefill",
                "transport + first token out",
            ],
            "Median TTFT, by part",
            "milliseconds",
        ),
    )?;
    Ok(())
}

fn report(a: &TtftArgs, results: &[RunResult]) -> String {
    let mut s = format!(
        "Workload: {} requests, Poisson {} req/s, seed {}, {} output tokens each (ignore_eos), {:.0}% long inputs; model {} ({:?}), device {:?}.\n\n",
        a.requests, a.rate, a.seed, a.max_tokens, a.long_fraction * 100.0, a.model, a.load_format, a.device
    );
    if let (Some(cap), Some(f)) = (a.capacity, a.load) {
        s.push_str(&format!(
            "Rate = {f} × the baseline's capacity, measured first in the same run: {cap:.1} req/s (a burst of requests to a fresh baseline server).\n\n"
        ));
    }
    if let Some(r) = results.first() {
        let prompt: Vec<f64> = r.col(|x| x.prompt_tokens as f64);
        s.push_str(&format!(
            "Mean prompt {:.0} tokens.\n\n",
            prompt.iter().sum::<f64>() / prompt.len().max(1) as f64
        ));
    }
    s.push_str("| configuration | run | TTFT P50 (ms) | P95 | P99 | prepare P50 | queue P50 | queue P95 | prefill P50 | prefill P95 | ITL P50 | output tok/s | prefix hit | errors |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let ttft = r.col(|x| x.ttft_ms);
        let (q, f, p, itl) = (
            r.col(|x| x.queue_ms),
            r.col(|x| x.prefill_ms),
            r.col(|x| x.prepare_ms),
            r.col(|x| x.itl_ms),
        );
        let out: u64 = r.ok().map(|x| x.output_tokens).sum();
        let (prompt, cached): (u64, u64) = r.ok().fold((0, 0), |acc, x| {
            (acc.0 + x.prompt_tokens, acc.1 + x.cached_tokens)
        });
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.1}% | {} |\n",
            r.config,
            r.mode,
            pct(&ttft, 50.0),
            pct(&ttft, 95.0),
            pct(&ttft, 99.0),
            pct(&p, 50.0),
            pct(&q, 50.0),
            pct(&q, 95.0),
            pct(&f, 50.0),
            pct(&f, 95.0),
            pct(&itl, 50.0),
            out as f64 / r.wall_s.max(1e-9),
            100.0 * cached as f64 / prompt.max(1) as f64,
            r.records.iter().filter(|x| x.error.is_some()).count(),
        ));
    }
    s.push('\n');
    let find = |c: &str, m: &str| results.iter().find(|r| r.config == c && r.mode == m);
    for m in &a.modes {
        if let (Some(b), Some(o)) = (find("baseline", m), find("all-on", m)) {
            let (pb, po) = (
                pct(&b.col(|x| x.ttft_ms), 95.0),
                pct(&o.col(|x| x.ttft_ms), 95.0),
            );
            let (mb, mo) = (
                pct(&b.col(|x| x.ttft_ms), 50.0),
                pct(&o.col(|x| x.ttft_ms), 50.0),
            );
            let thr = |r: &RunResult| {
                r.ok().map(|x| x.output_tokens).sum::<u64>() as f64 / r.wall_s.max(1e-9)
            };
            s.push_str(&format!(
                "All on vs baseline, {m}: P95 TTFT {pb:.0} → {po:.0} ms (**{:.0}% cut**, target ≥ 90%), P50 {mb:.0} → {mo:.0} ms ({:.0}% cut), output throughput {:.2}× (target ≥ 1×).\n",
                100.0 * (1.0 - po / pb),
                100.0 * (1.0 - mo / mb),
                thr(o) / thr(b)
            ));
        }
        // Leave-one-out runs: what each optimization adds beside the others, most first.
        let Some(o) = find("all-on", m) else {
            continue;
        };
        let po = pct(&o.col(|x| x.ttft_ms), 95.0);
        let mut without: Vec<(&str, f64)> = results
            .iter()
            .filter(|r| &r.mode == m)
            .filter_map(|r| {
                Some((
                    r.config.strip_prefix('-')?,
                    pct(&r.col(|x| x.ttft_ms), 95.0),
                ))
            })
            .collect();
        if without.is_empty() {
            continue;
        }
        without.sort_by(|x, y| y.1.total_cmp(&x.1));
        let parts: Vec<String> = without
            .iter()
            .map(|(opt, p)| format!("{opt} {p:.0} ms ({:+.0})", p - po))
            .collect();
        s.push_str(&format!(
            "All on without each optimization, {m}: P95 TTFT {} — against {po:.0} ms with all of them.\n",
            parts.join(", ")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_what_each_optimization_adds_beside_the_others() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: TtftArgs,
        }
        let a = <Cli as clap::Parser>::parse_from(["ttft", "--modes", "warm"]).a;
        // A run of 100 requests whose TTFTs are 1..=p95·100/95 ms: its P95 is about `p95`.
        let run = |config: &str, p95: f64| RunResult {
            config: config.into(),
            mode: "warm".into(),
            records: (1..=100)
                .map(|i| Record {
                    ttft_ms: i as f64 * p95 / 95.0,
                    ..Default::default()
                })
                .collect(),
            wall_s: 1.0,
        };
        let results = [
            run("baseline", 100.0),
            run("all-on", 16.0),
            run("-fp8-kv", 15.0),
            run("-prefix-cache", 36.0),
        ];
        let r = report(&a, &results);
        assert!(r.contains("**84% cut**"), "{r}");
        assert!(
            r.contains("All on without each optimization, warm: P95 TTFT prefix-cache 36 ms (+20), fp8-kv 15 ms (-1) — against 16 ms with all of them."),
            "{r}"
        );
        // No leave-one-out runs, no such line.
        assert!(!report(&a, &results[..2]).contains("without each"));
    }

    #[test]
    fn configuration_names_say_what_runs() {
        assert!(optimizations("baseline").unwrap().is_empty());
        assert_eq!(optimizations("all-on").unwrap(), OPTIMIZATIONS.to_vec());
        assert_eq!(optimizations("+fp8-weights").unwrap(), vec!["fp8-weights"]);
        let without = optimizations("-prefix-cache").unwrap();
        assert_eq!(without.len(), OPTIMIZATIONS.len() - 1);
        assert!(!without.contains(&"prefix-cache") && without.contains(&"normalization"));
        for bad in ["+", "-", "+fp16", "-all-on", "everything", ""] {
            let e = optimizations(bad).unwrap_err().to_string();
            assert!(
                e.contains(&format!("`{bad}`")) && e.contains("fp8-weights"),
                "{e}"
            );
        }
    }
}
