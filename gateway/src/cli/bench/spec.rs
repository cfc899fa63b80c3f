//! `cachet bench spec`: n-gram speculative decoding off vs on, measured side by side in one run,
//! on a copy-heavy workload (answers that quote their input) and a free-chat one, at batch 1
//! and at a high batch: tokens per forward pass, decode tokens/s, and whether the greedy output
//! is identical — on the f32 CPU it must be; a bf16 device rounds a 1-row step and a
//! verification step differently, so where outputs part the table gives how near a tie the model
//! was there (the further token's distance below the top logit, from a fresh forward pass).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use cachet_backend::engine::{Engine, EngineConfig};
use cachet_backend::model::runner::{
    build_runner, KvBudget, RunnerOptions, VerifyGraphs, WeightSource, DEFAULT_CUDA_GRAPH_SIZES,
};
use cachet_backend::request::{EngineEvent, EngineRequest};
use cachet_backend::scheduler::SchedulerConfig;
use cachet_backend::spec::SpecConfig;
use cachet_backend::tokenizer::ChatMessage;
use cachet_bench::fidelity;
use cachet_bench::workload::{COPY_HEAVY, FREE_CHAT};
use clap::Args;

use super::super::engine_args::LoadFormat;

#[derive(Args, Debug)]
pub struct SpecArgs {
    #[command(flatten)]
    pub m: super::BenchModelArgs,
    /// Share of device memory for weights + KV cache.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Tokens generated per request (greedy; with dummy weights end-of-text is ignored).
    #[arg(long, default_value_t = 96)]
    pub max_tokens: usize,
    /// Concurrent requests of the high-load run (each workload's prompts, repeated).
    #[arg(long, default_value_t = 48)]
    pub high_batch: usize,
    /// The speculation measured against none (vLLM's JSON form).
    #[arg(
        long,
        default_value = r#"{"method": "ngram", "num_speculative_tokens": 4}"#
    )]
    pub speculative_config: String,
    #[arg(long, default_value_t = 4096)]
    pub max_model_len: usize,
    /// Run verification steps eagerly (capture CUDA graphs for plain decode steps only), for
    /// comparison with the default.
    #[arg(long)]
    pub eager_verification: bool,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

/// One configuration's measurements.
struct Run {
    outputs: Vec<Vec<u32>>,
    generated: usize,
    /// Decode steps: every step but each request's (single) prefill step (meaningful when the
    /// requests ran one at a time).
    decode_steps: u64,
    decode_tokens: usize,
    decode_secs: f64,
    wall_secs: f64,
    drafts: u64,
    accepted: u64,
    /// Measured verification-step time over plain-step time (the stand-down's cost model).
    cost_ratio: f64,
}

fn collect(mut s: cachet_backend::engine::RequestStream) -> anyhow::Result<(Vec<u32>, f64)> {
    let mut tokens = Vec::new();
    loop {
        match s.next_blocking() {
            Some(EngineEvent::Token { id, .. }) => tokens.push(id),
            Some(EngineEvent::Finished { timings, error, .. }) => {
                if let Some(e) = error {
                    bail!("request failed: {e}");
                }
                return Ok((tokens, (timings.e2e - timings.ttft).as_secs_f64()));
            }
            None => bail!("the engine stopped"),
        }
    }
}

