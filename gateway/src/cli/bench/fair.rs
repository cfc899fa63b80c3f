//! `cachet bench fair`: the noisy neighbour. Tenant A offers several times the engine's capacity,
//! tenant B a fifth of it; B's time to first token and the total throughput are measured under
//! first-come-first-served, today's default policy (priority classes: A and B in one class) and
//! token-fair sharing, side by side in one run, with B alone as the reference.
//!
//! The capacity is measured first (a burst of requests, completed per second). Each run starts a
//! fresh engine, offers Poisson arrivals for `--duration` seconds per tenant (random prompts, no
//! shared prefix; fixed output lengths), then waits for B's outstanding requests. Recorded: B's
//! TTFT (P50 / P95), requests refused at admission per tenant (the queue's limit), and the
//! tokens generated per second over the window. Results go to `--out` (`results.json`,
//! `report.md`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use cachet_backend::engine::EngineHandle;
use cachet_backend::request::{EngineEvent, EngineRequest};
use cachet_backend::rng::Rng;
use cachet_bench::workload::percentile;
use clap::Args;

use super::super::engine_args::{EngineArgs, StepLimits};

#[derive(Args, Debug)]
pub struct FairArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt tokens per request (random ids: no two requests share a prefix).
    #[arg(long, default_value_t = 256)]
    pub prompt_len: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 64)]
    pub output_len: usize,
    /// Seconds of arrivals per run.
    #[arg(long, default_value_t = 20.0)]
    pub duration: f64,
    /// Tenant A's offered load, in units of the measured capacity.
    #[arg(long, default_value_t = 5.0)]
    pub load_a: f64,
    /// Tenant B's offered load, in units of the measured capacity.
    #[arg(long, default_value_t = 0.2)]
    pub load_b: f64,
    /// Where the results and the report go.
    #[arg(long, default_value = "target/cachet-bench/fair")]
    pub out: PathBuf,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
struct Tenant {
    offered: usize,
    refused: usize,
    /// TTFT of each request that got a first token, seconds.
    ttft: Vec<f64>,
    /// Times the engine preempted this tenant's requests.
    preemptions: u32,
    /// Each finished request: when it was sent (seconds before the arrival window's end), its
    /// TTFT and the engine's split of it — to find what a slow one waited for.
    requests: Vec<RequestTrace>,
}

impl Tenant {
    /// The engine's `part` (queue or prefill) of the finished requests' TTFTs, seconds.
    fn engine_part(&self, part: fn(&RequestTrace) -> f64) -> Vec<f64> {
        self.requests.iter().map(part).collect()
    }
}

/// One finished request, seconds.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct RequestTrace {
    sent_before_end: f64,
    ttft: f64,
    /// Arrival → first scheduled.
    queue: f64,
    /// First scheduled → first token (prefill, with the waits between its chunks).
    prefill: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
struct RunResult {
    name: String,
    a: Tenant,
    b: Tenant,
    /// Tokens generated (both tenants) inside the arrival window, per second.
    tokens_per_s: f64,
}

/// One request: its first-token time and the tokens it produced before `end`.
async fn one(
    h: EngineHandle,
    req: EngineRequest,
    stats: Arc<Mutex<Tenant>>,
    tokens: Arc<Mutex<u64>>,
    end: Instant,
    keep_after_end: bool,
) {
    let t0 = Instant::now();
    stats.lock().unwrap().offered += 1;
    let mut s = match h.submit(req) {
        Ok(s) => s,
        Err(_) => {
            stats.lock().unwrap().refused += 1;
            return;
        }
    };
    let mut first = None;
    while let Some(ev) = s.next().await {
        if let EngineEvent::Finished { timings, .. } = &ev {
            let mut st = stats.lock().unwrap();
            st.preemptions += timings.preemptions;
            if let Some(ttft) = first {
                st.requests.push(RequestTrace {
                    sent_before_end: end.saturating_duration_since(t0).as_secs_f64(),
                    ttft,
                    queue: timings.queue.as_secs_f64(),
                    prefill: timings.prefill.as_secs_f64(),
                });
            }
        }
        if let EngineEvent::Token { at, .. } = ev {
            if first.is_none() {
                let ttft = at.saturating_duration_since(t0).as_secs_f64();
                stats.lock().unwrap().ttft.push(ttft);
                first = Some(ttft);
            }
            if at <= end {
                *tokens.lock().unwrap() += 1;
            } else if !keep_after_end {
                return; // dropping the stream cancels the request
            }
        }
    }
}

/// One tenant's traffic: its tag, its Poisson rate per second, the seed of its prompts and
/// arrivals, and where its requests' timings go.
struct Traffic {
    tag: &'static str,
    rate: f64,
    seed: u64,
    stats: Arc<Mutex<Tenant>>,
}

