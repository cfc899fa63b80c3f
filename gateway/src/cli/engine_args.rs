//! The engine's options, shared by `cachet serve` (embedded engine) and `cachet worker`, named as
//! vLLM users know them.

use std::path::PathBuf;

use anyhow::Context;
use cachet_backend::config::ModelConfig;
use cachet_backend::device::WeightQuantization;
pub use cachet_backend::engine::builder::StepLimits;
use cachet_backend::engine::builder::{Built, EngineBuild, Weights};
use cachet_backend::engine::{Engine, EngineConfig};
use cachet_backend::loader;
use cachet_backend::loader::hub::Want;
use cachet_backend::model::runner::{KvBudget, RunnerOptions, VerifyGraphs};
use cachet_backend::scheduler::{SchedulerConfig, SchedulingPolicy};
use cachet_backend::tokenizer::TextTokenizer;
use clap::Args;

use super::generate::DeviceKind;

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    /// The model's own weights.
    Auto,
    /// Random weights made on the device from the model's config.json (real shapes, no download).
    Dummy,
}

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Model: a Hugging Face id (`Qwen/Qwen3-8B`, or `org/name/FILE.gguf` for one file of a
    /// GGUF repo; downloaded into the HF cache, see `cachet model fetch --help`), a built-in name
    /// (`smollm2`), an HF directory or a .gguf file; with `--load-format dummy`, a config.json,
    /// a directory holding one, or a Hub id (only its config.json is fetched).
    #[arg(long, short)]
    pub model: String,
    /// The Hub revision of a model given by id: a branch, tag or commit (default: main).
    #[arg(long)]
    pub revision: Option<String>,
    /// `dummy`: random weights made on the device from the model's config (real shapes, for
    /// benchmarks); needs --tokenizer.
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// Whose tokenizer and chat template serve a `--load-format dummy` model (a model name or
    /// path); generated ids are shown modulo its vocabulary. Refused with a real model, whose
    /// tokenizer comes with it.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// A Jinja chat template file to render prompts with instead of the model's own (HF's
    /// dialect: `messages`, `tools`, `add_generation_prompt`); e.g.
    /// examples/chat-templates/chatml-tools.jinja gives a ChatML model tool calls.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<std::path::PathBuf>,
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Most sequences in one engine step. Default: chosen for the device at start-up and logged
    /// — 256 on a GPU (fewer when the KV cache holds less than 512 tokens a sequence), 64 on
    /// the CPU.
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Token budget of one engine step (prefill chunks + decodes). Default: chosen for the
    /// device — 8192 on a GPU, 2048 on the CPU.
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Target milliseconds per engine step (0: none). Each step's token budget is then sized
    /// from the measured time of earlier steps so a step should finish within it: a request
    /// that arrives while a long prompt prefills waits at most about this long for the step in
    /// flight, and so do the tokens of everyone decoding beside it. Default: chosen for the
    /// device — 250 on the CPU (where a 2048-token step of even a 135M model takes seconds);
    /// none on a GPU (its 8192-token steps take tens of milliseconds; a short target would
    /// starve prefill behind a full batch's decode).
    #[arg(long, value_name = "MS")]
    pub max_step_ms: Option<u64>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Reuse cached prompt prefixes (per tenant salt).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_prefix_caching: bool,
    /// Split long prompts across steps. Off, a step holds a whole prompt: the step token limit
    /// is raised to --max-model-len (an explicit --max-num-batched-tokens below it is refused).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_chunked_prefill: bool,
    /// fcfs, priority (tenant class) or shortest-first: the order of the waiting requests
    /// (inside each tenant, with --fair-share).
    #[arg(long, default_value = "priority")]
    pub scheduling_policy: String,
    /// Token-fair sharing between tenants: a virtual token counter per tenant (weighted by its
    /// `share` in the config) decides which tenant's request runs next and which is preempted,
    /// and a tenant below its share of the queue is admitted when it is full. One tenant's
    /// flood then does not become another's latency. On by default: with it off, one tenant
    /// sending many long requests (each `n` choice counts) can hold every sequence slot and the
    /// whole queue (SECURITY.md). `--fair-share false`: first come, first served across tenants.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", value_name = "BOOL")]
    pub fair_share: bool,
    /// With --fair-share: most prompt tokens per step for tenants holding more than their share
    /// of the sequence slots while another tenant has requests (0: no cap). Short steps while a
    /// flood prefills keep a light tenant's wait for the step in flight short; its own prefill
    /// is not capped.
    #[arg(long, default_value_t = 256)]
    pub fair_prefill_cap: usize,
    /// Idle cached KV blocks are shared between tenants by their `share`: eviction takes from
    /// the tenant furthest over its share, so one tenant scanning unique prompts does not evict
    /// another's hot prefix. `false`: one LRU for everyone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub cache_shares: bool,
    /// Share of device memory for weights + KV cache (on the CPU: of 4 GiB).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Longest prompt + output. Default: the model's own context length (config.json's
    /// max_position_embeddings), lowered at start to the tokens the KV cache holds where it
    /// holds fewer (said in the log).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Requests that may wait for the engine before new ones get 503 + Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,
    /// Prompt tokens that may wait for the engine before new requests get 503 + Retry-After
    /// (a single prompt larger than this is still taken when nothing else waits).
    #[arg(long, default_value_t = 256 * 1024)]
    pub max_waiting_tokens: usize,
    /// KV cache blocks to allocate, instead of sizing the pool from --gpu-memory-utilization
    /// (for experiments with a small cache).
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
    /// KV cache storage: auto (the device's type: bf16 on CUDA, f32 on the CPU), fp8 (e4m3
    /// with a scale per token and KV head: about twice the blocks in the same memory) or int8
    /// (the same bytes: a static scale per channel calibrated on a text at load, each head's 4
    /// largest channels kept in bf16). FP8's loss depends on the model: SmolLM2 keeps 95–97% of
    /// its top-1 choices, models where a few key channels dwarf the others far fewer (Qwen2.5:
    /// 77–92%), which int8 keeps (BENCHMARKS §4); on CUDA int8 runs on the CUDA-core attention
    /// kernel (no tensor-core one yet). Measure yours with `cachet bench kv-fp8 [--compare
    /// kv-int8]`.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: cachet_backend::device::KvCacheDtype,
    /// Projection weights: none (as loaded: bf16 on CUDA, f32 on the CPU) or fp8 (e4m3 with a
    /// scale per output row, quantized at load: half the weight memory; decode steps of up to
    /// four sequences stream half the bytes through the FP8 GEMV, larger steps quantize their
    /// inputs per token for cuBLASLt's FP8 GEMM). The embedding table, the LM head and the norms
    /// stay as loaded. Default: fp8 for an FP8 checkpoint scaled per output channel (its codes
    /// kept as they are), none otherwise.
    #[arg(long)]
    pub quantization: Option<cachet_backend::device::WeightQuantization>,
    /// Ranks to split the model over (Megatron-style tensor parallelism: each rank holds its
    /// share of the attention heads, the MLP and the vocabulary, with an all-reduce after each
    /// row-parallel projection). On the CPU device the ranks are threads of this process; on
    /// CUDA one GPU each (rank r on GPU r; CUDA_VISIBLE_DEVICES picks them), collectives through
    /// NCCL (libnccl.so.2, or CACHET_NCCL_LIBRARY). The scheduler and KV manager stay one.
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// File holding the 32-byte deployment key of the block hashes, as 64 hex digits. The gateway
    /// and its `cachet worker`s must share it (exact prefix routing compares their hashes); without
    /// it `serve` keeps one in its --state-dir (`hash-key`) and a worker draws a random one.
    #[arg(long, env = "CACHET_HASH_KEY_FILE")]
    pub hash_key_file: Option<PathBuf>,
    /// N-gram (prompt-lookup) speculative decoding, as vLLM's JSON, e.g.
    /// '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
    /// "prompt_lookup_min": 2}'; also "disable_by_batch_size" (no speculation in a step with more
    /// decoding requests, default 8), "min_acceptance_rate" (a request below it pauses for
    /// "cooldown_steps" steps, doubling while it keeps failing; 0.3 and 16) and "min_speedup"
    /// (a request also pauses while its tokens per verification step stay below this times the
    /// measured cost of a verification step over a plain one; 1.0, 0 = off). Off by default.
    #[arg(long)]
    pub speculative_config: Option<String>,
    #[command(flatten)]
    pub graphs: GraphArgs,
}

