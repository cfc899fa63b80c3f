//! `cachet bench forward`: forward-pass timings of a model on a device against the device's own
//! measured ceilings (copy bandwidth, cuBLAS GEMM rate), measured in the same run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use cachet_backend::config::ModelConfig;
use cachet_backend::device::{kv_int8, ForwardBatch, KvCacheDtype, StepPlan, WeightQuantization};
use cachet_backend::loader;
use cachet_backend::model::runner::{build_runner, KvBudget, Runner, RunnerOptions, WeightSource};
use clap::Args;

use super::super::engine_args::{GraphArgs, LoadFormat};
use super::super::generate::DeviceKind;

mod floors;
use floors::{kv_bytes, prefill_gemm_shapes, token_parameters, weight_bytes_per_decode_step};

#[derive(Args, Debug)]
pub struct ForwardArgs {
    /// Model: a known name, an HF directory, a .gguf, or (with --load-format dummy) a config.json.
    #[arg(long, short)]
    pub model: String,
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    #[arg(long, value_enum, default_value_t = DeviceKind::Auto)]
    pub device: DeviceKind,
    /// Share of device memory for weights + KV cache.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Decode batch sizes (at --decode-context tokens of context each).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub decode_batches: Vec<usize>,
    /// Contexts for batch-1 decode.
    #[arg(long, value_delimiter = ',', default_value = "512,4096")]
    pub decode_contexts: Vec<usize>,
    /// Context of the batched decode rows.
    #[arg(long, default_value_t = 512)]
    pub decode_context: usize,
    /// Prompt lengths to prefill in one pass.
    #[arg(long, value_delimiter = ',', default_value = "512,2048,8192")]
    pub prefill: Vec<usize>,
    /// TTFT of a (cached + new)-token prompt whose first `cached` tokens are in the KV cache, as
    /// `total:cached`.
    #[arg(long, default_value = "8192:6144")]
    pub cached_prefix: String,
    #[arg(long, default_value_t = 8192)]
    pub max_model_len: usize,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    #[command(flatten)]
    pub graphs: GraphArgs,
    /// Decode batch sizes at which token selection is timed side by side: greedy, sampled,
    /// sampled with the logits processors (repetition penalty over the context, presence and
    /// frequency penalties, logit_bias), and with log-probabilities (top 20) on top.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub sampling_batches: Vec<usize>,
    /// Decode batch sizes timed eagerly and from CUDA graphs side by side.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub graph_batches: Vec<usize>,
    /// Also time each operation with device events (decode batch 1 at the longest context, the
    /// largest decode batch, the longest prefill) and print where the time goes.
    #[arg(long)]
    pub profile: bool,
    /// KV cache storage: auto (the device's type: bf16 on CUDA, f32 on the CPU), fp8 (e4m3
    /// with a scale per token and KV head: about twice the blocks in the same memory) or int8
    /// (the same bytes: static per-channel scales calibrated at load, bf16 outlier channels).
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: cachet_backend::device::KvCacheDtype,
    /// Projection weights: none (as loaded: bf16 on CUDA, f32 on the CPU) or fp8 (e4m3 with a
    /// scale per output row, quantized at load: half the weight memory; decode steps of up to
    /// four sequences stream half the bytes through the FP8 GEMV, larger steps quantize their
    /// inputs per token for cuBLASLt's FP8 GEMM; experts go through the FP8 expert kernels).
    /// The embedding table, the LM head and the norms stay as loaded.
    #[arg(long, default_value = "none")]
    pub quantization: cachet_backend::device::WeightQuantization,
    /// Ranks to split the model over (Megatron-style tensor parallelism: each rank holds its
    /// share of the attention heads, the MLP and the vocabulary, with an all-reduce after each
    /// row-parallel projection). On the CPU device the ranks are threads of this process; on
    /// CUDA one GPU each (rank r on GPU r), collectives through NCCL. Floors are per GPU (its
    /// share of the weights and its KV heads); prefill rates against N × one GPU's GEMM
    /// ceiling; `--profile` shows the all-reduce's time.
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
}

