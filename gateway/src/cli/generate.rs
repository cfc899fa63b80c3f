//! `cachet generate` and `cachet logits`: run a model directly, no server.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context};
use cachet_backend::config::ModelConfig;
use cachet_backend::device::{kv_int8, ForwardBatch, KvCacheDtype, WeightQuantization};
use cachet_backend::generate::{self, GenerateParams};
use cachet_backend::kv::SimpleAllocator;
use cachet_backend::loader::{self, ModelMeta};
use cachet_backend::model::runner::{build_runner, KvBudget, Runner, RunnerOptions, WeightSource};
use cachet_backend::sampler::SamplingParams;
use cachet_backend::tokenizer::{ChatMessage, IncrementalDecoder, TextTokenizer};
use clap::{Args, ValueEnum};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    /// CUDA when a GPU is usable, else the CPU (refused where a GPU is present but CUDA cannot
    /// use it: give --device cpu for the CPU there).
    Auto,
    /// The f32 CPU reference.
    Cpu,
    /// The bf16 CUDA engine (kernels compiled with NVRTC at start-up).
    Cuda,
}

impl From<DeviceKind> for cachet_backend::model::runner::DeviceKind {
    fn from(d: DeviceKind) -> Self {
        match d {
            DeviceKind::Auto => Self::Auto,
            DeviceKind::Cpu => Self::Cpu,
            DeviceKind::Cuda => Self::Cuda,
        }
    }
}

#[derive(Args, Debug)]
pub struct ModelArgs {
    /// Model: a Hugging Face id (`org/name`, or `org/name/FILE.gguf`; downloaded into the HF
    /// cache), a name from `cachet model list` (e.g. `smollm2`), an HF directory (config.json +
    /// *.safetensors + tokenizer.json), or a .gguf file.
    #[arg(long, short)]
    pub model: String,
    /// The Hub revision of a model given by id: a branch, tag or commit (default: main).
    #[arg(long)]
    pub revision: Option<String>,
    /// Device to run on.
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Tokens in the paged KV cache's blocks.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Longest sequence (prompt + output) accepted; default: the model's context length, at most 8192.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Run every step eagerly: no CUDA graph for the decode steps.
    #[arg(long)]
    pub enforce_eager: bool,
    /// KV cache storage: auto (the device's type: bf16 on CUDA, f32 on the CPU), fp8 (e4m3
    /// with a scale per token and KV head: about twice the blocks in the same memory) or int8
    /// (the same bytes: static per-channel scales calibrated at load, bf16 outlier channels).
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
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(long, short)]
    pub prompt: String,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat (default: the template's own, if any).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Seed for sampling; the same seed gives the same text.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Prompt tokens per forward pass while prefilling.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Also write the prompt and generated token ids as JSON to this file.
    #[arg(long)]
    pub ids_out: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids, e.g. `1,2,3`.
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "prompt",
        conflicts_with = "prompt"
    )]
    pub ids: Vec<u32>,
    /// Text to tokenize instead of --ids.
    #[arg(long)]
    pub prompt: Option<String>,
    /// How many of the largest logits to print.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Also write every logit of the last position (with --decode-last ROWS, of each of the
    /// last ROWS positions, one after another) as little-endian f32 to this file.
    #[arg(long)]
    pub dump: Option<std::path::PathBuf>,
    /// Run the last token (or the last ROWS tokens, as a speculative verification step does) as
    /// a step of its own after the rest is prefilled, the way generation computes it, instead
    /// of as the last row of one prefill.
    #[arg(long, value_name = "ROWS", num_args = 0..=1, default_missing_value = "1")]
    pub decode_last: Option<usize>,
}

/// The model's config and tokenizer (its weights are read as the runner is built). A built-in
/// or Hub model is fetched on first use; `args.model` then names its local files.
fn load(args: &mut ModelArgs) -> anyhow::Result<ModelMeta> {
    let local = loader::fetch_model(
        &args.model,
        args.revision.as_deref(),
        loader::hub::Want::Model,
        true,
    )
    .with_context(|| format!("fetching `{}`", args.model))?;
    args.model = local.spec;
    loader::load_meta(&args.model).with_context(|| format!("reading model `{}`", args.model))
}

/// A runner for `tokens` tokens of one sequence, its weights read from the model's files and
/// uploaded as they are read (the host holds one layer at a time).
fn runner_for(
    config: &ModelConfig,
    args: &ModelArgs,
    tokens: usize,
    tokenizer: Option<&TextTokenizer>,
) -> anyhow::Result<Box<dyn Runner>> {
    let kv_calibration = match (args.kv_cache_dtype, tokenizer) {
        (KvCacheDtype::Int8, Some(t)) => kv_int8::calibration_tokens(t)?,
        (KvCacheDtype::Int8, None) => {
            tracing::warn!(
                "this model has no tokenizer: the int8 KV cache calibrates on the calibration \
                 text's bytes as token ids (fine for random weights, weaker for trained ones)"
            );
            kv_int8::dummy_calibration_tokens(config.vocab_size)
        }
        _ => Vec::new(),
    };
    let max_len = args
        .max_model_len
        .unwrap_or(config.max_position_embeddings.min(8192));
    if tokens > max_len {
        bail!("{tokens} tokens do not fit max_model_len {max_len} (raise --max-model-len)");
    }
    let opts = RunnerOptions {
        device: args.device.into(),
        block_size: args.block_size,
        max_model_len: max_len,
        fit_max_model_len: false,
        kv: KvBudget::Blocks(tokens.div_ceil(args.block_size) + 1),
        // One sequence: its decode steps replay one graph.
        cuda_graph_sizes: if args.enforce_eager { vec![] } else { vec![1] },
        cuda_graph_verify: None,
        kv_cache_dtype: args.kv_cache_dtype,
        quantization: WeightQuantization::for_checkpoint(args.quantization, config),
        tensor_parallel_size: args.tensor_parallel_size,
        kv_calibration,
    };
    let t0 = Instant::now();
    let runner = build_runner(config, WeightSource::Files(&args.model), &opts)
        .with_context(|| format!("loading model `{}`", args.model))?;
    tracing::info!(
        params = config.num_parameters(),
        layers = config.num_hidden_layers,
        secs = t0.elapsed().as_secs_f32(),
        "model loaded"
    );
    Ok(runner)
}