/// CUDA graph options, shared by the engine's commands and `bench forward`.
#[derive(Args, Debug, Clone)]
pub struct GraphArgs {
    /// Run every step eagerly: no CUDA graphs for decode steps (vLLM's flag).
    #[arg(long)]
    pub enforce_eager: bool,
    /// Decode batch sizes to capture CUDA graphs for at start-up (a step of n sequences replays
    /// the smallest size ≥ n; for an engine, sizes past the first that covers --max-num-seqs
    /// are dropped).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64,128,256"
    )]
    pub cuda_graph_sizes: Vec<usize>,
}

impl GraphArgs {
    /// The sizes to capture (none with --enforce-eager), up to the first that covers `max_seqs`.
    pub fn sizes(&self, max_seqs: usize) -> Vec<usize> {
        if self.enforce_eager {
            return Vec::new();
        }
        let mut sizes: Vec<usize> = self.cuda_graph_sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        if let Some(i) = sizes.iter().position(|&s| s >= max_seqs) {
            sizes.truncate(i + 1);
        }
        sizes
    }
}

/// The model's `generation_config.json`; none for a dummy model, whose weights are random
/// (what its tokenizer's model recommends is not for it).
fn generation_of(
    g: loader::generation::GenerationConfig,
    dummy: bool,
) -> loader::generation::GenerationConfig {
    if dummy {
        Default::default()
    } else {
        g
    }
}

