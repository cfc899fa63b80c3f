//! The engine's options, shared by `cachet serve` (embedded engine) and `cachet worker`, named as
//! vLLM users know them.

use std::path::PathBuf;

use anyhow::Context;
use cachet_backend::config::ModelConfig;
use cachet_backend::device::{KvCacheDtype, WeightQuantization};
use cachet_backend::engine::{Engine, EngineConfig};
use cachet_backend::loader;
use cachet_backend::model::runner::{
    build_runner, KvBudget, RunnerOptions, VerifyGraphs, WeightSource,
};
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
    /// Model: a known name (`smollm2`), an HF directory or a .gguf file; with
    /// `--load-format dummy`, a config.json (or a directory holding one).
    #[arg(long, short)]
    pub model: String,
    /// `dummy`: random weights made on the device from the model's config (real shapes, for
    /// benchmarks); needs --tokenizer.
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// Whose tokenizer and chat template serve a `--load-format dummy` model (a model name or
    /// path); generated ids are shown modulo its vocabulary.
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
    /// Longest prompt + output.
    #[arg(long, default_value_t = 4096)]
    pub max_model_len: usize,
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
    /// it a random key is drawn at start-up.
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

/// Fetches `name` first when it is a known model.
fn fetch_known(name: &str) -> anyhow::Result<()> {
    if let Some(k) = loader::fetch::known_model(name) {
        loader::fetch::fetch(k, true)?;
    }
    Ok(())
}

/// A started engine.
pub struct Started {
    pub engine: Engine,
    pub tokenizer: TextTokenizer,
    pub model_id: String,
    /// The step limits in force (flags, or the device's defaults).
    pub limits: StepLimits,
}

/// What to tell a host who asks for the FP8 KV cache on a model it measurably hurts: models with
/// q/k/v biases (Qwen2.5) lose 8–23% of their top-1 choices with it (BENCHMARKS §4).
fn fp8_kv_warning(config: &ModelConfig, dtype: KvCacheDtype) -> Option<String> {
    (dtype == KvCacheDtype::Fp8E4m3 && config.attention_bias).then(|| {
        "--kv-cache-dtype fp8 on a model with q/k/v biases: on Qwen2.5 it changed 8-23% of the \
         top-1 tokens (BENCHMARKS §4); check this model with `cachet bench kv-fp8`, or use \
         --kv-cache-dtype int8 (the same bytes) or the default cache"
            .to_string()
    })
}

/// How much one engine step may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Target milliseconds per step (0: none).
    pub max_step_ms: u64,
}

/// The CPU's step-time target: a request arriving during a prefill waits about this long at most.
const CPU_MAX_STEP_MS: u64 = 250;

/// KV tokens a sequence gets at least, on average, when the GPU default of `max_num_seqs` is
/// sized down to the cache: past that, a full batch would be preempting, not decoding.
const KV_TOKENS_PER_SEQ: usize = 512;

impl StepLimits {
    /// The defaults for a device: a GPU's decode step is bound by reading the weights, so it
    /// batches up to 256 sequences (vLLM uses 256–1024 on H100-class cards) and prefills in
    /// 8192-token steps, with no more sequences than leave each 512 tokens of the KV cache
    /// (`kv_tokens`: known once the cache is sized), with no step-time target: a target short
    /// enough to matter (20 ms) starves prefill once a full batch's decode step alone takes
    /// longer, and under fair sharing the prefill cap already keeps a light tenant's wait short
    /// (H200, 8B shape, BENCHMARKS §11: B's TTFT P95 35 ms with the cap alone, 33 with a 20 ms
    /// target as well); a CPU's steps are bound by arithmetic, so it keeps 64 and 2048 with a
    /// step-time target of 250 ms (those steps would take seconds). Flags override each.
    pub fn for_device(
        gpu: bool,
        kv_tokens: usize,
        seqs_flag: Option<usize>,
        tokens_flag: Option<usize>,
        step_ms_flag: Option<u64>,
    ) -> Self {
        let (seqs, tokens, step_ms) = if gpu {
            (256.min((kv_tokens / KV_TOKENS_PER_SEQ).max(1)), 8192, 0)
        } else {
            (64, 2048, CPU_MAX_STEP_MS)
        };
        StepLimits {
            max_num_seqs: seqs_flag.unwrap_or(seqs),
            max_num_batched_tokens: tokens_flag.unwrap_or(tokens),
            max_step_ms: step_ms_flag.unwrap_or(step_ms),
        }
    }
}

