//! `cachet bench kv-fp8`: what an FP8 KV cache costs in fidelity and gives in capacity, measured
//! against the device's own KV type (bf16 on CUDA, f32 on the CPU) with the same weights in one
//! run: logits of the last positions of short and long prompts (relative error, largest error,
//! top-1 agreement, KL), greedy agreement on chat prompts (real weights only: random weights say
//! nothing about answers), and KV blocks per GiB. `--compare weights` holds FP8 projection
//! weights (`--quantization fp8`) against the loaded ones the same way, KV as the device's own;
//! `--compare kv-int8` the INT8 KV cache (`--kv-cache-dtype int8`, FP8's bytes).

use std::path::PathBuf;

use anyhow::Context;
use cachet_backend::device::{kv_int8, KvCacheDtype, KvLayout, WeightQuantization};
use cachet_backend::model::runner::{build_runner, KvBudget, Runner, RunnerOptions, WeightSource};
use cachet_backend::rng::Rng;
use cachet_backend::tokenizer::ChatMessage;
use cachet_bench::fidelity::{compare_logits, greedy_agreement};
use cachet_bench::workload::{COPY_HEAVY, FREE_CHAT};
use clap::Args;

#[derive(Args, Debug)]
pub struct KvFp8Args {
    #[command(flatten)]
    pub m: super::BenchModelArgs,
    /// Prompt lengths whose last positions' logits are compared.
    #[arg(long, value_delimiter = ',', default_value = "512,8192")]
    pub contexts: Vec<usize>,
    /// Positions compared at the end of each prompt.
    #[arg(long, default_value_t = 64)]
    pub positions: usize,
    /// Tokens greedily generated per chat prompt (0: skip the greedy comparison).
    #[arg(long, default_value_t = 64)]
    pub greedy_tokens: usize,
    /// Prompt tokens per prefill pass.
    #[arg(long, default_value_t = 2048)]
    pub chunk: usize,
    /// What is quantized in the run compared with the reference: the KV cache in FP8, the
    /// projection weights in FP8 (quantized at load), or the KV cache in INT8.
    #[arg(long, value_enum, default_value = "kv")]
    pub compare: Compare,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// An FP8 KV cache (`--kv-cache-dtype fp8`).
    Kv,
    /// FP8 projection weights (`--quantization fp8`).
    Weights,
    /// The INT8 KV cache (`--kv-cache-dtype int8`): calibrated per-channel scales, bf16
    /// outliers.
    KvInt8,
}

/// Long natural text for a real model's tokenizer: the workloads' prompts, numbered, repeated.
fn long_text(n: usize) -> String {
    let mut s = String::new();
    let all: Vec<&str> = COPY_HEAVY.iter().chain(FREE_CHAT).copied().collect();
    let mut i = 0;
    // ~4 characters a token: enough text, then the ids are cut to length.
    while s.len() < n * 6 {
        s.push_str(&format!("\n\nNote {}. {}", i + 1, all[i % all.len()]));
        i += 1;
    }
    s
}