/// `tokenizer` with the template of the file `path`, if one is given; the template in use (that
/// one or the model's) is probed now: one that does not parse or fails on a plain conversation
/// is refused at start, not on every request. `flag` names where `path` came from.
fn with_chat_template(
    tokenizer: TextTokenizer,
    path: Option<&std::path::Path>,
    flag: &str,
) -> anyhow::Result<TextTokenizer> {
    let tokenizer = match path {
        None => tokenizer,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the chat template {}", path.display()))?;
            tokenizer.with_chat_template(text)
        }
    };
    if let Err(e) = tokenizer.probe_chat_template() {
        match path {
            Some(path) => anyhow::bail!("the chat template {}: {e}", path.display()),
            None => {
                anyhow::bail!("the model's chat template: {e} (give one that works with {flag})")
            }
        }
    }
    Ok(tokenizer)
}

/// A model's text side without its weights, for a model whose upstreams run it.
pub struct ModelText {
    pub tokenizer: TextTokenizer,
    /// The name clients know it by (its Hub id, built-in name or files' name).
    pub id: String,
    pub generation: loader::generation::GenerationConfig,
    /// The model's own context length (`max_position_embeddings`).
    pub context: usize,
}

/// The text side of the model `spec` (a Hub id at `revision`, a built-in name, a path), with the
/// chat template of the file `chat_template` if given (by the setting `flag`); `what` names the
/// model in errors.
pub fn model_text(
    spec: &str,
    revision: Option<&str>,
    chat_template: Option<&std::path::Path>,
    flag: &str,
    what: &str,
) -> anyhow::Result<ModelText> {
    let local = loader::fetch_model(spec, revision, Want::Text, true)
        .with_context(|| format!("{what}: fetching `{spec}`"))?;
    let meta = loader::load_meta(&local.spec)
        .with_context(|| format!("{what}: reading the tokenizer of `{}`", local.spec))?;
    let tokenizer = meta
        .tokenizer
        .with_context(|| format!("{what}: the model has no tokenizer"))?;
    let tokenizer =
        with_chat_template(tokenizer, chat_template, flag).with_context(|| what.to_string())?;
    let id = local.name.unwrap_or(meta.name);
    Ok(ModelText {
        tokenizer,
        id,
        generation: meta.generation,
        context: meta.config.max_position_embeddings,
    })
}

/// A started engine.
pub struct Started {
    pub engine: Engine,
    pub tokenizer: TextTokenizer,
    pub model_id: String,
    /// The step limits in force (flags, or the device's defaults).
    pub limits: StepLimits,
    /// The model's `generation_config.json` (its sampling values are request defaults).
    pub generation: loader::generation::GenerationConfig,
}