impl EngineArgs {
    /// The deployment key: from `--hash-key-file`, or random.
    pub fn hash_key(&self) -> anyhow::Result<[u8; 32]> {
        match &self.hash_key_file {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading the hash key file {}", p.display()))?;
                cachet_gateway::tenants::parse_hex32(text.trim())
                    .with_context(|| format!("{} must hold 64 hex digits (32 bytes)", p.display()))
            }
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

    /// With `--load-format dummy`: the model's config and the path it came from.
    fn dummy_config(&self) -> anyhow::Result<Option<(ModelConfig, PathBuf)>> {
        if self.load_format != LoadFormat::Dummy {
            return Ok(None);
        }
        let path = PathBuf::from(&self.model);
        let cfg = if path.is_dir() {
            path.join("config.json")
        } else {
            path
        };
        let config = ModelConfig::from_hf_json(&cfg)
            .with_context(|| format!("reading {}", cfg.display()))?;
        Ok(Some((config, cfg)))
    }

    /// The tokenizer's model with `--load-format dummy` (its text), else the model itself.
    fn tokenizer_source(&self) -> anyhow::Result<&str> {
        if self.load_format == LoadFormat::Dummy {
            self.tokenizer
                .as_deref()
                .context("--load-format dummy needs --tokenizer (e.g. smollm2) for its text")
        } else {
            Ok(&self.model)
        }
    }

    /// The name clients use for the model: a dummy model's config directory (or file stem), a
    /// known model's name, or the name the model's files give.
    fn model_id(&self, dummy: Option<&(ModelConfig, PathBuf)>, file_name: &str) -> String {
        match dummy {
            Some((_, path)) => path
                .parent()
                .filter(|_| path.file_name().is_some_and(|f| f == "config.json"))
                .and_then(|d| d.file_name())
                .or_else(|| path.file_stem())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "dummy".into()),
            None => loader::fetch::known_model(&self.model)
                .map(|k| k.name.to_string())
                .unwrap_or_else(|| file_name.to_string()),
        }
    }

