//! [`Runner`]: one object-safe handle on "a model on a device with its KV cache", so the engine
//! can pick the device at run time (`--device auto|cpu|cuda`), and the memory plan that sizes the
//! KV pool: weights first, then blocks from what is left.

use std::borrow::Cow;
use std::str::FromStr;

use super::decoder::{Decoder, Logits, WeightsLoad};
use super::tensor_parallel::TpRunner;
use crate::config::ModelConfig;
use crate::device::cpu::CpuDevice;
use crate::device::cuda::{self, CudaDevice, CudaOptions};
use crate::device::{
    kv_int8, DeviceSample, ForwardBatch, GraphReport, GraphShapes, Instruments, KvCacheDtype,
    KvLayout, StepPlan, WeightQuantization,
};
use crate::error::{DeviceError, EngineError};
use crate::loader::{HostWeights, WeightReader};

/// A model ready to run batches against its paged KV cache.
pub trait Runner: Send {
    fn device_name(&self) -> &'static str;
    fn config(&self) -> &ModelConfig;
    fn kv_layout(&self) -> KvLayout;
    /// Longest sequence the runner accepts (RoPE table size).
    fn max_model_len(&self) -> usize;
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, EngineError>;
    /// One engine step: the forward pass, the processors' edits applied to the logits on the
    /// device, then the chosen token of every logits row (with the log-probabilities asked
    /// for) when the device samples, else the edited logits for the host sampler. `plan` has
    /// one entry per logits row.
    fn forward_step(
        &mut self,
        batch: &ForwardBatch,
        plan: &StepPlan,
    ) -> Result<StepOutput, EngineError> {
        self.forward_begin(batch)?;
        self.forward_finish(plan)
    }
    /// The first half of [`Runner::forward_step`]: the forward pass queued on the device (its
    /// logits kept for the second half), so the host can compute grammar masks meanwhile.
    fn forward_begin(&mut self, batch: &ForwardBatch) -> Result<(), EngineError>;
    /// The second half: edits, masks, token selection on the logits of the last
    /// [`Runner::forward_begin`].
    fn forward_finish(&mut self, plan: &StepPlan) -> Result<StepOutput, EngineError>;
    /// Waits for queued device work (for timing).
    fn synchronize(&self) -> Result<(), EngineError>;
    /// The device's measured ceilings, if it can measure them.
    fn calibrate(&self) -> Result<Option<crate::device::Calibration>, EngineError>;
    /// Seconds of `repeat` passes over the GEMMs `shapes` on their own (see
    /// [`crate::device::Device::time_gemms`]).
    fn time_gemms(
        &self,
        shapes: &[(usize, usize, usize)],
        repeat: usize,
    ) -> Result<Option<f64>, EngineError>;
    /// Seconds of `count` all-reduces of `elems` values over the runner's tensor-parallel
    /// ranks (see [`crate::device::Device::time_all_reduce`]); `None` for a model on one device.
    fn time_all_reduce(
        &mut self,
        _elems: usize,
        _count: usize,
    ) -> Result<Option<f64>, EngineError> {
        Ok(None)
    }
    /// Whether steps come back as tokens chosen on the device (see [`StepOutput`]).
    fn samples_on_device(&self) -> bool;
    /// Turns replaying decode graphs on or off (for eager-vs-graph comparisons); whether the
    /// runner has any.
    fn set_cuda_graphs(&mut self, on: bool) -> bool;
    /// What capturing the decode graphs took, if the runner has them.
    fn cuda_graphs(&self) -> Option<GraphReport>;
    /// What loading the weights from their files took (none for weights made or given).
    fn weights_load(&self) -> Option<WeightsLoad> {
        None
    }
    /// Per-operation device timing (see [`Device::set_profiling`]).
    fn set_profiling(&self, on: bool);
    fn take_profile(&self) -> Result<Vec<(String, f64, usize)>, EngineError>;
}

/// What a step produced.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    /// Logits for the host sampler.
    Logits(Logits),
    /// Tokens already chosen on the device, one per logits row, with the log-probabilities of
    /// the rows that asked.
    Tokens(DeviceSample),
}

/// Which device to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// CUDA when a GPU is usable, else the CPU (refused where a GPU is present but CUDA cannot
    /// use it: give --device cpu for the CPU there).
    Auto,
    Cpu,
    Cuda,
}