/// The deployment key a file holds: 64 hex digits.
pub fn read_hash_key(p: &std::path::Path) -> anyhow::Result<[u8; 32]> {
    let text = std::fs::read_to_string(p)
        .with_context(|| format!("reading the hash key file {}", p.display()))?;
    cachet_gateway::tenants::parse_hex32(text.trim())
        .with_context(|| format!("{} must hold 64 hex digits (32 bytes)", p.display()))
}

impl EngineArgs {
    /// The deployment key: from `--hash-key-file`, or random.
    pub fn hash_key(&self) -> anyhow::Result<[u8; 32]> {
        match &self.hash_key_file {
            Some(p) => read_hash_key(p),
            None => {
                let mut key = [0u8; 32];
                use std::io::Read;
                std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
                Ok(key)
            }
        }
    }

    /// The parsed `--speculative-config`.
    pub fn speculative(&self) -> anyhow::Result<Option<cachet_backend::spec::SpecConfig>> {
        let Some(text) = &self.speculative_config else {
            return Ok(None);
        };
        let c: cachet_backend::spec::SpecConfig = serde_json::from_str(text).with_context(|| {
            format!("--speculative-config must be a JSON object like {{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}, got `{text}`")
        })?;
        c.validate()
            .map_err(|e| anyhow::anyhow!("--speculative-config: {e}"))?;
        Ok(Some(c))
    }