pub fn run(a: SpecArgs) -> anyhow::Result<()> {
    let spec: SpecConfig = serde_json::from_str(&a.speculative_config)
        .context("--speculative-config must be a JSON object")?;
    spec.validate().map_err(anyhow::Error::msg)?;
    let dummy = a.m.load_format == LoadFormat::Dummy;
    let (config, host, tokenizer) = a.m.load()?;
    let encode = |q: &str| -> anyhow::Result<Vec<u32>> {
        let text = tokenizer.render_chat(&[ChatMessage::new("user", q)], true)?;
        let ids = tokenizer.encode(&text)?;
        Ok(ids
            .into_iter()
            .map(|t| t % config.vocab_size as u32)
            .collect())
    };
    // A runner of the model on the chosen device with this KV budget and these decode graphs.
    let runner = |kv: KvBudget, cuda_graph_sizes: Vec<usize>, verify: Option<VerifyGraphs>| {
        let weights = match &host {
            Some(m) => WeightSource::Host(&m.weights),
            None => WeightSource::Dummy { seed: 0 },
        };
        let opts = RunnerOptions {
            device: a.m.device.into(),
            block_size: 16,
            max_model_len: a.max_model_len,
            fit_max_model_len: false,
            kv,
            cuda_graph_sizes,
            cuda_graph_verify: verify,
            kv_cache_dtype: Default::default(),
            quantization: Default::default(),
            tensor_parallel_size: 1,
            kv_calibration: Vec::new(),
        };
        build_runner(&config, weights, &opts)
    };
    let start = |speculative: Option<SpecConfig>| -> anyhow::Result<Engine> {
        let verify = speculative
            .as_ref()
            .filter(|_| !a.eager_verification)
            .map(VerifyGraphs::for_spec);
        let runner = runner(
            KvBudget::MemoryFraction(a.gpu_memory_utilization),
            DEFAULT_CUDA_GRAPH_SIZES.to_vec(),
            verify,
        )?;
        Ok(Engine::start(
            runner,
            Some(tokenizer.clone()),
            EngineConfig {
                scheduler: SchedulerConfig {
                    max_num_seqs: a.high_batch.max(64),
                    max_model_len: a.max_model_len,
                    ..Default::default()
                },
                speculative,
                max_waiting: 100_000,
                ..Default::default()
            },
        ))
    };
    let request = |p: &Vec<u32>| {
        let mut r = EngineRequest::new(p.clone(), a.max_tokens);
        r.ignore_eos = dummy;
        r
    };
    // One engine per configuration, the same prompts through each, one at a time then all at once.
    let measure = |prompts: &[Vec<u32>], speculative: Option<SpecConfig>, concurrent: usize| {
        let engine = start(speculative)?;
        let h = engine.handle();
        let t0 = Instant::now();
        let mut results = Vec::new();
        if concurrent <= 1 {
            for p in prompts {
                results.push(collect(h.submit(request(p))?)?);
            }
        } else {
            let streams = prompts
                .iter()
                .cycle()
                .take(concurrent)
                .map(|p| h.submit(request(p)))
                .collect::<Result<Vec<_>, _>>()?;
            for s in streams {
                results.push(collect(s)?);
            }
        }
        let wall_secs = t0.elapsed().as_secs_f64();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let stats = h.stats();
        let c = stats.counters;
        let generated: usize = results.iter().map(|r| r.0.len()).sum();
        anyhow::Ok(Run {
            decode_tokens: results.iter().map(|r| r.0.len().saturating_sub(1)).sum(),
            decode_secs: results.iter().map(|r| r.1).sum(),
            outputs: results.into_iter().map(|r| r.0).collect(),
            generated,
            decode_steps: c.steps.saturating_sub(prompts.len() as u64),
            wall_secs,
            drafts: c.spec_draft_tokens,
            accepted: c.spec_accepted_tokens,
            cost_ratio: stats.spec_cost_ratio,
        })
    };
    print_setup(&a, dummy);
    // A throwaway run first, so neither configuration pays for a cold start.
    measure(&[encode(COPY_HEAVY[0])?], None, 1)?;
    println!("| workload | batch | tokens / forward off → on | decode tok/s off → on | on / off | drafts accepted | greedy output identical |");
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (name, texts) in [("copy-heavy", COPY_HEAVY), ("free chat", FREE_CHAT)] {
        let prompts = texts
            .iter()
            .map(|q| encode(q))
            .collect::<anyhow::Result<Vec<_>>>()?;
        for batch in [1, a.high_batch] {
            let off = measure(&prompts, None, batch)?;
            let on = measure(&prompts, Some(spec.clone()), batch)?;
            let identical = off.outputs == on.outputs;
            // Where outputs part (a bf16 device rounds a 1-row and a multi-row step
            // differently), how near a tie the model was there.
            let divergences = if identical {
                Vec::new()
            } else {
                let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + a.max_tokens;
                let mut probe =
                    runner(KvBudget::Blocks(longest.div_ceil(16) + 1), Vec::new(), None)?;
                let mut found = Vec::new();
                for (i, (x, y)) in off.outputs.iter().zip(&on.outputs).enumerate() {
                    let p = &prompts[i % prompts.len()];
                    if let Some(d) = fidelity::greedy_divergence(probe.as_mut(), p, x, y)? {
                        found.push(d);
                    }
                }
                found
            };
            rows.push(report(name, batch, &off, &on, divergences));
        }
    }
    if let Some(p) = &a.json_out {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}

/// What is measured: the model, its weights, the device, the lengths and the speculation.
fn print_setup(a: &SpecArgs, dummy: bool) {
    println!(
        "model {} ({}), device {:?}, {} tokens per request, speculation {}, verification steps {}\n",
        a.m.model,
        if dummy {
            "dummy weights"
        } else {
            "real weights"
        },
        a.m.device,
        a.max_tokens,
        a.speculative_config,
        if a.eager_verification {
            "eager"
        } else {
            "from CUDA graphs where the device has them"
        }
    );
}

/// One row of the table (printed) and of the JSON output: workload `name` at `batch`, without
/// speculation (`off`) and with it (`on`); `divergences`: where their greedy outputs part.
fn report(
    name: &str,
    batch: usize,
    off: &Run,
    on: &Run,
    divergences: Vec<fidelity::Divergence>,
) -> serde_json::Value {
    let identical = off.outputs == on.outputs;
    let parted = off
        .outputs
        .iter()
        .zip(&on.outputs)
        .filter(|(x, y)| x != y)
        .count();
    let agreement = if identical {
        "yes".to_string()
    } else {
        let gap = divergences.iter().map(|d| d.gap()).fold(0.0f32, f32::max);
        format!(
            "{parted} of {} part (largest logit gap there {gap:.3})",
            on.outputs.len()
        )
    };
    // Batch 1: per-request decode speed (time after the first token); high batch:
    // all tokens over the wall time.
    let (r_off, r_on) = if batch == 1 {
        (
            off.decode_tokens as f64 / off.decode_secs,
            on.decode_tokens as f64 / on.decode_secs,
        )
    } else {
        (
            off.generated as f64 / off.wall_secs,
            on.generated as f64 / on.wall_secs,
        )
    };
    let per_fwd = |r: &Run| {
        if batch == 1 {
            format!(
                "{:.2}",
                r.decode_tokens as f64 / r.decode_steps.max(1) as f64
            )
        } else {
            "-".into()
        }
    };
    let acc = if on.drafts > 0 {
        format!(
            "{:.0}% of {} (verify step {:.2}× a plain one)",
            100.0 * on.accepted as f64 / on.drafts as f64,
            on.drafts,
            on.cost_ratio
        )
    } else {
        "none proposed".into()
    };
    println!(
        "| {name} | {batch} | {} → {} | {:.1} → {:.1} | **{:.2}×** | {acc} | {} |",
        per_fwd(off),
        per_fwd(on),
        r_off,
        r_on,
        r_on / r_off,
        agreement
    );
    serde_json::json!({
        "workload": name, "batch": batch,
        "tok_per_s_off": r_off, "tok_per_s_on": r_on, "ratio": r_on / r_off,
        "decode_steps_off": off.decode_steps, "decode_steps_on": on.decode_steps,
        "decode_tokens": on.decode_tokens,
        "drafts": on.drafts, "accepted": on.accepted, "identical": identical,
        "verify_cost_ratio": on.cost_ratio,
        "divergences": divergences,
    })
}