impl FromStr for DeviceKind {
    type Err = crate::error::BadValue;
    fn from_str(s: &str) -> Result<Self, crate::error::BadValue> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda),
            o => Err(crate::error::BadValue::unknown(
                "device",
                o,
                "auto, cpu, cuda",
            )),
        }
    }
}

/// How big the KV pool is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    Blocks(usize),
    Bytes(usize),
    /// Weights + KV may take this share of the device's memory (vLLM's
    /// `gpu_memory_utilization`); on the CPU it means that share of 4 GiB.
    MemoryFraction(f64),
}

/// Where the weights come from.
pub enum WeightSource<'a> {
    /// Loaded weights the caller keeps (copied to the device).
    Host(&'a HostWeights),
    /// Loaded weights given up: each tensor's host memory goes (or, on the CPU, stays as the
    /// device's) as it is uploaded, so loading never holds two copies.
    Owned(HostWeights),
    /// The weights of the model `spec` names ([`crate::loader::resolve`]), read when the runner
    /// is built and uploaded as they are read (the host holds one layer at a time); over
    /// tensor-parallel ranks each reads its slices alone ([`WeightSource::FilesShard`]).
    Files(&'a str),
    /// Rank `rank` of `ranks`' slices of the model `spec` names, read and uploaded as
    /// [`WeightSource::Files`] (rank 0 shows the progress).
    FilesShard {
        spec: &'a str,
        rank: usize,
        ranks: usize,
    },
    /// Random weights made on the device.
    Dummy { seed: u64 },
    /// A tensor-parallel rank's part of the random weights `Dummy { seed }` makes of the whole
    /// model (made on the rank's device).
    DummyShard {
        seed: u64,
        shard: crate::shard::Shard<'a>,
    },
}

#[derive(Debug, Clone)]
pub struct RunnerOptions {
    pub device: DeviceKind,
    pub block_size: usize,
    pub max_model_len: usize,
    /// Lower `max_model_len` to the tokens the KV cache holds where it holds fewer (said at
    /// start): for a length that defaulted to the model's own context rather than being asked.
    pub fit_max_model_len: bool,
    pub kv: KvBudget,
    /// Decode batch sizes to capture CUDA graphs for (a step of `n` sequences replays the
    /// smallest size ≥ n; larger steps run eagerly); empty: always eager (vLLM's
    /// `--enforce-eager`). Devices without graphs ignore it.
    pub cuda_graph_sizes: Vec<usize>,
    /// Speculative verification steps to capture graphs for too (with `cuda_graph_sizes`).
    pub cuda_graph_verify: Option<VerifyGraphs>,
    /// How the KV cache stores keys and values (`--kv-cache-dtype`).
    pub kv_cache_dtype: KvCacheDtype,
    /// How the projections' weights are stored (`--quantization`).
    pub quantization: WeightQuantization,
    /// Ranks the model is split over (`--tensor-parallel-size`; 1: no split).
    pub tensor_parallel_size: usize,
    /// Tokens the INT8 KV cache's scales are calibrated on at load (one prefill of up to
    /// [`kv_int8::CALIBRATION_MAX_TOKENS`]): [`kv_int8::CALIBRATION_TEXT`] in the model's
    /// tokenizer. Only read for [`KvCacheDtype::Int8`], which refuses to start without them.
    pub kv_calibration: Vec<u32>,
}

/// The verification steps of n-gram speculation, for their CUDA graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyGraphs {
    /// Most tokens a sequence verifies in a step: 1 + num_speculative_tokens.
    pub tokens_per_seq: usize,
    /// Most sequences in a verification step (speculation's disable_by_batch_size).
    pub max_seqs: usize,
}

impl VerifyGraphs {
    /// The verification steps speculation with `cfg` runs.
    pub fn for_spec(cfg: &crate::spec::SpecConfig) -> Self {
        VerifyGraphs {
            tokens_per_seq: 1 + cfg.num_speculative_tokens,
            max_seqs: cfg.disable_by_batch_size,
        }
    }
}

/// vLLM's capture sizes, up to 256.
pub const DEFAULT_CUDA_GRAPH_SIZES: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// Activations, cuBLAS workspace and the allocator's slack are kept out of the KV pool.
const DEVICE_RESERVE: usize = 2 << 30;