/// Milliseconds of the all-reduces a step of `rows` rows makes over the runner's
/// tensor-parallel ranks (two a layer, of `rows × hidden` values), measured on their own;
/// `None` for a model on one device.
fn all_reduce_ms(
    r: &mut dyn Runner,
    config: &ModelConfig,
    rows: usize,
) -> anyhow::Result<Option<f64>> {
    let t = r.time_all_reduce(rows * config.hidden_size, 2 * config.num_hidden_layers)?;
    Ok(t.map(|s| s * 1e3))
}

/// Times `f` (after warm-up), synchronising the device; median seconds.
fn time(
    r: &mut dyn Runner,
    warm: usize,
    reps: usize,
    mut f: impl FnMut(&mut dyn Runner) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    for _ in 0..warm {
        f(r)?;
    }
    r.synchronize()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f(r)?;
        r.synchronize()?;
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// A batch of `seqs` sequences, each computing `new` tokens after `ctx` cached ones, with
/// disjoint block tables from block 0 on.
fn batch(seqs: usize, ctx: usize, new: usize, bs: usize, vocab: usize) -> ForwardBatch {
    let per = (ctx + new).div_ceil(bs);
    let mut b = ForwardBatch::default();
    for s in 0..seqs {
        let table: Vec<u32> = ((s * per) as u32..((s + 1) * per) as u32).collect();
        let toks: Vec<u32> = (0..new)
            .map(|i| ((s * 7919 + i * 31 + 10) % vocab) as u32)
            .collect();
        b.push_seq(&toks, ctx, &table, bs, true);
    }
    b
}

/// A matmul as (rows, out features, in features).
type GemmShape = (usize, usize, usize);

pub fn run(a: ForwardArgs) -> anyhow::Result<()> {
    let (config, r) = load(&a)?;
    let mut b = Bench::new(&a, &config, r)?;
    b.decode_single()?;
    b.decode_batches()?;
    b.sampling()?;
    b.graphs()?;
    b.prefill()?;
    b.cached_prefix()?;
    b.profile()?;
    if let Some(p) = &a.json_out {
        let doc =
            serde_json::json!({"device": b.r.device_name(), "calibration": b.cal, "rows": b.rows});
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

/// The model's config and a runner of it on the device, as the flags say.
fn load(a: &ForwardArgs) -> anyhow::Result<(ModelConfig, Box<dyn Runner>)> {
    let (config, host);
    let mut kv_calibration = Vec::new();
    let weights = match a.load_format {
        LoadFormat::Dummy => {
            let path = PathBuf::from(
                loader::fetch_model(&a.model, None, loader::hub::Want::Config, true)?.spec,
            );
            let cfg_path = if path.is_dir() {
                path.join("config.json")
            } else {
                path
            };
            config = ModelConfig::from_hf_json(&cfg_path)?;
            if a.kv_cache_dtype == KvCacheDtype::Int8 {
                kv_calibration = kv_int8::dummy_calibration_tokens(config.vocab_size);
            }
            WeightSource::Dummy { seed: 0 }
        }
        LoadFormat::Auto => {
            let model = loader::fetch_model(&a.model, None, loader::hub::Want::Model, true)?.spec;
            host = loader::load(&model, true).with_context(|| format!("loading {}", a.model))?;
            config = host.config.clone();
            if a.kv_cache_dtype == KvCacheDtype::Int8 {
                kv_calibration = kv_int8::calibration_tokens(host.tokenizer.as_ref().context(
                    "the int8 KV cache calibrates on text: this model has no tokenizer",
                )?)?;
            }
            WeightSource::Host(&host.weights)
        }
    };
    let opts = RunnerOptions {
        device: a.device.into(),
        block_size: 16,
        max_model_len: a.max_model_len,
        fit_max_model_len: false,
        kv: KvBudget::MemoryFraction(a.gpu_memory_utilization),
        cuda_graph_sizes: a.graphs.sizes(usize::MAX),
        cuda_graph_verify: None,
        kv_cache_dtype: a.kv_cache_dtype,
        quantization: a.quantization,
        tensor_parallel_size: a.tensor_parallel_size,
        kv_calibration,
    };
    let r = build_runner(&config, weights, &opts)?;
    Ok((config, r))
}

/// One `bench forward` run: the runner, the measured ceilings and the rows of the JSON output.
struct Bench<'a> {
    a: &'a ForwardArgs,
    config: &'a ModelConfig,
    r: Box<dyn Runner>,
    cal: Option<cachet_backend::device::Calibration>,
    /// Ranks, as a divisor of the bytes each GPU reads.
    tp: f64,
    /// Bytes of an activation or KV element.
    elem: f64,
    bs: usize,
    max_blocks: usize,
    rows: Vec<serde_json::Value>,
}

impl<'a> Bench<'a> {
    /// Calibrates the device and prints the model, the ceilings and the table's head.
    fn new(
        a: &'a ForwardArgs,
        config: &'a ModelConfig,
        r: Box<dyn Runner>,
    ) -> anyhow::Result<Self> {
        let tp = a.tensor_parallel_size as f64;
        let dev = r.device_name();
        let elem = if dev == "cpu" { 4.0 } else { 2.0 };
        let bs = r.kv_layout().block_size;
        let cal = r.calibrate()?;
        println!(
            "model: {} layers, hidden {}, {:.2} B parameters ({:.2} B per token); device {dev}; \
             KV blocks {} ({}); projection weights {}",
            config.num_hidden_layers,
            config.hidden_size,
            config.num_parameters() as f64 / 1e9,
            config.active_parameters() as f64 / 1e9,
            r.kv_layout().num_blocks,
            a.kv_cache_dtype,
            match a.quantization {
                WeightQuantization::None => "as loaded",
                WeightQuantization::Fp8 => "FP8 (e4m3, a scale per row)",
            }
        );
        if let Some(c) = cal {
            println!(
                "measured ceilings: copy {:.2} TB/s (read+write), bf16 GEMM 8192³ {:.0} TFLOP/s\n",
                c.copy_bytes_per_s / 1e12,
                c.gemm_flops / 1e12
            );
        }
        println!("| measurement | time | rate | floor / ceiling | ratio |");
        println!("|---|---|---|---|---|");
        let max_blocks = r.kv_layout().num_blocks;
        Ok(Bench {
            a,
            config,
            r,
            cal,
            tp,
            elem,
            bs,
            max_blocks,
            rows: Vec::new(),
        })
    }

    /// Decode steps of one sequence at each context length, against the bytes they read.
    fn decode_single(&mut self) -> anyhow::Result<()> {
        let (a, config, cal, tp, elem, bs, max_blocks) = (
            self.a,
            self.config,
            self.cal,
            self.tp,
            self.elem,
            self.bs,
            self.max_blocks,
        );
        let (r, rows) = (&mut self.r, &mut self.rows);
        for &ctx in &a.decode_contexts {
            if (ctx + 1).div_ceil(bs) > max_blocks {
                continue;
            }
            let b = batch(1, ctx, 1, bs, config.vocab_size);
            let sample_rows = StepPlan::greedy(1);
            let t = time(r.as_mut(), 3, 20, |r| {
                r.forward_step(&b, &sample_rows)
                    .map(|_| ())
                    .map_err(Into::into)
            })?;
            // Per GPU: its share of the weights (the layout is already a rank's KV heads).
            let bytes = weight_bytes_per_decode_step(config, elem, a.quantization, 1) / tp
                + kv_bytes(&r.kv_layout(), ctx, elem);
            let ar = all_reduce_ms(r.as_mut(), config, 1)?;
            let (floor, ratio) = match cal {
                Some(c) => {
                    // DRAM moves a copy's reads and writes at this combined rate; a decode step's
                    // reads can use all of it. Split over ranks, the step's all-reduces are added
                    // as measured on their own.
                    let f = bytes / c.copy_bytes_per_s * 1e3 + ar.unwrap_or(0.0);
                    (
                        match ar {
                            Some(ar) => format!(
                                "{f:.2} ms (per-GPU bytes ÷ copy bandwidth + all-reduces {ar:.3} ms)"
                            ),
                            None => format!("{f:.2} ms (bytes ÷ copy bandwidth)"),
                        },
                        format!("{:.2}×", t * 1e3 / f),
                    )
                }
                None => ("-".into(), "-".into()),
            };
            println!(
                "| decode batch 1, ctx {ctx} | {:.2} ms/token | {:.1} tok/s | {floor} | {ratio} |",
                t * 1e3,
                1.0 / t
            );
            rows.push(serde_json::json!({"kind": "decode", "batch": 1, "ctx": ctx, "ms": t * 1e3, "bytes": bytes}));
        }
        Ok(())
    }

    /// Decode steps of `--decode-batches` sequences, against the bytes and the roofline.
    fn decode_batches(&mut self) -> anyhow::Result<()> {
        let (a, config, cal, tp, elem, bs, max_blocks) = (
            self.a,
            self.config,
            self.cal,
            self.tp,
            self.elem,
            self.bs,
            self.max_blocks,
        );
        let (r, rows) = (&mut self.r, &mut self.rows);
        for &n in &a.decode_batches {
            let ctx = a.decode_context;
            if n * (ctx + 1).div_ceil(bs) > max_blocks {
                println!("| decode batch {n}, ctx {ctx} | skipped: needs more KV blocks than allocated | | | |");
                continue;
            }
            let b = batch(n, ctx, 1, bs, config.vocab_size);
            // As the engine runs a decode step: greedy tokens chosen on the device where it can.
            let sample_rows = StepPlan::greedy(n);
            let t = time(r.as_mut(), 3, 10, |r| {
                r.forward_step(&b, &sample_rows)
                    .map(|_| ())
                    .map_err(Into::into)
            })?;
            let weights = weight_bytes_per_decode_step(config, elem, a.quantization, n) / tp;
            let kv = n as f64 * kv_bytes(&r.kv_layout(), ctx, elem);
            let ar = all_reduce_ms(r.as_mut(), config, n)?.unwrap_or(0.0);
            let (floor, ratio, floors) = match cal {
                Some(c) => {
                    // Bytes ÷ copy rate, as for batch 1 — and the roofline: at a high batch the
                    // projections are bound by the GEMM's arithmetic (2 FLOP per weight per row at
                    // the measured GEMM ceiling), not by reading the weights once; attention by
                    // reading the KV.
                    let bytes_ms = (weights + kv) / c.copy_bytes_per_s * 1e3 + ar;
                    let gemm_ms =
                        2.0 * n as f64 * token_parameters(config) / tp / c.gemm_flops * 1e3;
                    let roof_ms = (weights / c.copy_bytes_per_s * 1e3).max(gemm_ms)
                        + kv / c.copy_bytes_per_s * 1e3
                        + ar;
                    (
                        format!("{bytes_ms:.2} ms (bytes ÷ copy) · {roof_ms:.2} ms (roofline)"),
                        format!("{:.2}× · {:.2}×", t * 1e3 / bytes_ms, t * 1e3 / roof_ms),
                        Some((bytes_ms, roof_ms)),
                    )
                }
                None => ("-".into(), "-".into(), None),
            };
            println!(
                "| decode batch {n}, ctx {ctx} | {:.2} ms/step | {:.0} tok/s | {floor} | {ratio} |",
                t * 1e3,
                n as f64 / t
            );
            rows.push(
                serde_json::json!({"kind": "decode", "batch": n, "ctx": ctx, "ms": t * 1e3,
                "bytes": weights + kv, "bytes_floor_ms": floors.map(|f| f.0),
                "roofline_floor_ms": floors.map(|f| f.1)}),
            );
        }
        Ok(())
    }

    /// Decode steps choosing tokens greedily, sampled, with processors and with logprobs.
    fn sampling(&mut self) -> anyhow::Result<()> {
        let (a, config, bs, max_blocks) = (self.a, self.config, self.bs, self.max_blocks);
        let (r, rows) = (&mut self.r, &mut self.rows);
        if !a.sampling_batches.is_empty() {
            println!(
                "\n| decode step, ctx {} | greedy | sampled | + processors | + logprobs (top 20) |",
                a.decode_context
            );
            println!("|---|---|---|---|---|");
        }
        for &n in &a.sampling_batches {
            let ctx = a.decode_context;
            if n * (ctx + 1).div_ceil(bs) > max_blocks {
                continue;
            }
            let b = batch(n, ctx, 1, bs, config.vocab_size);
            let plans = sampling_plans(n, ctx, config.vocab_size);
            let mut ms = Vec::new();
            for plan in &plans {
                ms.push(
                    time(r.as_mut(), 3, 20, |r| {
                        r.forward_step(&b, plan).map(|_| ()).map_err(Into::into)
                    })? * 1e3,
                );
            }
            println!(
                "| batch {n} | {:.3} ms | {:.3} ms ({:.2}×) | {:.3} ms ({:.2}×) | {:.3} ms ({:.2}×) |",
                ms[0],
                ms[1],
                ms[1] / ms[0],
                ms[2],
                ms[2] / ms[0],
                ms[3],
                ms[3] / ms[0]
            );
            rows.push(
                serde_json::json!({"kind": "sampling", "batch": n, "ctx": ctx,
                "greedy_ms": ms[0], "sampled_ms": ms[1], "processors_ms": ms[2], "logprobs_ms": ms[3],
                "edits_per_row": plans[2].edits.len() / n.max(1)}),
            );
        }
        Ok(())
    }

    /// Decode steps eager and replayed from CUDA graphs (devices with graphs).
    fn graphs(&mut self) -> anyhow::Result<()> {
        let (a, config, bs, max_blocks) = (self.a, self.config, self.bs, self.max_blocks);
        let (r, rows) = (&mut self.r, &mut self.rows);
        if let Some(g) = r.cuda_graphs() {
            println!(
                "\nCUDA graphs: {} captured in {:.0} ms, holding {:.0} MiB; {} kernel edges programmatic\n",
                g.graphs,
                g.capture_ms,
                g.bytes as f64 / (1u64 << 20) as f64,
                g.programmatic_edges
            );
            println!(
                "| decode step, ctx {} | eager | CUDA graphs | graphs / eager |",
                a.decode_context
            );
            println!("|---|---|---|---|");
            for &n in &a.graph_batches {
                let ctx = a.decode_context;
                if n * (ctx + 1).div_ceil(bs) > max_blocks {
                    continue;
                }
                let b = batch(n, ctx, 1, bs, config.vocab_size);
                let sample_rows = StepPlan::greedy(n);
                let mut step = |r: &mut dyn Runner| -> anyhow::Result<()> {
                    r.forward_step(&b, &sample_rows)?;
                    Ok(())
                };
                r.set_cuda_graphs(false);
                let eager = time(r.as_mut(), 3, 20, &mut step)?;
                r.set_cuda_graphs(true);
                let graphed = time(r.as_mut(), 3, 20, &mut step)?;
                println!(
                    "| batch {n} | {:.3} ms | {:.3} ms | {:.2}× |",
                    eager * 1e3,
                    graphed * 1e3,
                    graphed / eager
                );
                rows.push(serde_json::json!({"kind": "graphs", "batch": n, "ctx": ctx,
                    "eager_ms": eager * 1e3, "graph_ms": graphed * 1e3}));
            }
            println!();
        }
        Ok(())
    }

    /// Prefills against the GEMM ceiling measured next to each, and their GEMMs alone.
    fn prefill(&mut self) -> anyhow::Result<()> {
        let (a, config, cal, tp, bs, max_blocks) = (
            self.a,
            self.config,
            self.cal,
            self.tp,
            self.bs,
            self.max_blocks,
        );
        let (r, rows) = (&mut self.r, &mut self.rows);
        // Each token's parameters (its experts only, in a mixture of experts).
        let matmul_params = token_parameters(config);
        let attn_flops = |n: usize| {
            // Causal: token i attends to i + 1 keys, at most a sliding layer's window; QKᵀ and PV,
            // 2 FLOP per MAC.
            let keys: f64 = (0..config.num_hidden_layers)
                .map(|l| {
                    let w = config.layer_window(l).unwrap_or(usize::MAX);
                    (1..=n).map(|k| k.min(w) as f64).sum::<f64>()
                })
                .sum();
            4.0 * keys * (config.num_attention_heads * config.head_dim) as f64
        };
        for &n in &a.prefill {
            if n.div_ceil(bs) > max_blocks || n > a.max_model_len {
                continue;
            }
            let b = batch(1, 0, n, bs, config.vocab_size);
            let t = time(r.as_mut(), 2, 5, |r| {
                r.forward(&b).map(|_| ()).map_err(Into::into)
            })?;
            let flops =
                2.0 * n as f64 * (matmul_params - (config.vocab_size * config.hidden_size) as f64)
                    + 2.0 * (config.vocab_size * config.hidden_size) as f64
                    + attn_flops(n);
            // The GEMM ceiling is measured again right after this prefill, so that both see the same
            // clocks (a long run of 8192³ GEMMs heats the card and its rate drifts by ~10% in a run).
            let near = if cal.is_some() { r.calibrate()? } else { None };
            // And the model's own matmuls at this prefill's rows, on their own (its shapes, which
            // cuBLAS may run well below its 8192³ rate): the prefill's time against them is the
            // share of the step that is not GEMM work.
            let gemms = match prefill_gemm_shapes(config, n) {
                Some((layer, head)) if cal.is_some() => {
                    match (
                        r.time_gemms(&layer, config.num_hidden_layers)?,
                        r.time_gemms(&[head], 1)?,
                    ) {
                        (Some(l), Some(h)) => Some(l + h),
                        _ => None,
                    }
                }
                _ => None,
            };
            let (ceil, ratio) = match near {
                Some(c) if tp > 1.0 => (
                    format!(
                        "{:.0} TFLOP/s ({tp} × cuBLAS on one GPU, measured next)",
                        tp * c.gemm_flops / 1e12
                    ),
                    format!("{:.0}%", 100.0 * flops / t / (tp * c.gemm_flops)),
                ),
                Some(c) => (
                    format!("{:.0} TFLOP/s (cuBLAS, measured next)", c.gemm_flops / 1e12),
                    format!("{:.0}%", 100.0 * flops / t / c.gemm_flops),
                ),
                None => ("-".into(), "-".into()),
            };
            let (ceil, ratio) = match gemms {
                Some(g) => (
                    format!("{ceil} · its GEMMs alone {:.1} ms", g * 1e3),
                    format!("{ratio} · {:.0}%", 100.0 * g / t),
                ),
                None => (ceil, ratio),
            };
            println!(
                "| prefill {n} tokens | {:.1} ms | {:.0} TFLOP/s | {ceil} | {ratio} |",
                t * 1e3,
                flops / t / 1e12
            );
            rows.push(
                serde_json::json!({"kind": "prefill", "tokens": n, "ms": t * 1e3, "flops": flops, "cublas_flops": near.map(|c| c.gemm_flops), "gemms_alone_ms": gemms.map(|g| g * 1e3)}),
            );
        }
        Ok(())
    }

    /// TTFT of a prompt with and without its cached prefix (`--cached-prefix`).
    fn cached_prefix(&mut self) -> anyhow::Result<()> {
        let (a, config, bs, max_blocks) = (self.a, self.config, self.bs, self.max_blocks);
        let (r, rows) = (&mut self.r, &mut self.rows);
        if let Some((total, cached)) = a
            .cached_prefix
            .split_once(':')
            .and_then(|(x, y)| Some((x.parse::<usize>().ok()?, y.parse::<usize>().ok()?)))
        {
            if total.div_ceil(bs) <= max_blocks && total <= a.max_model_len && cached < total {
                let full = batch(1, 0, total, bs, config.vocab_size);
                let t_full = time(r.as_mut(), 1, 3, |r| {
                    r.forward(&full).map(|_| ()).map_err(Into::into)
                })?;
                // The cached prefix's K/V are the ones the full run just wrote into the same blocks.
                let rest = batch(1, cached, total - cached, bs, config.vocab_size);
                let t_rest = time(r.as_mut(), 1, 3, |r| {
                    r.forward(&rest).map(|_| ()).map_err(Into::into)
                })?;
                println!(
                    "| TTFT {total}-token prompt, no cache | {:.1} ms | | | |",
                    t_full * 1e3
                );
                println!(
                    "| TTFT {total}-token prompt, {cached} cached | {:.1} ms | | | {:.1}× faster |",
                    t_rest * 1e3,
                    t_full / t_rest
                );
                rows.push(serde_json::json!({"kind": "ttft_cached", "total": total, "cached": cached, "ms_full": t_full * 1e3, "ms_cached": t_rest * 1e3}));
            }
        }
        Ok(())
    }

    /// Where the time goes, per operation, in the largest decode and prefill steps.
    fn profile(&mut self) -> anyhow::Result<()> {
        let (a, config, bs, max_blocks) = (self.a, self.config, self.bs, self.max_blocks);
        let (r, rows) = (&mut self.r, &mut self.rows);
        if a.profile {
            let mut shapes: Vec<(String, ForwardBatch, usize)> = Vec::new();
            if let Some(&ctx) = a
                .decode_contexts
                .iter()
                .filter(|&&c| (c + 1).div_ceil(bs) <= max_blocks)
                .max()
            {
                shapes.push((
                    format!("decode batch 1, ctx {ctx}"),
                    batch(1, ctx, 1, bs, config.vocab_size),
                    1,
                ));
            }
            if let Some(&n) = a
                .decode_batches
                .iter()
                .filter(|&&n| n * (a.decode_context + 1).div_ceil(bs) <= max_blocks)
                .max()
            {
                shapes.push((
                    format!("decode batch {n}, ctx {}", a.decode_context),
                    batch(n, a.decode_context, 1, bs, config.vocab_size),
                    n,
                ));
            }
            if let Some(&n) = a
                .prefill
                .iter()
                .filter(|&&n| n.div_ceil(bs) <= max_blocks && n <= a.max_model_len)
                .max()
            {
                shapes.push((
                    format!("prefill {n}"),
                    batch(1, 0, n, bs, config.vocab_size),
                    1,
                ));
            }
            for (name, b, n_rows) in shapes {
                let sample_rows = StepPlan::greedy(n_rows);
                r.forward_step(&b, &sample_rows)?;
                r.synchronize()?;
                r.set_profiling(true);
                let t = Instant::now();
                r.forward_step(&b, &sample_rows)?;
                r.synchronize()?;
                let wall = t.elapsed().as_secs_f64() * 1e3;
                let prof = r.take_profile()?;
                r.set_profiling(false);
                if prof.is_empty() {
                    println!("\n{name}: this device has no per-operation timing");
                    continue;
                }
                // `↳` rows are parts of an operation already counted.
                let total: f64 = prof
                    .iter()
                    .filter(|p| !p.0.starts_with('↳'))
                    .map(|p| p.1)
                    .sum();
                println!("\nwhere the time goes — {name} (device events; step {wall:.2} ms wall, {total:.2} ms in timed operations):\n");
                println!("| operation | calls | ms | share |");
                println!("|---|---|---|---|");
                for (op, ms, n) in &prof {
                    println!("| {op} | {n} | {ms:.3} | {:.0}% |", 100.0 * ms / wall);
                }
                rows_json_profile(rows, &name, wall, &prof);
            }
        }
        Ok(())
    }
}

fn rows_json_profile(
    rows: &mut Vec<serde_json::Value>,
    name: &str,
    wall_ms: f64,
    prof: &[(String, f64, usize)],
) {
    let ops: Vec<serde_json::Value> = prof
        .iter()
        .map(|(op, ms, n)| serde_json::json!({"op": op, "ms": ms, "calls": n}))
        .collect();
    rows.push(
        serde_json::json!({"kind": "profile", "shape": name, "wall_ms": wall_ms, "ops": ops}),
    );
}

/// The four token-selection plans of `n` decode rows at `ctx` tokens of context: greedy;
/// temperature 1 with top-p 0.95 and top-k 50; that with the processors a chat client turns on
/// (repetition penalty over the context's distinct tokens, presence and frequency penalties on
/// the output, four logit_bias entries); that with log-probabilities, top 20.
fn sampling_plans(n: usize, ctx: usize, vocab: usize) -> [StepPlan; 4] {
    use cachet_backend::device::RowSampling;
    use cachet_backend::sampler::{row_edits, SamplingParams, TokenHistory};
    let p = SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        top_k: 50,
        seed: Some(1),
        presence_penalty: 0.5,
        frequency_penalty: 0.5,
        repetition_penalty: 1.1,
        logit_bias: vec![(11, -100.0), (13, 5.0), (17, 2.0), (19, -2.0)],
        ..Default::default()
    };
    let greedy = StepPlan::greedy(n);
    let mut sampled = greedy.clone();
    sampled.rows = (0..n).map(|i| RowSampling::new(&p, 1, i as u64)).collect();
    let mut processed = sampled.clone();
    for row in 0..n {
        // A context of `ctx` tokens: a prompt of 3/4 of it, the output the rest.
        let tok = |i: usize| ((row * 7919 + i * 104_729) % vocab) as u32;
        let prompt: Vec<u32> = (0..ctx * 3 / 4).map(tok).collect();
        let mut h = TokenHistory::new(&p, &prompt);
        (ctx * 3 / 4..ctx).for_each(|i| h.push(tok(i)));
        processed.edits.push_row(row, &row_edits(&p, &h, &[], &[]));
    }
    let mut with_logprobs = processed.clone();
    with_logprobs.logprobs = vec![20; n];
    [greedy, sampled, processed, with_logprobs]
}
