//! `cachet bench serve`: a load generator against any OpenAI-compatible server (`cachet serve`,
//! a `cachet worker`, vLLM, SGLang, …), reporting what vLLM's `bench serve` reports, in its
//! layout: request and token throughput, TTFT, TPOT, ITL and end-to-end latency percentiles.
//!
//! Requests go to `/v1/completions`, streamed (`stream_options.include_usage`), with their
//! prompts as token ids, so a request's input length is exact on any server (the usage it
//! answers with is checked against it). Datasets, all generated here from a seed:
//! - `random`: input and output lengths uniform in `len·(1 ± range_ratio)`, ids drawn at random
//!   (every prompt unique from its first block);
//! - `shared-prefix`: `num_prefixes` groups, each prompt its group's prefix of `prefix_len` ids
//!   then a random suffix of the input length;
//! - `sharegpt`: lengths from a ShareGPT-like distribution made here (log-normal, medians of
//!   ~200 input and ~180 output tokens, clipped to 4–4096 and 1–2048): the shape of chat
//!   traffic, not the dataset's text.
//!
//! Arrivals: all at once (`--request-rate inf`, the default) or Poisson at a rate; at most
//! `--max-concurrency` in flight either way. Each slot owns one HTTP/1.1 connection, kept alive
//! between its requests (a new one only when the server closes it), so the benchmark never
//! holds more connections than requests in flight — a server's per-client connection cap
//! (`cachet serve` refuses the 257th from one IP) sees exactly `--max-concurrency`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use cachet_backend::rng::Rng;
use cachet_bench::workload::percentile;
use cachet_gateway::http::client::{self as http_client, Client};
use clap::{Args, ValueEnum};
use http_body_util::Full;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dataset {
    Random,
    SharedPrefix,
    Sharegpt,
}

#[derive(Args, Debug, Clone)]
pub struct ServeBenchArgs {
    /// The server, e.g. http://127.0.0.1:8000 (its /v1/completions is loaded).
    #[arg(long)]
    pub base_url: String,
    /// Bearer token for the server.
    #[arg(long, env = "OPENAI_API_KEY", default_value = "")]
    pub api_key: String,
    /// The served model's name (default: the first of /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, value_enum, default_value_t = Dataset::Random)]
    pub dataset: Dataset,
    /// Requests to send.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Prompt tokens of a request (random, shared-prefix: the part after the prefix).
    #[arg(long, default_value_t = 1024)]
    pub input_len: usize,
    /// Output tokens a request asks for.
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Lengths vary uniformly within ±this share of --input-len / --output-len.
    #[arg(long, default_value_t = 0.0)]
    pub range_ratio: f64,
    /// shared-prefix: groups of prompts with one prefix each.
    #[arg(long, default_value_t = 8)]
    pub num_prefixes: usize,
    /// shared-prefix: tokens of each group's prefix.
    #[arg(long, default_value_t = 512)]
    pub prefix_len: usize,
    /// Arrivals per second (Poisson); `inf`: every request at once.
    #[arg(long, default_value = "inf")]
    pub request_rate: f64,
    /// Most requests in flight (default: no limit).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Ask the server to generate every requested token (vLLM's `ignore_eos`).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Token ids prompts are drawn from: [low, high), valid in every vocabulary of the served
    /// families by default.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub id_range: Vec<u32>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the results (the summary and every request's record) as JSON here.
    #[arg(long)]
    pub json_out: Option<std::path::PathBuf>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

/// One request to send.
#[derive(Debug, Clone)]
struct Item {
    prompt: Vec<u32>,
    output_len: usize,
    at: Duration,
}

/// What one request measured.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct Record {
    input_len: usize,
    output_len: usize,
    prompt_tokens: u64,
    completion_tokens: u64,
    ttft_ms: f64,
    e2e_ms: f64,
    /// Gaps between successive chunks that carried text, after the first.
    itl_ms: Vec<f64>,
    error: Option<String>,
}

/// `len · (1 ± ratio)`, uniform, at least `min`.
fn around(rng: &mut Rng, len: usize, ratio: f64, min: usize) -> usize {
    let lo = (len as f64 * (1.0 - ratio)).floor();
    let hi = (len as f64 * (1.0 + ratio)).floor();
    ((lo + rng.uniform() * (hi - lo + 1.0)).floor() as usize).max(min)
}

/// A log-normal length with median `median` and log-space spread `sigma`, clipped.
fn log_normal(rng: &mut Rng, median: f64, sigma: f64, lo: usize, hi: usize) -> usize {
    ((median.ln() + sigma * rng.normal()).exp().round() as usize).clamp(lo, hi)
}