/// `t`'s arrivals for `--duration` from `start`, each request a fresh random prompt of `vocab`
/// ids; every token streamed inside the window counted in `tokens`.
async fn arrivals(
    h: EngineHandle,
    t: Traffic,
    a: &FairArgs,
    vocab: u32,
    tokens: Arc<Mutex<u64>>,
    start: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    let Traffic {
        tag,
        rate,
        seed,
        stats,
    } = t;
    let mut rng = Rng::new(seed);
    let end = start + Duration::from_secs_f64(a.duration);
    let mut at = start;
    let mut tasks = Vec::new();
    if rate <= 0.0 {
        return tasks;
    }
    loop {
        at += Duration::from_secs_f64(-(1.0 - rng.uniform()).ln() / rate);
        if at >= end {
            return tasks;
        }
        tokio::time::sleep_until(at.into()).await;
        let prompt: Vec<u32> = (0..a.prompt_len)
            .map(|_| (rng.next_u64() % vocab as u64) as u32)
            .collect();
        let mut req = EngineRequest::new(prompt, a.output_len);
        req.ignore_eos = true;
        req.tag = tag.into();
        // B is measured to its end; A's requests stop at the window's end.
        tasks.push(tokio::spawn(one(
            h.clone(),
            req,
            stats.clone(),
            tokens.clone(),
            end,
            tag == "b",
        )));
    }
}

/// One configuration: A at `load_a` capacities (0: B alone) and B; under fair sharing with a
/// prefill cap of `cap` tokens.
fn run_one(
    a: &FairArgs,
    name: &str,
    policy: &str,
    fair: bool,
    capacity: f64,
    load_a: f64,
    cap: usize,
) -> anyhow::Result<RunResult> {
    let mut e = a.engine.clone();
    e.scheduling_policy = policy.into();
    e.fair_share = fair;
    e.fair_prefill_cap = cap;
    let started = e.start([1; 32])?;
    let h = started.engine.handle();
    let vocab = started.tokenizer.vocab_size() as u32;
    warm_up(&h, a)?;
    let rt = tokio::runtime::Runtime::new()?;
    let (sa, sb) = (
        Arc::new(Mutex::new(Tenant::default())),
        Arc::new(Mutex::new(Tenant::default())),
    );
    let tokens = Arc::new(Mutex::new(0u64));
    rt.block_on(async {
        let start = Instant::now() + Duration::from_millis(100);
        let traffic = |tag, rate, seed, stats: &Arc<Mutex<Tenant>>| Traffic {
            tag,
            rate,
            seed,
            stats: stats.clone(),
        };
        let fa = arrivals(
            h.clone(),
            traffic("a", load_a * capacity, 11, &sa),
            a,
            vocab,
            tokens.clone(),
            start,
        );
        let fb = arrivals(
            h.clone(),
            traffic("b", a.load_b * capacity, 22, &sb),
            a,
            vocab,
            tokens.clone(),
            start,
        );
        let (ta, tb) = tokio::join!(fa, fb);
        // B's requests run to their end; A's stop at the window's.
        for t in tb {
            let _ = t.await;
        }
        for t in ta {
            t.abort();
        }
    });
    let r = RunResult {
        name: name.into(),
        a: sa.lock().unwrap().clone(),
        b: sb.lock().unwrap().clone(),
        tokens_per_s: *tokens.lock().unwrap() as f64 / a.duration,
    };
    drop(rt);
    drop(started);
    Ok(r)
}

/// A request run before measuring: a fresh engine's first steps cost more.
fn warm_up(h: &EngineHandle, a: &FairArgs) -> anyhow::Result<()> {
    let mut r = EngineRequest::new(vec![1; a.prompt_len], 2);
    r.ignore_eos = true;
    let mut w = h.submit(r)?;
    while w.next_blocking().is_some() {}
    Ok(())
}

/// Completed requests per second of a burst of `n` requests (closed: all at once), and the step
/// limits the engine ran with.
fn capacity(a: &FairArgs) -> anyhow::Result<(f64, StepLimits)> {
    let mut e = a.engine.clone();
    e.scheduling_policy = "fcfs".into();
    let started = e.start([1; 32])?;
    let h = started.engine.handle();
    let vocab = started.tokenizer.vocab_size() as u64;
    let limits = started.limits;
    let n = (2 * limits.max_num_seqs).max(8);
    let mut rng = Rng::new(5);
    warm_up(&h, a)?;
    let t0 = Instant::now();
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let prompt = (0..a.prompt_len)
            .map(|_| (rng.next_u64() % vocab) as u32)
            .collect();
        let mut r = EngineRequest::new(prompt, a.output_len);
        r.ignore_eos = true;
        streams.push(
            h.submit(r)
                .context("the capacity burst exceeds the queue")?,
        );
    }
    for mut s in streams {
        while s.next_blocking().is_some() {}
    }
    Ok((n as f64 / t0.elapsed().as_secs_f64(), limits))
}