pub fn generate(mut a: GenerateArgs, given: &super::flags::Given) -> anyhow::Result<()> {
    super::flags::device_flags(given, a.model.device)?;
    if a.temperature == 0.0 {
        given.refuse(
            &["top_p", "top_k", "seed"],
            "for sampling",
            "--temperature 0 picks the likeliest token every time",
        )?;
    }
    let ModelMeta {
        config, tokenizer, ..
    } = load(&mut a.model)?;
    let tok = tokenizer
        .as_ref()
        .context("this model has no tokenizer; use `cachet logits --ids`")?;
    // A rendered chat carries its own BOS where the template has one; a plain prompt gets what
    // the tokenizer adds to a sequence.
    let prompt = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage::new("system", s));
        }
        msgs.push(ChatMessage::new("user", &a.prompt));
        tok.encode(&tok.render_chat(&msgs, true)?)?
    } else {
        tok.encode_prompt(&a.prompt)?
    };
    let mut runner = runner_for(&config, &a.model, prompt.len() + a.max_tokens, Some(tok))?;
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
            ..Default::default()
        },
        stop_token_ids: if a.ignore_eos {
            vec![]
        } else {
            config.eos_token_ids.clone()
        },
        prefill_chunk: a.prefill_chunk,
    };
    let mut dec = IncrementalDecoder::new();
    let mut stdout = std::io::stdout();
    let t0 = Instant::now();
    let mut first: Option<f64> = None;
    let mut write_err = None;
    let out = generate::generate(runner.as_mut(), &prompt, &params, |id| {
        first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
        match dec.push(tok, id) {
            Ok(Some(piece)) => {
                if let Err(e) = stdout
                    .write_all(piece.as_bytes())
                    .and_then(|_| stdout.flush())
                {
                    write_err = Some(e);
                    return false;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("detokenizing: {e}"),
        }
        true
    })?;
    if let Some(path) = &a.ids_out {
        let doc = serde_json::json!({"prompt_ids": prompt, "output_ids": out.tokens, "device": runner.device_name()});
        std::fs::write(path, doc.to_string())
            .with_context(|| format!("writing {}", path.display()))?;
        tracing::info!(path = %path.display(), "ids written");
    }
    if let Some(e) = write_err {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    println!();
    let total = t0.elapsed().as_secs_f64();
    let ttft = first.unwrap_or(total);
    let decode_tokens = out.tokens.len().saturating_sub(1);
    tracing::info!(
        device = runner.device_name(),
        prompt_tokens = prompt.len(),
        generated = out.tokens.len(),
        finish = ?out.finish,
        ttft_ms = (ttft * 1e3).round(),
        decode_tok_per_s = if decode_tokens > 0 { (decode_tokens as f64 / (total - ttft)).round() } else { 0.0 },
        "done"
    );
    Ok(())
}

pub fn logits(mut a: LogitsArgs) -> anyhow::Result<()> {
    let ModelMeta {
        config, tokenizer, ..
    } = load(&mut a.model)?;
    let ids = match &a.prompt {
        Some(p) => tokenizer
            .as_ref()
            .context("this model has no tokenizer; pass --ids")?
            .encode_prompt(p)?,
        None => a.ids.clone(),
    };
    if ids.is_empty() {
        bail!("no token ids given");
    }
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= config.vocab_size) {
        bail!(
            "token id {bad} is outside the vocabulary (size {})",
            config.vocab_size
        );
    }
    let mut runner = runner_for(&config, &a.model, ids.len(), tokenizer.as_ref())?;
    let logits = if let Some(rows) = a.decode_last {
        if rows == 0 || rows > ids.len() {
            anyhow::bail!(
                "--decode-last {rows}: give 1 to the prompt's length ({})",
                ids.len()
            );
        }
        cachet_backend::generate::last_logits(runner.as_mut(), &ids, rows, ids.len())?
    } else {
        let layout = runner.kv_layout();
        let mut alloc = SimpleAllocator::new(layout.num_blocks, layout.block_size);
        let mut table = Vec::new();
        alloc.ensure(&mut table, ids.len())?;
        let mut batch = ForwardBatch::default();
        batch.push_seq(&ids, 0, &table, layout.block_size, true);
        runner.forward(&batch)?
    };
    let rows = a.decode_last.unwrap_or(1);
    let row = logits.row(rows - 1);
    if let Some(path) = &a.dump {
        let bytes: Vec<u8> = (0..rows)
            .flat_map(|r| logits.row(r).iter().flat_map(|x| x.to_le_bytes()))
            .collect();
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&x, &y| row[y].total_cmp(&row[x]).then(x.cmp(&y)));
    let top: Vec<serde_json::Value> = idx
        .iter()
        .take(a.top)
        .map(|&i| serde_json::json!({"id": i, "logit": row[i]}))
        .collect();
    println!("{}", serde_json::Value::Array(top));
    Ok(())
}