/// The requests of a run, with their arrival times.
fn workload(a: &ServeBenchArgs) -> anyhow::Result<Vec<Item>> {
    let [lo, hi] = a.id_range[..] else {
        bail!("--id-range is two numbers: low,high");
    };
    if lo >= hi {
        bail!("--id-range {lo},{hi}: low must be below high");
    }
    if !(0.0..1.0).contains(&a.range_ratio) {
        bail!("--range-ratio is in [0, 1)");
    }
    let mut rng = Rng::new(a.seed);
    let id = |rng: &mut Rng| lo + (rng.next_u64() % (hi - lo) as u64) as u32;
    let prefixes: Vec<Vec<u32>> = (0..a.num_prefixes.max(1))
        .map(|_| (0..a.prefix_len).map(|_| id(&mut rng)).collect())
        .collect();
    let mut at = Duration::ZERO;
    let mut items = Vec::with_capacity(a.num_prompts);
    for i in 0..a.num_prompts {
        let (input, output) = match a.dataset {
            Dataset::Random | Dataset::SharedPrefix => (
                around(&mut rng, a.input_len, a.range_ratio, 1),
                around(&mut rng, a.output_len, a.range_ratio, 1),
            ),
            Dataset::Sharegpt => (
                log_normal(&mut rng, 200.0, 1.0, 4, 4096),
                log_normal(&mut rng, 180.0, 0.9, 1, 2048),
            ),
        };
        let mut prompt = match a.dataset {
            Dataset::SharedPrefix => prefixes[i % prefixes.len()].clone(),
            _ => Vec::with_capacity(input),
        };
        prompt.extend((0..input).map(|_| id(&mut rng)));
        if a.request_rate.is_finite() && i > 0 {
            // Poisson arrivals: exponential gaps.
            let u = rng.uniform().max(1e-12);
            at += Duration::from_secs_f64(-u.ln() / a.request_rate);
        }
        items.push(Item {
            prompt,
            output_len: output,
            at,
        });
    }
    Ok(items)
}