    /// With `--load-format dummy`: the model's config and the name it is served as (a Hub id,
    /// else its directory's or file's name).
    fn dummy_config(&self) -> anyhow::Result<Option<(ModelConfig, String)>> {
        if self.load_format != LoadFormat::Dummy {
            return Ok(None);
        }
        let local = loader::fetch_model(&self.model, self.revision.as_deref(), Want::Config, true)?;
        let path = PathBuf::from(&local.spec);
        let cfg = if path.is_dir() {
            path.join("config.json")
        } else {
            path
        };
        let config = ModelConfig::from_hf_json(&cfg)
            .with_context(|| format!("reading {}", cfg.display()))?;
        let name = local.name.unwrap_or_else(|| {
            cfg.parent()
                .filter(|_| cfg.file_name().is_some_and(|f| f == "config.json"))
                .and_then(|d| d.file_name())
                .or_else(|| cfg.file_stem())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "dummy".into())
        });
        Ok(Some((config, name)))
    }

    /// The model whose tokenizer and chat template serve (`--tokenizer` with `--load-format
    /// dummy`, else the model itself), made local: `want` of a Hub model's files.
    fn text_model(&self, want: Want) -> anyhow::Result<loader::LocalModel> {
        let (name, revision) = self.text_source()?;
        loader::fetch_model(name, revision, want, true)
            .with_context(|| format!("fetching the model `{name}`"))
    }

    /// The model whose text serves and its revision: `--tokenizer`'s with `--load-format dummy`,
    /// else the model itself at `--revision`.
    fn text_source(&self) -> anyhow::Result<(&str, Option<&str>)> {
        match (self.load_format == LoadFormat::Dummy, &self.tokenizer) {
            (true, Some(t)) => Ok((t, None)),
            (true, None) => {
                anyhow::bail!("--load-format dummy needs --tokenizer (e.g. smollm2) for its text")
            }
            (false, None) => Ok((&self.model, self.revision.as_deref())),
            // Not silently ignored: a real model's tokenizer and chat template come with it.
            (false, Some(t)) => anyhow::bail!(
                "--tokenizer {t} is for --load-format dummy; a real model's tokenizer comes with it (give a different chat template with --chat-template)"
            ),
        }
    }

    /// The name clients use for the model: a dummy model's (see [`Self::dummy_config`]), the
    /// spec's own (a Hub id, a built-in's name), or the name the model's files give.
    fn model_id(
        dummy: Option<&(ModelConfig, String)>,
        local: &loader::LocalModel,
        file_name: &str,
    ) -> String {
        match (dummy, &local.name) {
            (Some((_, name)), _) | (None, Some(name)) => name.clone(),
            (None, None) => file_name.to_string(),
        }
    }

    /// `tokenizer` with `--chat-template`'s template (see [`with_chat_template`]).
    fn with_chat_template(&self, tokenizer: TextTokenizer) -> anyhow::Result<TextTokenizer> {
        with_chat_template(tokenizer, self.chat_template.as_deref(), "--chat-template")
    }

    /// The model's tokenizer and id without its weights, for a gateway whose upstreams run the
    /// model (fetches a known model first: its tokenizer lives in its file).
    pub fn text_only(&self) -> anyhow::Result<ModelText> {
        let dummy = self.dummy_config()?;
        let (spec, revision) = self.text_source()?;
        let template = self.chat_template.as_deref();
        let mut t = model_text(spec, revision, template, "--chat-template", "--model")?;
        if let Some((config, name)) = dummy {
            t.tokenizer = t.tokenizer.for_dummy_model(config.vocab_size);
            t.id = name;
            t.generation = generation_of(t.generation, true);
            t.context = config.max_position_embeddings;
        }
        t.context = self.max_model_len.unwrap_or(t.context);
        Ok(t)
    }

    /// Loads the model (fetching a known one), builds the runner and starts the engine thread.
    pub fn start(&self, key: [u8; 32]) -> anyhow::Result<Started> {
        let a = self;
        let policy: SchedulingPolicy = a.scheduling_policy.parse().map_err(anyhow::Error::msg)?;
        let speculative = a.speculative()?;
        let dummy_config = a.dummy_config()?;
        let local = a.text_model(match dummy_config {
            Some(_) => Want::Text,
            None => Want::Model,
        })?;
        let name = local.spec.as_str();
        // The weights are read as the runner is built, each tensor uploaded as it is read (the
        // host holds one layer at a time; split over ranks, each reads its slices): only the
        // config and tokenizer here.
        let model = loader::load_meta(name).with_context(|| format!("reading model `{name}`"))?;
        let mut tokenizer = model
            .tokenizer
            .clone()
            .context("the model has no tokenizer")?;
        if let Some((config, _)) = &dummy_config {
            tokenizer = tokenizer.for_dummy_model(config.vocab_size);
        }
        let tokenizer = a.with_chat_template(tokenizer)?;
        let model_id = Self::model_id(dummy_config.as_ref(), &local, &model.name);
        let (config, weights) = match &dummy_config {
            Some((c, _)) => (c, Weights::Dummy),
            None => (&model.config, Weights::Files(name)),
        };
        let build = EngineBuild {
            config,
            weights,
            tokenizer: tokenizer.clone(),
            runner: RunnerOptions {
                device: a.device.into(),
                block_size: a.block_size,
                // The model's own context unless the flag says otherwise.
                max_model_len: a.max_model_len.unwrap_or(config.max_position_embeddings),
                fit_max_model_len: a.max_model_len.is_none(),
                kv: match a.num_gpu_blocks_override {
                    Some(n) => KvBudget::Blocks(n),
                    None => KvBudget::MemoryFraction(a.gpu_memory_utilization),
                },
                // Decode graphs up to the most sequences any default or flag allows; sizes past
                // the limit the builder chooses are never replayed.
                cuda_graph_sizes: self.graphs.sizes(a.max_num_seqs.unwrap_or(256)),
                cuda_graph_verify: speculative.as_ref().map(VerifyGraphs::for_spec),
                kv_cache_dtype: a.kv_cache_dtype,
                quantization: WeightQuantization::None,
                tensor_parallel_size: a.tensor_parallel_size,
                kv_calibration: Vec::new(),
            },
            quantization: a.quantization,
            max_num_seqs: a.max_num_seqs,
            max_num_batched_tokens: a.max_num_batched_tokens,
            max_step_ms: a.max_step_ms,
            engine: EngineConfig {
                scheduler: SchedulerConfig {
                    enable_chunked_prefill: a.enable_chunked_prefill,
                    policy,
                    fair_share: a.fair_share,
                    fair_prefill_cap: a.fair_prefill_cap,
                    ..Default::default()
                },
                enable_prefix_caching: a.enable_prefix_caching,
                max_waiting: a.max_waiting,
                max_waiting_tokens: a.max_waiting_tokens,
                model_id: model_id.clone(),
                hash_key: key,
                speculative,
                cache_shares: a.cache_shares,
                ..Default::default()
            },
        };
        let Built { engine, limits } = build.start()?;
        Ok(Started {
            engine,
            tokenizer,
            model_id,
            limits,
            generation: generation_of(model.generation, dummy_config.is_some()),
        })
    }
}
