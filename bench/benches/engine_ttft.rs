//! The seed experiment on the CPU device with SmolLM2: TTFT and its parts (queue, prefill), cold
//! and warm, for (a) prefix caching off, FCFS, no chunked prefill vs (b) everything on; then
//! shortest-first vs FCFS queue time on a mix of long and short prompts. Same workload, one run.
//!
//!     cargo bench -p cachet-bench --bench engine_ttft
//!
//! `RATE=<req/s>` and `N=<requests>` change the load.

use std::time::{Duration, Instant};

use cachet_backend::engine::{Engine, EngineConfig, EngineHandle};
use cachet_backend::loader::{self, fetch, LoadedModel};
use cachet_backend::model::runner::cpu_runner;
use cachet_backend::request::{EngineEvent, EngineRequest, RequestTimings, Usage};
use cachet_backend::scheduler::{SchedulerConfig, SchedulingPolicy};
use cachet_backend::tokenizer::ChatMessage;
use cachet_bench::workload::{percentile, seed_workload, SeedWorkloadConfig, WorkItem};

struct Run {
    timings: Vec<RequestTimings>,
    usage: Vec<Usage>,
    prompt_lens: Vec<usize>,
    wall: Duration,
}

fn encode(m: &LoadedModel, w: &WorkItem) -> Vec<u32> {
    let tok = m.tokenizer.as_ref().unwrap();
    let msgs = [
        ChatMessage::new("system", &w.system),
        ChatMessage::new("user", &w.user),
    ];
    tok.encode(&tok.render_chat(&msgs, true).unwrap()).unwrap()
}

/// Replays `items` with their arrival times (open loop) and waits for all of them.
fn replay(h: &EngineHandle, prompts: &[Vec<u32>], items: &[WorkItem]) -> Run {
    let t0 = Instant::now();
    let mut joins = Vec::new();
    for (p, w) in prompts.iter().zip(items) {
        if let Some(wait) = w.at.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
        let mut r = EngineRequest::new(p.clone(), w.max_tokens);
        r.ignore_eos = true;
        let mut s = h.submit(r).expect("submit");
        joins.push(std::thread::spawn(move || loop {
            match s.next_blocking() {
                Some(EngineEvent::Finished { timings, usage, .. }) => return (timings, usage),
                Some(_) => {}
                None => panic!("stream ended early"),
            }
        }));
    }
    let (timings, usage) = joins.into_iter().map(|j| j.join().unwrap()).unzip();
    Run {
        timings,
        usage,
        prompt_lens: prompts.iter().map(|p| p.len()).collect(),
        wall: t0.elapsed(),
    }
}