    /// `tokenizer` with `--chat-template`'s template, if one was given (it must parse).
    fn with_chat_template(&self, tokenizer: TextTokenizer) -> anyhow::Result<TextTokenizer> {
        let Some(path) = &self.chat_template else {
            return Ok(tokenizer);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the chat template {}", path.display()))?;
        let tokenizer = tokenizer.with_chat_template(text);
        // A template that does not parse is refused now, not on the first request.
        if let Err(e) = tokenizer.render_chat(
            &[cachet_backend::tokenizer::ChatMessage::new("user", "hi")],
            true,
        ) {
            anyhow::bail!("the chat template {}: {e}", path.display());
        }
        Ok(tokenizer)
    }

    /// The model's tokenizer and id without its weights, for a gateway whose upstreams run the
    /// model (fetches a known model first: its tokenizer lives in its file).
    pub fn text_only(&self) -> anyhow::Result<(TextTokenizer, String)> {
        let dummy = self.dummy_config()?;
        let name = self.tokenizer_source()?;
        fetch_known(name)?;
        let meta = loader::load_meta(name)
            .with_context(|| format!("reading the tokenizer of `{name}`"))?;
        let mut tokenizer = meta.tokenizer.context("the model has no tokenizer")?;
        if let Some((config, _)) = &dummy {
            tokenizer = tokenizer.for_dummy_model(config.vocab_size);
        }
        let tokenizer = self.with_chat_template(tokenizer)?;
        Ok((tokenizer, self.model_id(dummy.as_ref(), &meta.name)))
    }

    /// Loads the model (fetching a known one), builds the runner and starts the engine thread.
    pub fn start(&self, key: [u8; 32]) -> anyhow::Result<Started> {
        let a = self;
        let policy: SchedulingPolicy = a.scheduling_policy.parse().map_err(anyhow::Error::msg)?;
        let speculative = a.speculative()?;
        let dummy_config = a.dummy_config()?;
        let name = a.tokenizer_source()?;
        fetch_known(name)?;
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
        let opts = RunnerOptions {
            device: a.device.into(),
            block_size: a.block_size,
            max_model_len: a.max_model_len,
            kv: match a.num_gpu_blocks_override {
                Some(n) => KvBudget::Blocks(n),
                None => KvBudget::MemoryFraction(a.gpu_memory_utilization),
            },
            // Decode graphs up to the most sequences any default or flag allows; sizes past
            // the limit chosen below are never replayed.
            cuda_graph_sizes: self.graphs.sizes(a.max_num_seqs.unwrap_or(256)),
            cuda_graph_verify: speculative.as_ref().map(VerifyGraphs::for_spec),
            kv_cache_dtype: a.kv_cache_dtype,
            quantization: {
                let config = match &dummy_config {
                    Some((c, _)) => c,
                    None => &model.config,
                };
                let q = WeightQuantization::for_checkpoint(a.quantization, config);
                if a.quantization.is_none() && q != WeightQuantization::None {
                    tracing::info!(quantization = %q, "an FP8 checkpoint scaled per channel: its weights stay FP8 (--quantization none dequantizes them)");
                }
                q
            },
            tensor_parallel_size: a.tensor_parallel_size,
            kv_calibration: match a.kv_cache_dtype {
                KvCacheDtype::Int8 => {
                    cachet_backend::device::kv_int8::calibration_tokens(&tokenizer)?
                }
                _ => Vec::new(),
            },
        };
        if let Some(w) = fp8_kv_warning(
            dummy_config.as_ref().map_or(&model.config, |(c, _)| c),
            a.kv_cache_dtype,
        ) {
            tracing::warn!("{w}");
        }
        let model_id = a.model_id(dummy_config.as_ref(), &model.name);
        let runner = match &dummy_config {
            Some((config, _)) => build_runner(config, WeightSource::Dummy { seed: 0 }, &opts)?,
            None => build_runner(&model.config, WeightSource::Files(name), &opts)?,
        };
        let layout = runner.kv_layout();
        let mut limits = StepLimits::for_device(
            runner.device_name() != "cpu",
            layout.num_blocks * layout.block_size,
            a.max_num_seqs,
            a.max_num_batched_tokens,
            a.max_step_ms,
        );
        // Without chunked prefill a prompt goes into one step whole: a step must hold the
        // longest prompt the server accepts, or such a prompt would wait forever.
        if !a.enable_chunked_prefill && limits.max_num_batched_tokens < a.max_model_len {
            anyhow::ensure!(
                a.max_num_batched_tokens.is_none(),
                "--max-num-batched-tokens {} is below --max-model-len {}: with \
                 --enable-chunked-prefill false a prompt is prefilled in one step, so a longer \
                 one could never run; raise --max-num-batched-tokens to {} or more, lower \
                 --max-model-len, or enable chunked prefill",
                limits.max_num_batched_tokens,
                a.max_model_len,
                a.max_model_len
            );
            limits.max_num_batched_tokens = a.max_model_len;
        }
        tracing::info!(
            device = runner.device_name(),
            max_num_seqs = limits.max_num_seqs,
            max_num_batched_tokens = limits.max_num_batched_tokens,
            max_step_ms = limits.max_step_ms,
            kv_tokens = layout.num_blocks * layout.block_size,
            from_flags = a.max_num_seqs.is_some()
                || a.max_num_batched_tokens.is_some()
                || a.max_step_ms.is_some(),
            "step limits"
        );
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: limits.max_num_seqs,
                max_num_batched_tokens: limits.max_num_batched_tokens,
                enable_chunked_prefill: a.enable_chunked_prefill,
                policy,
                max_model_len: a.max_model_len,
                fair_share: a.fair_share,
                fair_prefill_cap: a.fair_prefill_cap,
                max_step_secs: limits.max_step_ms as f64 / 1000.0,
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
        };
        let engine = Engine::start(runner, Some(tokenizer.clone()), cfg);
        Ok(Started {
            engine,
            tokenizer,
            model_id,
            limits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fp8_cache_on_a_model_with_qkv_biases_is_warned_about() {
        let config = |name: &str| {
            let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../examples/configs")
                .join(name);
            ModelConfig::from_hf_json(&p).unwrap()
        };
        let (qwen, llama) = (config("qwen2.5-7b.json"), config("llama3-8b.json"));
        assert!(qwen.attention_bias && !llama.attention_bias);
        let w = fp8_kv_warning(&qwen, KvCacheDtype::Fp8E4m3).unwrap();
        assert!(w.contains("bench kv-fp8"), "{w}");
        assert_eq!(fp8_kv_warning(&qwen, KvCacheDtype::Auto), None);
        assert_eq!(fp8_kv_warning(&llama, KvCacheDtype::Fp8E4m3), None);
    }

    #[test]
    fn step_limits_fit_the_device_and_flags_win() {
        let l = |gpu, kv, s, t| StepLimits::for_device(gpu, kv, s, t, None);
        // The CPU keeps small steps whatever its cache, and a step-time target.
        assert_eq!(
            l(false, 1 << 20, None, None),
            StepLimits {
                max_num_seqs: 64,
                max_num_batched_tokens: 2048,
                max_step_ms: 250
            }
        );
        // An H200's 8B cache (~60k blocks of 16): 256 sequences, 8192-token steps, no target.
        assert_eq!(
            l(true, 60_000 * 16, None, None),
            StepLimits {
                max_num_seqs: 256,
                max_num_batched_tokens: 8192,
                max_step_ms: 0
            }
        );
        // A small GPU cache: 512 KV tokens a sequence at least.
        assert_eq!(l(true, 32 * 1024, None, None).max_num_seqs, 64);
        assert_eq!(l(true, 100, None, None).max_num_seqs, 1);
        // Flags override each default on its own.
        assert_eq!(
            l(true, 60_000 * 16, Some(64), None),
            StepLimits {
                max_num_seqs: 64,
                max_num_batched_tokens: 8192,
                max_step_ms: 0
            }
        );
        assert_eq!(l(false, 0, None, Some(512)).max_num_batched_tokens, 512);
        assert_eq!(
            StepLimits::for_device(false, 0, None, None, Some(0)).max_step_ms,
            0,
            "--max-step-ms 0 turns the CPU's target off"
        );
        // A GPU takes a target only from the flag.
        assert_eq!(
            StepLimits::for_device(true, 60_000 * 16, None, None, Some(20)).max_step_ms,
            20
        );
    }
}
