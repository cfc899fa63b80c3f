//! An engine assembled from a server's settings: the runner of a model on its device, the step
//! limits that fit that device, then the engine thread. `cachet serve`, `cachet worker` and the
//! benchmarks that run a server's engine start it here, so they start it the same way.

use crate::config::ModelConfig;
use crate::device::{kv_int8, KvCacheDtype, WeightQuantization};
use crate::engine::{Engine, EngineConfig};
use crate::error::EngineError;
use crate::model::runner::{build_runner, RunnerOptions, WeightSource};
use crate::tokenizer::TextTokenizer;

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

/// What to tell a host who asks for the FP8 KV cache on a model it measurably hurts: models with
/// q/k/v biases (Qwen2.5) lose 8–23% of their top-1 choices with it (BENCHMARKS §4).
pub fn fp8_kv_warning(config: &ModelConfig, dtype: KvCacheDtype) -> Option<String> {
    (dtype == KvCacheDtype::Fp8E4m3 && config.attention_bias).then(|| {
        "--kv-cache-dtype fp8 on a model with q/k/v biases: on Qwen2.5 it changed 8-23% of the \
         top-1 tokens (BENCHMARKS §4); check this model with `cachet bench kv-fp8`, or use \
         --kv-cache-dtype int8 (the same bytes) or the default cache"
            .to_string()
    })
}

/// Where the weights come from.
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    /// The model's files (a path or a known model's name), read as the runner is built.
    Files(&'a str),
    /// Random weights of the config (`--load-format dummy`).
    Dummy,
}

/// An engine to start: the model, the runner's and the engine's settings, and the step-limit
/// flags that override the device's defaults.
pub struct EngineBuild<'a> {
    /// The model's config (for [`Weights::Dummy`], the config the random weights take).
    pub config: &'a ModelConfig,
    pub weights: Weights<'a>,
    pub tokenizer: TextTokenizer,
    /// The runner's settings; `quantization` and `kv_calibration` are set here.
    pub runner: RunnerOptions,
    /// `--quantization` (`None`: as the checkpoint has it).
    pub quantization: Option<WeightQuantization>,
    /// `--max-num-seqs`, `--max-num-batched-tokens`, `--max-step-ms`, each over the default.
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub max_step_ms: Option<u64>,
    /// The engine's settings; the scheduler's step limits are set here.
    pub engine: EngineConfig,
}

/// A started engine and the step limits it runs with.
pub struct Built {
    pub engine: Engine,
    pub limits: StepLimits,
}

/// Why an engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(
        "--max-num-batched-tokens {tokens} is below --max-model-len {max_model_len}: with \
         --enable-chunked-prefill false a prompt is prefilled in one step, so a longer one could \
         never run; raise --max-num-batched-tokens to {max_model_len} or more, lower \
         --max-model-len, or enable chunked prefill"
    )]
    StepBelowModelLen { tokens: usize, max_model_len: usize },
}

impl EngineBuild<'_> {
    /// Builds the runner (the weights read and uploaded as it is), sizes the steps to the
    /// device and starts the engine thread.
    pub fn start(self) -> Result<Built, BuildError> {
        let EngineBuild {
            config,
            weights,
            tokenizer,
            mut runner,
            quantization,
            max_num_seqs,
            max_num_batched_tokens,
            max_step_ms,
            mut engine,
        } = self;
        runner.quantization = WeightQuantization::for_checkpoint(quantization, config);
        if quantization.is_none() && runner.quantization != WeightQuantization::None {
            tracing::info!(quantization = %runner.quantization, "an FP8 checkpoint scaled per channel: its weights stay FP8 (--quantization none dequantizes them)");
        }
        if runner.kv_cache_dtype == KvCacheDtype::Int8 {
            runner.kv_calibration = kv_int8::calibration_tokens(&tokenizer)?;
        }
        if let Some(w) = fp8_kv_warning(config, runner.kv_cache_dtype) {
            tracing::warn!("{w}");
        }
        let source = match weights {
            Weights::Files(name) => WeightSource::Files(name),
            Weights::Dummy => WeightSource::Dummy { seed: 0 },
        };
        let built = build_runner(config, source, &runner)?;
        let layout = built.kv_layout();
        let kv_tokens = layout.num_blocks * layout.block_size;
        let mut limits = StepLimits::for_device(
            built.device_name() != "cpu",
            kv_tokens,
            max_num_seqs,
            max_num_batched_tokens,
            max_step_ms,
        );
        // Without chunked prefill a prompt goes into one step whole: a step must hold the
        // longest prompt the server accepts, or such a prompt would wait forever.
        let s = &mut engine.scheduler;
        if !s.enable_chunked_prefill && limits.max_num_batched_tokens < runner.max_model_len {
            if max_num_batched_tokens.is_some() {
                return Err(BuildError::StepBelowModelLen {
                    tokens: limits.max_num_batched_tokens,
                    max_model_len: runner.max_model_len,
                });
            }
            limits.max_num_batched_tokens = runner.max_model_len;
        }
        tracing::info!(
            device = built.device_name(),
            max_num_seqs = limits.max_num_seqs,
            max_num_batched_tokens = limits.max_num_batched_tokens,
            max_step_ms = limits.max_step_ms,
            kv_tokens,
            from_flags =
                max_num_seqs.is_some() || max_num_batched_tokens.is_some() || max_step_ms.is_some(),
            "step limits"
        );
        s.max_num_seqs = limits.max_num_seqs;
        s.max_num_batched_tokens = limits.max_num_batched_tokens;
        s.max_model_len = runner.max_model_len;
        s.max_step_secs = limits.max_step_ms as f64 / 1000.0;
        // What the engine runs with, read from the config it is given (every engine flag's
        // value in force shows here or in the step-limit and KV-cache lines).
        tracing::info!(
            max_model_len = s.max_model_len,
            enable_chunked_prefill = s.enable_chunked_prefill,
            policy = ?s.policy,
            fair_share = s.fair_share,
            fair_prefill_cap = s.fair_prefill_cap,
            enable_prefix_caching = engine.enable_prefix_caching,
            cache_shares = engine.cache_shares,
            max_waiting = engine.max_waiting,
            max_waiting_tokens = engine.max_waiting_tokens,
            speculative = ?engine.speculative.as_ref().map(|c| (c.method.clone(), c.num_speculative_tokens)),
            quantization = %runner.quantization,
            tensor_parallel_size = runner.tensor_parallel_size,
            "engine settings"
        );
        let engine = Engine::start(built, Some(tokenizer), engine);
        Ok(Built { engine, limits })
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