pub struct ModelRunner<D: Instruments> {
    dev: D,
    model: Decoder<D>,
    kv: D::Kv,
    layout: KvLayout,
    graphs: Option<GraphReport>,
    /// What loading the weights from files took.
    weights_load: Option<WeightsLoad>,
    /// The logits of a forward pass begun and not yet finished.
    pending: Option<(D::Tensor, usize)>,
}

impl<D: Instruments> ModelRunner<D> {
    /// The model's weights on `dev` from `weights`, and what reading them from files took.
    fn load(
        dev: &D,
        config: &ModelConfig,
        weights: WeightSource<'_>,
        opts: &RunnerOptions,
    ) -> Result<(Decoder<D>, Option<WeightsLoad>), EngineError> {
        let mut weights_load = None;
        let model = match weights {
            WeightSource::Host(w) => Decoder::new(
                dev,
                config,
                w.as_refs().map(Cow::Borrowed),
                opts.max_model_len,
                opts.quantization,
            )?,
            WeightSource::Owned(w) => Decoder::new(
                dev,
                config,
                w.map(Cow::Owned),
                opts.max_model_len,
                opts.quantization,
            )?,
            WeightSource::Files(spec) => {
                let (m, load) = Decoder::from_reader(
                    dev,
                    config,
                    &WeightReader::open(spec, None)?,
                    opts.max_model_len,
                    opts.quantization,
                    true,
                )?;
                weights_load = Some(load);
                m
            }
            WeightSource::FilesShard { spec, rank, ranks } => {
                let (m, load) = Decoder::from_reader(
                    dev,
                    config,
                    &WeightReader::open(spec, Some((rank, ranks)))?,
                    opts.max_model_len,
                    opts.quantization,
                    rank == 0,
                )?;
                weights_load = Some(load);
                m
            }
            WeightSource::Dummy { seed } => Decoder::random(
                dev,
                config,
                seed,
                opts.max_model_len,
                opts.quantization,
                None,
            )?,
            WeightSource::DummyShard { seed, shard } => Decoder::random(
                dev,
                config,
                seed,
                opts.max_model_len,
                opts.quantization,
                Some(&shard),
            )?,
        };
        Ok((model, weights_load))
    }

    pub fn new(
        dev: D,
        config: &ModelConfig,
        weights: WeightSource<'_>,
        opts: &RunnerOptions,
    ) -> Result<Self, EngineError> {
        dev.supports(config).map_err(|why| {
            EngineError::InvalidRequest(format!(
                "this {} model cannot run on the {} device: {why}",
                config.arch,
                dev.name()
            ))
        })?;
        let (mut model, weights_load) = Self::load(&dev, config, weights, opts)?;
        if opts.quantization == WeightQuantization::Fp8 {
            tracing::info!(
                device = dev.name(),
                "projection weights quantized to FP8 at load (e4m3, one scale per output row)"
            );
        }
        let mut layout = KvLayout {
            num_layers: config.num_hidden_layers,
            num_blocks: 0,
            block_size: opts.block_size,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
            dtype: opts.kv_cache_dtype,
        };
        let elem = if dev.name() == "cpu" { 4 } else { 2 };
        let block_bytes = layout.block_bytes(elem);
        layout.num_blocks = match opts.kv {
            KvBudget::Blocks(n) => n,
            KvBudget::Bytes(b) => b / block_bytes,
            KvBudget::MemoryFraction(f) => match dev.memory_info() {
                Some((free, total)) => {
                    dev.synchronize()?;
                    let used = total - free;
                    let budget = (f * total as f64) as usize;
                    budget.saturating_sub(used + DEVICE_RESERVE) / block_bytes
                }
                None => (f * (4u64 << 30) as f64) as usize / block_bytes,
            },
        };
        if layout.num_blocks == 0 {
            return Err(DeviceError::OutOfMemory {
                device: dev.name(),
                bytes: block_bytes,
                what: "not even one KV block fits after the weights".into(),
            }
            .into());
        }
        let holds = layout.num_blocks * layout.block_size;
        if opts.fit_max_model_len && model.max_positions() > holds {
            tracing::warn!(
                model_context = model.max_positions(),
                kv_cache_tokens = holds,
                "max_model_len lowered from the model's context to what the KV cache holds \
                 (raise --gpu-memory-utilization, or set --max-model-len)"
            );
            model.limit_positions(holds);
        }
        // Calibrated before the pool is allocated: the pass runs on a small cache of its own.
        let int8_table = match layout.dtype {
            KvCacheDtype::Int8 => {
                Some(calibrate_int8(&dev, &model, &layout, &opts.kv_calibration)?)
            }
            _ => None,
        };
        let mut kv = dev.alloc_kv(&layout, int8_table.as_ref())?;
        tracing::info!(
            device = dev.name(),
            blocks = layout.num_blocks,
            block_size = layout.block_size,
            dtype = %layout.dtype,
            kv_gib = (layout.num_blocks * block_bytes) as f64 / (1u64 << 30) as f64,
            "KV cache allocated"
        );
        // Graph memory comes out of DEVICE_RESERVE, next to the eager activations.
        let shapes = GraphShapes {
            sizes: opts.cuda_graph_sizes.clone(),
            verify_tokens: opts.cuda_graph_verify.map_or(0, |v| v.tokens_per_seq),
            verify_max_seqs: opts.cuda_graph_verify.map_or(0, |v| v.max_seqs),
        };
        let graphs = match model.capture_decode_graphs(&dev, &mut kv, &shapes) {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "capturing decode CUDA graphs failed: running eagerly");
                None
            }
        };
        if let Some(g) = graphs {
            tracing::info!(
                graphs = g.graphs,
                mib = g.bytes as f64 / (1u64 << 20) as f64,
                ms = g.capture_ms,
                programmatic_edges = g.programmatic_edges,
                sizes = ?opts.cuda_graph_sizes,
                verify = ?opts.cuda_graph_verify,
                "decode CUDA graphs captured"
            );
        }
        Ok(ModelRunner {
            dev,
            model,
            kv,
            layout,
            graphs,
            weights_load,
            pending: None,
        })
    }
}

