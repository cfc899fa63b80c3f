//! `cachet bench`: the benchmark harnesses, one file each. They run the engine and the gateway
//! from outside, like a user; the serving code imports nothing from here. Workloads, the
//! fidelity runner and report plots come from the `cachet-bench` crate.

mod fair;
mod forward;
mod kv_fp8;
mod load;
mod serve;
mod spec;
mod ttft;

use std::path::PathBuf;

use anyhow::Context;
use cachet_backend::config::ModelConfig;
use cachet_backend::loader;
use cachet_backend::tokenizer::TextTokenizer;
use clap::{Args, Subcommand};

use super::engine_args::LoadFormat;
use super::generate::DeviceKind;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Decode and prefill timings, with the floor each is held against.
    Forward(forward::ForwardArgs),
    /// N-gram speculative decoding off vs on: copy-heavy and free-chat workloads, batch 1 and
    /// a high batch, tokens per forward pass and decode speed, output identity.
    Spec(spec::SpecArgs),
    /// The seed article's TTFT experiment through the gateway: baseline vs all optimizations
    /// (and each alone with --ablation), cold and warm, with the server-side split of TTFT,
    /// a report and plots.
    Ttft(ttft::TtftArgs),
    /// FP8 fidelity: logits with an FP8 KV cache (or, --compare weights, FP8 projection weights)
    /// vs the device's own type at short and long contexts (error, top-1 and KL), greedy
    /// agreement on chat prompts, KV blocks per GiB.
    KvFp8(kv_fp8::KvFp8Args),
    /// The noisy neighbour: tenant A floods at several times capacity, tenant B sends a fifth of
    /// it; B's TTFT and the total throughput under FCFS, the default policy and --fair-share.
    Fair(fair::FairArgs),
    /// Cache shares: a tenant scanning unique long prompts against another's hot prefix, with one
    /// LRU for everyone and with --cache-shares; the hot tenant's hit rate against alone.
    CacheShare(fair::CacheShareArgs),
    /// Weight loading: a model's files onto the device as `serve` loads them, timed (bf16 GiB
    /// a second, and the time to ready), several rounds in a row.
    Load(load::LoadArgs),
    /// Load any OpenAI-compatible server (ours, vLLM, SGLang): random, shared-prefix or
    /// ShareGPT-like requests, all at once or at a Poisson rate, a concurrency cap; throughput
    /// and TTFT / TPOT / ITL / end-to-end percentiles in vLLM's `bench serve` layout, JSON out.
    /// SIGTERM or Ctrl-C stops it early with the report of the requests that finished.
    Serve(serve::ServeBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Forward(a) => forward::run(a),
        BenchCommand::Spec(a) => spec::run(a),
        BenchCommand::Ttft(a) => ttft::run(a),
        BenchCommand::KvFp8(a) => kv_fp8::run(a),
        BenchCommand::Fair(a) => fair::run(a),
        BenchCommand::CacheShare(a) => fair::run_cache_share(a),
        BenchCommand::Serve(a) => serve::run(a),
        BenchCommand::Load(a) => load::run(a),
    }
}

/// The model a benchmark runs, and where.
#[derive(Args, Debug)]
pub struct BenchModelArgs {
    /// Model: a known name, an HF directory, a .gguf, or (with --load-format dummy) a config.json.
    #[arg(long, short, default_value = "smollm2")]
    pub model: String,
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// Whose tokenizer turns the prompts into ids with dummy weights.
    #[arg(long, default_value = "smollm2")]
    pub tokenizer: String,
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
}

impl BenchModelArgs {
    /// The model's config, its host weights (`None` with dummy weights: they are made on the
    /// device) and the tokenizer that turns prompts into ids (another model's with dummy weights).
    pub fn load(
        &self,
    ) -> anyhow::Result<(ModelConfig, Option<loader::LoadedModel>, TextTokenizer)> {
        use loader::hub::Want;
        let local = |name: &str, want: Want| -> anyhow::Result<String> {
            Ok(loader::fetch_model(name, None, want, true)
                .with_context(|| format!("fetching `{name}`"))?
                .spec)
        };
        if self.load_format == LoadFormat::Dummy {
            let path = PathBuf::from(local(&self.model, Want::Config)?);
            let cfg = if path.is_dir() {
                path.join("config.json")
            } else {
                path
            };
            let tokenizer = &local(&self.tokenizer, Want::Text)?;
            // Its tokenizer only (a tokenizer-only GGUF will do: no weights are read).
            let t = loader::load_meta(tokenizer)
                .with_context(|| format!("loading the tokenizer of {tokenizer}"))?;
            let tok = t.tokenizer.context("that model has no tokenizer")?;
            let config = ModelConfig::from_hf_json(&cfg)
                .with_context(|| format!("reading {}", cfg.display()))?;
            Ok((config, None, tok))
        } else {
            let model = &local(&self.model, Want::Model)?;
            let m = loader::load(model, true).with_context(|| format!("loading {model}"))?;
            let tok = m.tokenizer.clone().context("the model has no tokenizer")?;
            Ok((m.config.clone(), Some(m), tok))
        }
    }
}