pub fn run(a: FairArgs) -> anyhow::Result<()> {
    let (cap, limits) = capacity(&a)?;
    println!(
        "capacity: {cap:.2} requests/s ({} prompt + {} output tokens)",
        a.prompt_len, a.output_len
    );
    // B alone; B beside a neighbour that keeps within what the engine can do (the cost of
    // sharing a busy engine at all); then the flood under each policy.
    let prefill_cap = a.engine.fair_prefill_cap;
    let within = (1.0 - a.load_b).max(0.1);
    let runs = [
        ("B alone", "fcfs", false, 0.0, 0),
        (
            "B beside A within capacity (FCFS)",
            "fcfs",
            false,
            within,
            0,
        ),
        ("FCFS", "fcfs", false, a.load_a, 0),
        ("priority (today's default)", "priority", false, a.load_a, 0),
        ("fair share, no prefill cap", "priority", true, a.load_a, 0),
        ("fair share", "priority", true, a.load_a, prefill_cap),
    ];
    let mut results = Vec::new();
    for (name, policy, fair, load_a, prefill_cap) in runs {
        if name == "fair share, no prefill cap" && a.engine.fair_prefill_cap == 0 {
            continue; // the same run as the last
        }
        let r = run_one(&a, name, policy, fair, cap, load_a, prefill_cap)?;
        println!(
            "{name}: B TTFT p50 {:.3} s p95 {:.3} s ({} of {} refused; in the engine: queue p50 \
             {:.3} / p95 {:.3} s, prefill p50 {:.3} / p95 {:.3} s, {} preemptions), A {} of {} \
             refused, {:.0} tokens/s",
            percentile(&r.b.ttft, 50.0),
            percentile(&r.b.ttft, 95.0),
            r.b.refused,
            r.b.offered,
            percentile(&r.b.engine_part(|t| t.queue), 50.0),
            percentile(&r.b.engine_part(|t| t.queue), 95.0),
            percentile(&r.b.engine_part(|t| t.prefill), 50.0),
            percentile(&r.b.engine_part(|t| t.prefill), 95.0),
            r.b.preemptions,
            r.a.refused,
            r.a.offered,
            r.tokens_per_s
        );
        results.push(r);
    }
    let alone = percentile(&results[0].b.ttft, 95.0);
    let fcfs_tput = results
        .iter()
        .find(|r| r.name == "FCFS")
        .map_or(1.0, |r| r.tokens_per_s);
    let mut md = format!(
        "# Noisy neighbour: tenant A at {}× capacity, B at {}×\n\n\
         capacity {cap:.2} requests/s ({} prompt + {} output tokens, `--max-num-seqs {}`, `--fair-prefill-cap {prefill_cap}`), {} s of arrivals per run\n\n\
         | run | B TTFT P50 (s) | B TTFT P95 (s) | B P95 / alone | B refused | A refused | tokens/s | / FCFS |\n\
         |---|---|---|---|---|---|---|---|\n",
        a.load_a, a.load_b, a.prompt_len, a.output_len, limits.max_num_seqs, a.duration
    );
    for r in &results {
        let p95 = percentile(&r.b.ttft, 95.0);
        md.push_str(&format!(
            "| {} | {:.3} | {:.3} | {} | {} / {} | {} / {} | {:.0} | {} |\n",
            r.name,
            percentile(&r.b.ttft, 50.0),
            p95,
            // No ratio without a B request alone (too short a window for B's rate).
            if alone > 0.0 {
                format!("{:.2}×", p95 / alone)
            } else {
                "—".to_string()
            },
            r.b.refused,
            r.b.offered,
            r.a.refused,
            r.a.offered,
            r.tokens_per_s,
            // Only the floods offer the same load as FCFS.
            if r.name.starts_with("B ") {
                "—".to_string()
            } else {
                format!("{:.2}×", r.tokens_per_s / fcfs_tput)
            }
        ));
    }
    std::fs::create_dir_all(&a.out)?;
    std::fs::write(a.out.join("report.md"), &md)?;
    std::fs::write(
        a.out.join("results.json"),
        serde_json::to_string_pretty(&serde_json::json!({"capacity": cap, "runs": results}))?,
    )?;
    println!("\n{md}");
    Ok(())
}