/// The INT8 cache's table for `model`: one prefill of the calibration tokens into an
/// unquantized cache of its own, then each layer's per-channel bounds — V's largest magnitudes,
/// K's largest norms of each rotated pair ([`kv_int8::fold_pair_amax`]: a bound at positions past
/// the text's too) — into [`kv_int8::KvInt8Table::from_amax`].
fn calibrate_int8<D: Instruments>(
    dev: &D,
    model: &Decoder<D>,
    layout: &KvLayout,
    tokens: &[u32],
) -> Result<kv_int8::KvInt8Table, EngineError> {
    let n = tokens
        .len()
        .min(kv_int8::CALIBRATION_MAX_TOKENS)
        .min(model.max_positions());
    if n < 16 {
        return Err(EngineError::InvalidRequest(format!(
            "the int8 KV cache calibrates its scales on a text at load and was given {} tokens \
             (needs at least 16): pass the tokenized calibration text (kv_int8::CALIBRATION_TEXT)",
            tokens.len()
        )));
    }
    let started = std::time::Instant::now();
    let blocks = n.div_ceil(layout.block_size);
    let tmp_layout = KvLayout {
        num_blocks: blocks,
        dtype: KvCacheDtype::Auto,
        ..*layout
    };
    let mut kv = dev.alloc_kv(&tmp_layout, None)?;
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut batch = ForwardBatch::default();
    batch.push_seq(&tokens[..n], 0, &table, layout.block_size, true);
    batch.validate(&tmp_layout, model.config.vocab_size)?;
    model.forward(dev, &mut kv, &batch)?;
    let width = layout.num_kv_heads * layout.head_dim;
    let mut amax = Vec::with_capacity(layout.num_layers);
    for layer in 0..layout.num_layers {
        let (k, v) = dev.kv_rows(&kv, layer, 0..n)?;
        let (mut ka, mut va) = (vec![0f32; width], vec![0f32; width]);
        kv_int8::fold_pair_amax(&mut ka, &k, layout.head_dim);
        kv_int8::fold_amax(&mut va, &v);
        amax.push([ka, va]);
    }
    let t = kv_int8::KvInt8Table::from_amax(&amax, layout.num_kv_heads, layout.head_dim)
        .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
    tracing::info!(
        device = dev.name(),
        tokens = n,
        ms = started.elapsed().as_secs_f64() * 1e3,
        "int8 KV cache calibrated (static per-channel scales, {} bf16 outlier channels per head)",
        kv_int8::OUTLIERS
    );
    Ok(t)
}