pub fn run(a: KvFp8Args) -> anyhow::Result<()> {
    let (config, host, tokenizer) = a.m.load()?;
    let dummy = host.is_none();
    let longest = a.contexts.iter().copied().max().unwrap_or(512);
    let max_len = (longest + a.greedy_tokens + 256).max(1024);
    let blocks = max_len.div_ceil(16) + 2;
    let make = |dtype: KvCacheDtype,
                quantization: WeightQuantization|
     -> anyhow::Result<Box<dyn Runner>> {
        let opts = RunnerOptions {
            device: a.m.device.into(),
            block_size: 16,
            max_model_len: max_len,
            fit_max_model_len: false,
            kv: KvBudget::Blocks(blocks),
            cuda_graph_sizes: vec![1],
            cuda_graph_verify: None,
            kv_cache_dtype: dtype,
            quantization,
            tensor_parallel_size: 1,
            kv_calibration: match dtype {
                KvCacheDtype::Int8 => kv_int8::calibration_tokens(&tokenizer)?,
                _ => Vec::new(),
            },
        };
        let w = match &host {
            Some(m) => WeightSource::Host(&m.weights),
            None => WeightSource::Dummy { seed: 0 },
        };
        Ok(build_runner(&config, w, &opts)?)
    };
    let mut reference = make(KvCacheDtype::Auto, WeightQuantization::None)?;
    let mut fp8 = match a.compare {
        Compare::Kv => make(KvCacheDtype::Fp8E4m3, WeightQuantization::None)?,
        Compare::Weights => make(KvCacheDtype::Auto, WeightQuantization::Fp8)?,
        Compare::KvInt8 => make(KvCacheDtype::Int8, WeightQuantization::None)?,
    };
    let dev = reference.device_name();
    let native = if dev == "cpu" { 4 } else { 2 };
    let per_gib = |l: KvLayout| (1usize << 30) / l.block_bytes(native);
    let (ref_blocks, fp8_blocks) = (per_gib(reference.kv_layout()), per_gib(fp8.kv_layout()));
    println!(
        "model {} ({} layers, {} KV heads × {}), device {dev}, {} weights; {}",
        a.m.model,
        config.num_hidden_layers,
        config.num_key_value_heads,
        config.head_dim,
        if dummy { "random" } else { "real" },
        match a.compare {
            Compare::Kv => "FP8 KV cache against the device's own",
            Compare::Weights => "FP8 projection weights against the loaded ones",
            Compare::KvInt8 => "INT8 KV cache against the device's own",
        }
    );
    if a.compare != Compare::Weights {
        println!(
            "KV blocks of 16 tokens per GiB: {} {ref_blocks}, {} {fp8_blocks} ({:.2}×)\n",
            if dev == "cpu" { "f32" } else { "bf16" },
            if a.compare == Compare::KvInt8 {
                "int8"
            } else {
                "fp8"
            },
            fp8_blocks as f64 / ref_blocks as f64
        );
    }
    let vocab = config.vocab_size as u32;
    let mut rng = Rng::new(7);
    let long_ids = if dummy {
        Vec::new()
    } else {
        tokenizer.encode(&long_text(longest))?
    };
    println!("| context | positions | rel. error | max error (× logit RMS) | top-1 agreement | mean KL (nats) |");
    println!("|---|---|---|---|---|---|");
    let mut diffs = Vec::new();
    for &ctx in &a.contexts {
        let prompt: Vec<u32> = if dummy {
            (0..ctx)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect()
        } else {
            anyhow::ensure!(
                long_ids.len() >= ctx,
                "the long text has only {} tokens",
                long_ids.len()
            );
            long_ids[..ctx].to_vec()
        };
        let d = compare_logits(
            reference.as_mut(),
            fp8.as_mut(),
            &prompt,
            a.positions,
            a.chunk,
        )
        .with_context(|| format!("comparing at context {ctx}"))?;
        println!(
            "| {} | {} | {:.2e} | {:.3} ({:.3}) | {:.1}% | {:.2e} |",
            d.context,
            d.positions,
            d.rel_err,
            d.max_abs_err,
            d.max_err_over_rms,
            d.top1_agreement * 100.0,
            d.mean_kl
        );
        diffs.push(d);
    }
    let greedy = if dummy || a.greedy_tokens == 0 {
        None
    } else {
        let prompts = COPY_HEAVY
            .iter()
            .chain(FREE_CHAT)
            .map(|q| {
                let text = tokenizer.render_chat(&[ChatMessage::new("user", *q)], true)?;
                Ok(tokenizer.encode(&text)?)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let g = greedy_agreement(reference.as_mut(), fp8.as_mut(), &prompts, a.greedy_tokens)?;
        println!(
            "\ngreedy, {} chat prompts × {} tokens: {} identical; {:.1}% of tokens before the first divergence; first divergence at {:?}",
            g.prompts,
            a.greedy_tokens,
            g.identical,
            g.agreement_rate * 100.0,
            g.first_divergence
        );
        Some(g)
    };
    if let Some(path) = &a.json_out {
        let v = serde_json::json!({
            "model": a.m.model,
            "device": dev,
            "dummy_weights": dummy,
            "fp8": match a.compare { Compare::Kv => "kv", Compare::Weights => "weights", Compare::KvInt8 => "kv-int8" },
            "blocks_per_gib": {"reference": ref_blocks, "fp8": fp8_blocks},
            "logits": diffs,
            "greedy": greedy,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