fn start(m: &LoadedModel, cfg: EngineConfig) -> Engine {
    let r = cpu_runner(&m.config, &m.weights, 512, 16, 4096).unwrap();
    Engine::start(r, m.tokenizer.clone(), cfg)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(name: &str, run: &Run) {
    let q: Vec<f64> = run.timings.iter().map(|t| ms(t.queue)).collect();
    let p: Vec<f64> = run.timings.iter().map(|t| ms(t.prefill)).collect();
    let t: Vec<f64> = run.timings.iter().map(|t| ms(t.ttft)).collect();
    let hit: usize = run.usage.iter().map(|u| u.cached_tokens).sum();
    let total: usize = run.usage.iter().map(|u| u.prompt_tokens).sum();
    println!(
        "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1}% | {:.1} |",
        percentile(&t, 50.0),
        percentile(&t, 95.0),
        percentile(&q, 50.0),
        percentile(&q, 95.0),
        percentile(&p, 50.0),
        percentile(&p, 95.0),
        100.0 * hit as f64 / total as f64,
        run.timings.len() as f64 / run.wall.as_secs_f64(),
    );
}

fn main() {
    let path = fetch::fetch(fetch::known_model("smollm2").unwrap(), true).unwrap();
    let m = loader::load(path.to_str().unwrap(), false).unwrap();
    let rate: f64 = std::env::var("RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.8);
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let wl = SeedWorkloadConfig {
        num_requests: n,
        rate,
        short_user_words: (70, 90),
        long_user_words: (120, 160),
        ..Default::default()
    };
    let part = std::env::var("PART").unwrap_or_default();
    let items = seed_workload(&wl);
    let prompts: Vec<Vec<u32>> = items.iter().map(|w| encode(&m, w)).collect();
    // Shared prefix: what the first prompt has in common with the same system prompt and another
    // user input.
    let other = encode(
        &m,
        &WorkItem {
            user: "x".into(),
            ..items[0].clone()
        },
    );
    let shared = prompts[0]
        .iter()
        .zip(&other)
        .take_while(|(x, y)| x == y)
        .count();
    let mean_len = prompts.iter().map(|p| p.len()).sum::<usize>() as f64 / prompts.len() as f64;
    // Warm-up pass: same shared prefix, other user inputs, run before the measured pass.
    let warm_items = seed_workload(&SeedWorkloadConfig {
        num_requests: 4,
        seed: 99,
        rate: 100.0,
        ..wl.clone()
    });
    let warm_prompts: Vec<Vec<u32>> = warm_items.iter().map(|w| encode(&m, w)).collect();

    let baseline = EngineConfig {
        enable_prefix_caching: false,
        scheduler: SchedulerConfig {
            enable_chunked_prefill: false,
            policy: SchedulingPolicy::Fcfs,
            max_num_batched_tokens: 2048,
            ..Default::default()
        },
        ..Default::default()
    };
    let all_on = EngineConfig {
        enable_prefix_caching: true,
        scheduler: SchedulerConfig {
            enable_chunked_prefill: true,
            policy: SchedulingPolicy::ShortestFirst,
            max_num_batched_tokens: 256,
            ..Default::default()
        },
        ..Default::default()
    };
    println!("SmolLM2-135M on the CPU ({} threads); {n} requests, Poisson {rate} req/s, {} output tokens each; \
              mean prompt {mean_len:.0} tokens, shared prefix {shared} tokens ({:.0}%).\n",
        rayon::current_num_threads(), wl.max_tokens, 100.0 * shared as f64 / mean_len);
    println!("| configuration | TTFT P50 (ms) | TTFT P95 | queue P50 | queue P95 | prefill P50 | prefill P95 | prefix hit | req/s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut p95 = Vec::new();
    let seed_part = if part == "mix" {
        vec![]
    } else {
        vec![("baseline", &baseline), ("all on", &all_on)]
    };
    for (name, cfg) in seed_part {
        for warm in [false, true] {
            let e = start(&m, cfg.clone());
            let h = e.handle();
            if warm {
                replay(&h, &warm_prompts, &warm_items);
            }
            let run = replay(&h, &prompts, &items);
            row(
                &format!("{name}, {}", if warm { "warm" } else { "cold" }),
                &run,
            );
            p95.push(percentile(
                &run.timings.iter().map(|t| ms(t.ttft)).collect::<Vec<_>>(),
                95.0,
            ));
            let _ = run.prompt_lens;
        }
    }
    if p95.len() == 4 {
        println!(
            "\nP95 TTFT cut, all on vs baseline: cold {:.0}%, warm {:.0}%",
            100.0 * (1.0 - p95[2] / p95[0]),
            100.0 * (1.0 - p95[3] / p95[1])
        );
    }

    policy_mix(&m, n, rate);
}

/// Shortest-first against FCFS, chunked prefill off and on, on a long/short mix of `n` prompts
/// with no shared prefix (prefix caching off): queue time and TTFT, short prompts apart.
fn policy_mix(m: &LoadedModel, n: usize, rate: f64) {
    let mix_cfg = SeedWorkloadConfig {
        num_requests: n,
        rate: rate * 1.5,
        seed: 3,
        short_user_words: (5, 15),
        long_user_words: (250, 350),
        long_fraction: 0.35,
        max_tokens: 4,
        volatile_header: false,
    };
    let mix = seed_workload(&mix_cfg);
    let tok = m.tokenizer.as_ref().unwrap();
    let mix_prompts: Vec<Vec<u32>> = mix.iter().map(|w| tok.encode(&w.user).unwrap()).collect();
    println!("\nQueue time on a long/short mix ({} requests, {:.0}% long, Poisson {:.2} req/s), prefix caching off:\n", n, 100.0 * mix_cfg.long_fraction, mix_cfg.rate);
    println!("| policy | chunked prefill | queue P50 (ms) | queue P95 | short-prompt queue P95 | short-prompt TTFT P95 | TTFT P95 |");
    println!("|---|---|---|---|---|---|---|");
    for (name, policy, chunked) in [
        ("fcfs", SchedulingPolicy::Fcfs, false),
        ("shortest-first", SchedulingPolicy::ShortestFirst, false),
        ("fcfs", SchedulingPolicy::Fcfs, true),
        ("shortest-first", SchedulingPolicy::ShortestFirst, true),
    ] {
        let cfg = EngineConfig {
            enable_prefix_caching: false,
            scheduler: SchedulerConfig {
                policy,
                max_num_batched_tokens: 512,
                enable_chunked_prefill: chunked,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = start(m, cfg);
        let run = replay(&e.handle(), &mix_prompts, &mix);
        let q: Vec<f64> = run.timings.iter().map(|t| ms(t.queue)).collect();
        let short_q: Vec<f64> = run
            .timings
            .iter()
            .zip(&run.prompt_lens)
            .filter(|(_, &l)| l < 100)
            .map(|(t, _)| ms(t.queue))
            .collect();
        let t: Vec<f64> = run.timings.iter().map(|t| ms(t.ttft)).collect();
        let short_t: Vec<f64> = run
            .timings
            .iter()
            .zip(&run.prompt_lens)
            .filter(|(_, &l)| l < 100)
            .map(|(t, _)| ms(t.ttft))
            .collect();
        println!(
            "| {name} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            if chunked { "on" } else { "off" },
            percentile(&q, 50.0),
            percentile(&q, 95.0),
            percentile(&short_q, 95.0),
            percentile(&short_t, 95.0),
            percentile(&t, 95.0)
        );
    }
}