impl<D: Instruments> ModelRunner<D> {
    pub(crate) fn check(&self, batch: &ForwardBatch) -> Result<(), EngineError> {
        batch.validate(&self.layout, self.model.config.vocab_size)?;
        if let Some(&p) = batch.positions.iter().max() {
            if p as usize >= self.model.max_positions() {
                return Err(EngineError::InvalidBatch(format!(
                    "position {p} is beyond max_model_len {}",
                    self.model.max_positions()
                )));
            }
        }
        Ok(())
    }
}

impl<D: Instruments> Runner for ModelRunner<D> {
    fn device_name(&self) -> &'static str {
        self.dev.name()
    }
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }
    fn kv_layout(&self) -> KvLayout {
        self.layout
    }
    fn max_model_len(&self) -> usize {
        self.model.max_positions()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, EngineError> {
        self.check(batch)?;
        self.model.forward(&self.dev, &mut self.kv, batch)
    }
    fn forward_begin(&mut self, batch: &ForwardBatch) -> Result<(), EngineError> {
        self.pending = None;
        self.check(batch)?;
        let logits = self.model.forward_logits(&self.dev, &mut self.kv, batch)?;
        self.pending = Some((logits, batch.logit_rows.len()));
        Ok(())
    }
    fn forward_finish(&mut self, plan: &StepPlan) -> Result<StepOutput, EngineError> {
        let Some((mut logits, n)) = self.pending.take() else {
            return Err(EngineError::InvalidBatch(
                "forward_finish without a forward pass begun".into(),
            ));
        };
        if plan.rows.len() != n || plan.logprobs.len() != n {
            return Err(EngineError::InvalidBatch(format!(
                "{} sampling rows and {} logprobs rows for {n} logits rows",
                plan.rows.len(),
                plan.logprobs.len(),
            )));
        }
        let vocab = self.model.config.vocab_size;
        plan.edits.validate(n, vocab)?;
        plan.masks.validate(n, vocab)?;
        self.dev.edit_logits(&mut logits, &plan.edits)?;
        self.dev.mask_logits(&mut logits, &plan.masks)?;
        if let Some(s) = self.dev.sample(&logits, &plan.rows, &plan.logprobs)? {
            return Ok(StepOutput::Tokens(s));
        }
        Ok(StepOutput::Logits(Logits {
            rows: n,
            vocab,
            data: self.dev.to_host(&logits)?,
        }))
    }
    fn synchronize(&self) -> Result<(), EngineError> {
        Ok(self.dev.synchronize()?)
    }
    fn calibrate(&self) -> Result<Option<crate::device::Calibration>, EngineError> {
        Ok(self.dev.calibrate()?)
    }
    fn time_gemms(
        &self,
        shapes: &[(usize, usize, usize)],
        repeat: usize,
    ) -> Result<Option<f64>, EngineError> {
        Ok(self.dev.time_gemms(shapes, repeat)?)
    }
    fn set_profiling(&self, on: bool) {
        self.dev.set_profiling(on)
    }
    fn time_all_reduce(&mut self, elems: usize, count: usize) -> Result<Option<f64>, EngineError> {
        Ok(self.dev.time_all_reduce(elems, count)?)
    }
    fn samples_on_device(&self) -> bool {
        self.dev.samples_on_device()
    }
    fn set_cuda_graphs(&mut self, on: bool) -> bool {
        self.dev.set_graphs_enabled(&mut self.kv, on)
    }
    fn weights_load(&self) -> Option<WeightsLoad> {
        self.weights_load
    }
    fn cuda_graphs(&self) -> Option<GraphReport> {
        self.graphs
    }
    fn take_profile(&self) -> Result<Vec<(String, f64, usize)>, EngineError> {
        Ok(self.dev.take_profile()?)
    }
}