/// `cachet bench cache-share`: a tenant scanning unique long prompts against another tenant's
/// hot prefix, with one LRU for everyone and with cache shares.
#[derive(Args, Debug)]
pub struct CacheShareArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// The hot tenant's shared prefix, tokens.
    #[arg(long, default_value_t = 512)]
    pub prefix_len: usize,
    /// The hot tenant's unique suffix per request, tokens.
    #[arg(long, default_value_t = 16)]
    pub suffix_len: usize,
    /// Seconds between the hot tenant's requests.
    #[arg(long, default_value_t = 1.0)]
    pub hot_interval: f64,
    /// The scanning tenant's prompts (unique), tokens.
    #[arg(long, default_value_t = 1024)]
    pub scan_len: usize,
    /// The scanning tenant's concurrent streams of requests, back to back.
    #[arg(long, default_value_t = 2)]
    pub scanners: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    #[arg(long, default_value = "target/cachet-bench/cache-share")]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
struct HotResult {
    name: String,
    requests: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    scan_requests: usize,
}

fn random_ids(rng: &mut Rng, n: usize, vocab: u32) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// Runs one request to its end; its usage.
fn finish(h: &EngineHandle, prompt: Vec<u32>, tag: &str) -> Option<cachet_backend::request::Usage> {
    let mut r = EngineRequest::new(prompt, 1);
    r.ignore_eos = true;
    r.tag = tag.into();
    let mut s = h.submit(r).ok()?;
    let mut usage = None;
    while let Some(ev) = s.next_blocking() {
        if let EngineEvent::Finished { usage: u, .. } = ev {
            usage = Some(u);
        }
    }
    usage
}

fn cache_run(
    a: &CacheShareArgs,
    name: &str,
    shares: bool,
    scan: bool,
) -> anyhow::Result<HotResult> {
    let mut e = a.engine.clone();
    e.cache_shares = shares;
    let started = e.start([1; 32])?;
    let h = started.engine.handle();
    let vocab = started.tokenizer.vocab_size() as u32;
    let end = Instant::now() + Duration::from_secs_f64(a.duration);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scans = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut threads = Vec::new();
    if scan {
        for k in 0..a.scanners {
            let (h, stop, scans) = (h.clone(), stop.clone(), scans.clone());
            let len = a.scan_len;
            threads.push(std::thread::spawn(move || {
                let mut rng = Rng::new(100 + k as u64);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if finish(&h, random_ids(&mut rng, len, vocab), "scan").is_some() {
                        scans.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    let mut rng = Rng::new(7);
    let prefix = random_ids(&mut rng, a.prefix_len, vocab);
    let mut r = HotResult {
        name: name.into(),
        ..Default::default()
    };
    // The first request fills the cache; the rest are measured.
    let mut first = true;
    while Instant::now() < end {
        let t0 = Instant::now();
        let mut p = prefix.clone();
        p.extend(random_ids(&mut rng, a.suffix_len, vocab));
        if let Some(u) = finish(&h, p, "hot") {
            if !first {
                r.requests += 1;
                r.prompt_tokens += u.prompt_tokens;
                r.cached_tokens += u.cached_tokens;
            }
            first = false;
        }
        let next = t0 + Duration::from_secs_f64(a.hot_interval);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    r.scan_requests = scans.load(std::sync::atomic::Ordering::Relaxed);
    Ok(r)
}

pub fn run_cache_share(a: CacheShareArgs) -> anyhow::Result<()> {
    let runs = [
        ("hot tenant alone", true, false),
        ("with the scan, one LRU", false, true),
        ("with the scan, cache shares", true, true),
    ];
    let mut results = Vec::new();
    for (name, shares, scan) in runs {
        let r = cache_run(&a, name, shares, scan)?;
        println!(
            "{name}: hot hit rate {:.1}% over {} requests ({} scan requests)",
            100.0 * r.cached_tokens as f64 / r.prompt_tokens.max(1) as f64,
            r.requests,
            r.scan_requests
        );
        results.push(r);
    }
    let rate = |r: &HotResult| 100.0 * r.cached_tokens as f64 / r.prompt_tokens.max(1) as f64;
    let alone = rate(&results[0]);
    let mut md = format!(
        "# Cache shares: a scanning tenant against another's hot prefix\n\n\
         hot tenant: a {}-token prefix + {} unique tokens every {} s; scanning tenant: {} streams of unique {}-token prompts; KV blocks: {}; {} s per run\n\n\
         | run | hot prefix hit rate | points vs alone | hot requests | scan requests |\n|---|---|---|---|---|\n",
        a.prefix_len,
        a.suffix_len,
        a.hot_interval,
        a.scanners,
        a.scan_len,
        a.engine
            .num_gpu_blocks_override
            .map_or("sized from memory".to_string(), |n| n.to_string()),
        a.duration
    );
    for r in &results {
        md.push_str(&format!(
            "| {} | {:.1}% | {:+.1} | {} | {} |\n",
            r.name,
            rate(r),
            rate(r) - alone,
            r.requests,
            r.scan_requests
        ));
    }
    std::fs::create_dir_all(&a.out)?;
    std::fs::write(a.out.join("report.md"), &md)?;
    std::fs::write(
        a.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    println!("\n{md}");
    Ok(())
}