/// A slot's connection to the server, made when first needed and again after the server
/// closes it.
struct Conn {
    authority: String,
    sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl Conn {
    fn new(authority: &str) -> Self {
        Conn {
            authority: authority.to_string(),
            sender: None,
        }
    }

    /// A sender ready for the next request on a live connection.
    async fn ready(
        &mut self,
    ) -> Result<&mut hyper::client::conn::http1::SendRequest<Full<Bytes>>, String> {
        if let Some(s) = &mut self.sender {
            if s.ready().await.is_err() {
                self.sender = None; // closed by the server: open another
            }
        }
        if self.sender.is_none() {
            let tcp = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(|e| format!("connecting to {}: {e}", self.authority))?;
            tcp.set_nodelay(true).map_err(|e| e.to_string())?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        Ok(self.sender.as_mut().expect("just made"))
    }

    /// Sends `req`; when the server closed the connection before the request went out (a
    /// kept-alive connection it timed out), once more on a new one.
    async fn send(
        &mut self,
        req: hyper::Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let mut req = Some(req);
        for _ in 0..2 {
            let r = req.take().expect("a request to send");
            match self.ready().await?.try_send_request(r).await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => {
                    self.sender = None;
                    match e.take_message() {
                        Some(unsent) => req = Some(unsent),
                        None => return Err(e.into_error().to_string()),
                    }
                }
            }
        }
        Err("the server closed two connections before the request went out".into())
    }
}

/// `host:port` of an `http://` base URL.
fn authority(base_url: &str) -> anyhow::Result<String> {
    let uri: hyper::Uri = base_url
        .parse()
        .with_context(|| format!("--base-url {base_url} is not a URL"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(h)) => Ok(format!("{h}:{}", uri.port_u16().unwrap_or(80))),
        (Some("https"), _) => bail!(
            "--base-url {base_url}: https is not spoken here yet; give the server's http:// address"
        ),
        _ => bail!("--base-url {base_url}: expected http://host:port"),
    }
}

/// One streamed completion on `conn`.
async fn one(conn: &mut Conn, a: &ServeBenchArgs, model: &str, it: &Item) -> Record {
    let mut rec = Record {
        input_len: it.prompt.len(),
        output_len: it.output_len,
        ..Default::default()
    };
    let body = serde_json::json!({
        "model": model, "prompt": it.prompt, "max_tokens": it.output_len, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": a.ignore_eos,
    });
    let mut req = hyper::Request::post("/v1/completions")
        .header("host", &conn.authority)
        .header("content-type", "application/json");
    if !a.api_key.is_empty() {
        req = req.header("authorization", format!("Bearer {}", a.api_key));
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("valid request");
    let t0 = Instant::now();
    let resp = match conn.send(req).await {
        Ok(r) => r,
        Err(e) => {
            conn.sender = None;
            rec.error = Some(e);
            return rec;
        }
    };
    if !resp.status().is_success() {
        rec.error = Some(http_client::error_text(resp).await);
        return rec;
    }
    let mut lines = http_client::Lines::new(resp.into_body());
    let mut last: Option<Instant> = None;
    let timeout = Duration::from_secs(a.timeout);
    loop {
        let line = match lines.next_within(timeout).await {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                rec.error = Some(e.to_string());
                return rec;
            }
        };
        let Some(data) = line.strip_prefix(b"data: ") else {
            continue;
        };
        if data == b"[DONE]" {
            continue; // read on to the body's end, so the connection is reused
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
            rec.error = Some(format!(
                "not JSON in the stream: {}",
                String::from_utf8_lossy(data)
            ));
            return rec;
        };
        if let Some(e) = v.get("error") {
            rec.error = Some(e.to_string());
            return rec;
        }
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        if !text.is_empty() {
            let now = Instant::now();
            match last {
                None => rec.ttft_ms = (now - t0).as_secs_f64() * 1e3,
                Some(p) => rec.itl_ms.push((now - p).as_secs_f64() * 1e3),
            }
            last = Some(now);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            rec.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
            rec.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
        }
    }
    rec.e2e_ms = t0.elapsed().as_secs_f64() * 1e3;
    if rec.completion_tokens == 0 && last.is_some() {
        rec.error = Some("the stream ended without a usage chunk".into());
    } else if rec.prompt_tokens != it.prompt.len() as u64 {
        rec.error = Some(format!(
            "the server counted {} prompt tokens for {} ids",
            rec.prompt_tokens,
            it.prompt.len()
        ));
    } else if last.is_none() {
        rec.ttft_ms = rec.e2e_ms; // nothing streamed: the answer was empty
    }
    rec
}

/// The served model's name: the first of /v1/models (its connection closed after: the run's
/// slots may take every connection the server allows one client).
async fn first_model(a: &ServeBenchArgs) -> anyhow::Result<String> {
    let client: Client = http_client::client(Duration::from_secs(10));
    let key = (!a.api_key.is_empty()).then_some(a.api_key.as_str());
    let req = http_client::request(
        "GET",
        &format!("{}/v1/models", a.base_url),
        key,
        Bytes::new(),
    );
    let resp = http_client::send(&client, req, Duration::from_secs(30))
        .await
        .with_context(|| format!("GET {}/v1/models", a.base_url))?;
    if !resp.status().is_success() {
        bail!(
            "GET {}/v1/models: {}",
            a.base_url,
            http_client::error_text(resp).await
        );
    }
    let body = http_client::read_body(resp).await?;
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .context("/v1/models lists no model: pass --model")
}

/// Mean, median and tail percentiles of one metric, vLLM's lines.
fn stats(name: &str, short: &str, xs: &[f64]) -> (String, serde_json::Value) {
    let mean = if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    };
    let ps = [50.0, 90.0, 95.0, 99.0].map(|p| (p, percentile(xs, p)));
    let mut text = format!("{:-^50}\n", name);
    text += &format!("{:<40}{:<10.2}\n", format!("Mean {short} (ms):"), mean);
    text += &format!("{:<40}{:<10.2}\n", format!("Median {short} (ms):"), ps[0].1);
    for (p, v) in &ps[1..] {
        text += &format!("{:<40}{:<10.2}\n", format!("P{p:.0} {short} (ms):"), v);
    }
    let mut j = serde_json::json!({"mean_ms": mean});
    for (p, v) in ps {
        j[format!("p{p:.0}_ms")] = v.into();
    }
    (text, j)
}