/// A GPU's device node or driver entry on this machine, if there is one.
fn gpu_node() -> Option<std::path::PathBuf> {
    ["/dev/nvidia0", "/proc/driver/nvidia/gpus"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
}

/// Whether `--device auto` takes CUDA: yes where it is usable; the CPU where no GPU is here (or
/// `CUDA_VISIBLE_DEVICES` hides them all); refused where a GPU is present (`node`) but CUDA is
/// not usable — a broken driver or missing libraries must not become a slow CPU server that
/// reports ready.
fn auto_uses_cuda(
    usable: Result<(), DeviceError>,
    node: Option<std::path::PathBuf>,
    visible: Option<&str>,
) -> Result<bool, EngineError> {
    let hidden = visible.is_some_and(|v| v.trim().is_empty() || v.trim() == "-1");
    match (usable, node) {
        (Ok(()), _) => Ok(true),
        (Err(e), Some(node)) if !hidden => Err(EngineError::InvalidRequest(format!(
            "a GPU is present ({}) but CUDA cannot be used: {e}; fix the driver or libraries, \
             or give --device cpu to run on the CPU",
            node.display()
        ))),
        (Err(e), _) => {
            tracing::info!("using the CPU device: {e}");
            Ok(false)
        }
    }
}

/// Builds a runner on the requested device.
pub fn build_runner(
    config: &ModelConfig,
    weights: WeightSource<'_>,
    opts: &RunnerOptions,
) -> Result<Box<dyn Runner>, EngineError> {
    let use_cuda = match opts.device {
        DeviceKind::Cpu => false,
        DeviceKind::Cuda => {
            cuda::available()?;
            true
        }
        DeviceKind::Auto => auto_uses_cuda(
            cuda::available(),
            gpu_node(),
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        )?,
    };
    if opts.tensor_parallel_size != 1 {
        crate::shard::check(config, opts.tensor_parallel_size)
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        return Ok(if use_cuda {
            let cuda = CudaOptions::from_env(Some(crate::loader::fetch::kernel_cache_dir()))?;
            Box::new(TpRunner::cuda(config, weights, opts, &cuda)?)
        } else {
            Box::new(TpRunner::new(config, weights, opts)?)
        });
    }
    if use_cuda {
        // The switches are read here, once; the kernel cache lives with the model cache.
        let cuda = CudaOptions::from_env(Some(crate::loader::fetch::kernel_cache_dir()))?;
        let dev = CudaDevice::new(0, opts.block_size, cuda)?;
        Ok(Box::new(ModelRunner::new(dev, config, weights, opts)?))
    } else {
        Ok(Box::new(ModelRunner::new(
            CpuDevice::new(),
            config,
            weights,
            opts,
        )?))
    }
}

/// A CPU runner with `num_blocks` KV blocks.
pub fn cpu_runner(
    config: &ModelConfig,
    weights: &HostWeights,
    num_blocks: usize,
    block_size: usize,
    max_model_len: usize,
) -> Result<Box<dyn Runner>, EngineError> {
    let opts = RunnerOptions {
        device: DeviceKind::Cpu,
        block_size,
        max_model_len,
        fit_max_model_len: false,
        kv: KvBudget::Blocks(num_blocks),
        cuda_graph_sizes: Vec::new(),
        cuda_graph_verify: None,
        kv_cache_dtype: KvCacheDtype::Auto,
        quantization: WeightQuantization::None,
        tensor_parallel_size: 1,
        kv_calibration: Vec::new(),
    };
    Ok(Box::new(ModelRunner::new(
        CpuDevice::new(),
        config,
        WeightSource::Host(weights),
        &opts,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_refuses_a_present_gpu_that_cuda_cannot_use() {
        let broken = || {
            Err(DeviceError::Unavailable(
                "cuda".into(),
                "libcuda was not found".into(),
            ))
        };
        let node = || Some(std::path::PathBuf::from("/dev/nvidia0"));
        assert!(auto_uses_cuda(Ok(()), node(), None).unwrap());
        // No GPU here: the CPU.
        assert!(!auto_uses_cuda(broken(), None, None).unwrap());
        // A GPU here that CUDA cannot open: refused, naming both ways out.
        let e = auto_uses_cuda(broken(), node(), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/nvidia0")
                && e.contains("libcuda was not found")
                && e.contains("--device cpu"),
            "{e}"
        );
        // Every GPU hidden on purpose: the CPU.
        assert!(!auto_uses_cuda(broken(), node(), Some("")).unwrap());
        assert!(!auto_uses_cuda(broken(), node(), Some("-1")).unwrap());
        assert!(auto_uses_cuda(broken(), node(), Some("0")).is_err());
    }
}
