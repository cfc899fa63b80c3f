//! `cachet bench load`: a model's weights from its files onto the device, the way `serve` loads
//! them (layer by layer, read ahead of the upload), timed: the weights' bf16 GiB a second, and
//! the whole start to ready (the KV cache and the decode graphs too), several rounds in a row
//! (the first may read the disk, the later ones the page cache).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use cachet_backend::device::{KvCacheDtype, WeightQuantization};
use cachet_backend::loader;
use cachet_backend::model::runner::{build_runner, KvBudget, RunnerOptions, WeightSource};
use clap::Args;

use super::super::engine_args::GraphArgs;
use super::super::generate::DeviceKind;

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Model: an HF directory of safetensors or a .gguf (a known name or a Hub id is fetched
    /// first). `cachet model random --dtype bf16 --config <config.json>` writes one of any size.
    #[arg(long, short)]
    pub model: String,
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Loads in a row.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Fraction of the GPU's memory for weights and the KV cache, as `serve` takes it.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Projection weights: none (as stored) or fp8 (quantized as they arrive).
    #[arg(long, default_value = "none")]
    pub quantization: WeightQuantization,
    /// Write the rounds as JSON here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    #[command(flatten)]
    pub graphs: GraphArgs,
}

pub fn run(a: LoadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.rounds > 0, "--rounds must be at least 1");
    let spec = loader::fetch_model(&a.model, None, loader::hub::Want::Model, true)
        .with_context(|| format!("fetching `{}`", a.model))?
        .spec;
    let config = loader::load_meta(&spec)
        .with_context(|| format!("reading {spec}"))?
        .config;
    let opts = RunnerOptions {
        device: a.device.into(),
        block_size: 16,
        max_model_len: config.max_position_embeddings,
        fit_max_model_len: true,
        kv: KvBudget::MemoryFraction(a.gpu_memory_utilization),
        cuda_graph_sizes: a.graphs.sizes(usize::MAX),
        cuda_graph_verify: None,
        kv_cache_dtype: KvCacheDtype::Auto,
        quantization: a.quantization,
        tensor_parallel_size: 1,
        kv_calibration: Vec::new(),
    };
    println!("| round | weights (GiB, bf16) | weights (s) | GiB/s | ready (s) | device |");
    println!("|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for round in 1..=a.rounds {
        let t0 = Instant::now();
        let runner = build_runner(&config, WeightSource::Files(&spec), &opts)
            .with_context(|| format!("loading {spec}"))?;
        let ready = t0.elapsed().as_secs_f64();
        let w = runner
            .weights_load()
            .context("the runner did not load its weights from files")?;
        let gib = w.bytes as f64 / (1u64 << 30) as f64;
        println!(
            "| {round} | {gib:.2} | {:.2} | {:.2} | {ready:.2} | {} |",
            w.secs,
            gib / w.secs,
            runner.device_name()
        );
        rows.push(
            serde_json::json!({"round": round, "weights_gib": gib, "weights_s": w.secs,
            "gib_per_s": gib / w.secs, "ready_s": ready, "device": runner.device_name()}),
        );
        drop(runner);
    }
    if let Some(p) = &a.json_out {
        let out = serde_json::json!({"model": a.model, "rounds": rows});
        std::fs::write(p, serde_json::to_string_pretty(&out)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