pub fn run(a: ServeBenchArgs) -> anyhow::Result<()> {
    let items = workload(&a)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let model = match &a.model {
            Some(m) => m.clone(),
            None => first_model(&a).await?,
        };
        let host = authority(&a.base_url)?;
        // Slots take the requests in arrival order, each waiting for its request's time.
        let n = items.len();
        let slots = a.max_concurrency.unwrap_or(n).clamp(1, n.max(1));
        let queue = Arc::new(std::sync::Mutex::new(
            items
                .into_iter()
                .enumerate()
                .collect::<std::collections::VecDeque<_>>(),
        ));
        let a = Arc::new(a);
        // Each finished request's record, by its index: what a SIGTERM / Ctrl-C reports.
        let finished: Arc<std::sync::Mutex<Vec<Option<Record>>>> =
            Arc::new(std::sync::Mutex::new(vec![None; n]));
        let start = tokio::time::Instant::now();
        let tasks: Vec<_> = (0..slots)
            .map(|_| {
                let (queue, a, model, host, finished) = (
                    queue.clone(),
                    a.clone(),
                    model.clone(),
                    host.clone(),
                    finished.clone(),
                );
                tokio::spawn(async move {
                    let mut conn = Conn::new(&host);
                    loop {
                        let next = queue.lock().expect("queue lock").pop_front();
                        let Some((i, it)) = next else { break };
                        tokio::time::sleep_until(start + it.at).await;
                        let r = one(&mut conn, &a, &model, &it).await;
                        finished.lock().expect("records lock")[i] = Some(r);
                    }
                })
            })
            .collect();
        let all_done = async {
            for t in tasks {
                t.await.context("a load slot panicked")?;
            }
            anyhow::Ok(())
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let interrupted = tokio::select! {
            r = all_done => { r?; false }
            _ = term.recv() => true,
            _ = tokio::signal::ctrl_c() => true,
        };
        let secs = start.elapsed().as_secs_f64();
        // Interrupted: the requests that finished, reported as a run of that length (the ones
        // in flight are dropped with the runtime).
        let recs: Vec<Record> = finished
            .lock()
            .expect("records lock")
            .iter()
            .flatten()
            .cloned()
            .collect();
        report(&a, &model, &recs, secs, interrupted.then_some(n))
    })
}

/// Prints (and writes, with `--json-out`) the report of `recs`; `interrupted`: the run was
/// stopped by a signal before all of its `Some(n)` requests finished.
fn report(
    a: &ServeBenchArgs,
    model: &str,
    recs: &[Record],
    secs: f64,
    interrupted: Option<usize>,
) -> anyhow::Result<()> {
    let ok: Vec<&Record> = recs.iter().filter(|r| r.error.is_none()).collect();
    let failed = recs.len() - ok.len();
    let input: u64 = ok.iter().map(|r| r.prompt_tokens).sum();
    let output: u64 = ok.iter().map(|r| r.completion_tokens).sum();
    let col = |f: &dyn Fn(&Record) -> f64| ok.iter().map(|r| f(r)).collect::<Vec<f64>>();
    let ttft = col(&|r| r.ttft_ms);
    // TPOT: a request's time after its first token over the tokens after it.
    let tpot: Vec<f64> = ok
        .iter()
        .filter(|r| r.completion_tokens > 1)
        .map(|r| (r.e2e_ms - r.ttft_ms) / (r.completion_tokens - 1) as f64)
        .collect();
    let itl: Vec<f64> = ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect();
    let e2e = col(&|r| r.e2e_ms);
    let mut text = format!("{:=^50}\n", " Serving Benchmark Result ");
    let line = |k: &str, v: String| format!("{k:<40}{v:<10}\n");
    if let Some(planned) = interrupted {
        text += &line(
            "Interrupted (signal): finished",
            format!("{} of {planned}", recs.len()),
        );
    }
    text += &line("Model:", model.to_string());
    text += &line("Dataset:", format!("{:?}", a.dataset).to_lowercase());
    text += &line(
        "Request rate (req/s):",
        if a.request_rate.is_finite() {
            format!("{}", a.request_rate)
        } else {
            "inf".into()
        },
    );
    text += &line(
        "Max concurrency:",
        a.max_concurrency.map_or("none".into(), |c| c.to_string()),
    );
    text += &line("Successful requests:", ok.len().to_string());
    text += &line("Failed requests:", failed.to_string());
    text += &line("Benchmark duration (s):", format!("{secs:.2}"));
    text += &line("Total input tokens:", input.to_string());
    text += &line("Total generated tokens:", output.to_string());
    let rps = ok.len() as f64 / secs;
    let out_tps = output as f64 / secs;
    let tot_tps = (input + output) as f64 / secs;
    text += &line("Request throughput (req/s):", format!("{rps:.2}"));
    text += &line("Output token throughput (tok/s):", format!("{out_tps:.2}"));
    text += &line("Total token throughput (tok/s):", format!("{tot_tps:.2}"));
    let mut j = serde_json::json!({
        "model": model, "dataset": format!("{:?}", a.dataset).to_lowercase(),
        "num_prompts": interrupted.unwrap_or(recs.len()), "completed": ok.len(), "failed": failed,
        "interrupted": interrupted.is_some(),
        "duration_s": secs, "total_input_tokens": input, "total_output_tokens": output,
        "request_throughput": rps, "output_throughput": out_tps, "total_token_throughput": tot_tps,
        "request_rate": if a.request_rate.is_finite() { serde_json::json!(a.request_rate) } else { serde_json::json!("inf") },
        "max_concurrency": a.max_concurrency,
    });
    for (name, short, key, xs) in [
        ("Time to First Token", "TTFT", "ttft", &ttft),
        (
            "Time per Output Token (excl. 1st token)",
            "TPOT",
            "tpot",
            &tpot,
        ),
        ("Inter-token Latency", "ITL", "itl", &itl),
        ("End-to-end Latency", "E2EL", "e2el", &e2e),
    ] {
        let (t, v) = stats(&format!(" {name} "), short, xs);
        text += &t;
        j[key] = v;
    }
    text += &"=".repeat(50);
    println!("{text}");
    if let Some(e) = recs.iter().find_map(|r| r.error.as_ref()) {
        eprintln!("{failed} request(s) failed; the first: {e}");
    }
    if let Some(p) = &a.json_out {
        j["requests"] = serde_json::to_value(recs)?;
        std::fs::write(p, serde_json::to_string_pretty(&j)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if ok.is_empty() {
        bail!("no request succeeded");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: ServeBenchArgs,
    }

    fn args(extra: &[&str]) -> ServeBenchArgs {
        let mut v = vec!["t", "--base-url", "http://x"];
        v.extend_from_slice(extra);
        T::parse_from(v).a
    }

    #[test]
    fn datasets_have_the_lengths_and_prefixes_asked_for() {
        let a = args(&[
            "--num-prompts",
            "40",
            "--input-len",
            "100",
            "--output-len",
            "10",
        ]);
        let w = workload(&a).unwrap();
        assert_eq!(w.len(), 40);
        assert!(w
            .iter()
            .all(|i| i.prompt.len() == 100 && i.output_len == 10));
        assert!(
            w.iter().all(|i| i.at == Duration::ZERO),
            "rate inf: all at once"
        );
        assert!(w
            .iter()
            .flat_map(|i| &i.prompt)
            .all(|&t| (1000..10000).contains(&t)));
        assert_ne!(
            w[0].prompt[..16],
            w[1].prompt[..16],
            "unique from the first block"
        );
        // The same seed, the same run.
        assert_eq!(workload(&a).unwrap()[7].prompt, w[7].prompt);

        let a = args(&[
            "--dataset",
            "shared-prefix",
            "--num-prompts",
            "8",
            "--num-prefixes",
            "2",
            "--prefix-len",
            "32",
            "--input-len",
            "8",
            "--range-ratio",
            "0.5",
            "--request-rate",
            "4",
        ]);
        let w = workload(&a).unwrap();
        assert!(w.iter().all(|i| (36..=44).contains(&i.prompt.len())));
        assert_eq!(w[0].prompt[..32], w[2].prompt[..32]);
        assert_ne!(w[0].prompt[..32], w[1].prompt[..32]);
        assert!(w.windows(2).all(|p| p[0].at <= p[1].at) && w[7].at > Duration::ZERO);

        let a = args(&["--dataset", "sharegpt", "--num-prompts", "2000"]);
        let w = workload(&a).unwrap();
        let mut ins: Vec<f64> = w.iter().map(|i| i.prompt.len() as f64).collect();
        ins.sort_by(f64::total_cmp);
        let median = ins[1000];
        assert!((150.0..270.0).contains(&median), "median input {median}");
        assert!(w.iter().all(|i| (1..=2048).contains(&i.output_len)));

        assert!(workload(&args(&["--id-range", "5,5"])).is_err());
    }

    #[test]
    fn the_base_url_gives_the_connection_its_address() {
        assert_eq!(
            authority("http://127.0.0.1:8000").unwrap(),
            "127.0.0.1:8000"
        );
        assert_eq!(authority("http://gpu-3").unwrap(), "gpu-3:80");
        let e = authority("https://x").unwrap_err().to_string();
        assert!(e.contains("http://"), "{e}");
        assert!(authority("localhost:8000/v1").is_err());
    }
}
