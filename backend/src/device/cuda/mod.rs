//! The CUDA device: bf16 weights and activations, an f32 residual stream, f32 logits; cuBLAS for
//! the matmuls of three rows or more, `gemv.cu` for fewer; Cachet's own kernels (compiled by
//! NVRTC at start-up for the GPU's architecture, cached on disk) for everything else.
//!
//! One file per concern:
//! - [`options`]: every switch, parsed once ([`CudaOptions`]);
//! - `kernels.rs`: the kernel table and the constants shared with the `.cu` sources;
//! - `tensor.rs`: tensors, the paged KV cache, allocation; `batch.rs`: a step's metadata;
//! - `launch.rs`: one typed launch function per kernel — the only unsafe launches;
//! - `gemm.rs` (cuBLAS), `gemv.rs` (few-row projections with fused norms), `gemm_fp8.rs`
//!   (cuBLASLt's FP8 products);
//! - [`attention_plan`] (which kernel, how many splits: pure, unit-tested) and `attention.rs`;
//! - `graphs.rs` (CUDA graphs of decode and verification steps), `profile.rs`, `calibrate.rs`.
//!
//! cudarc loads libcuda / libnvrtc / libcublas at run time and panics if one is missing, so
//! [`available`] probes for them first and [`CudaDevice::new`] fails with a clear error instead.
//! Every CUDA call's status is checked and becomes a typed [`DeviceError`].

mod attention;
pub mod attention_plan;
mod batch;
mod calibrate;
mod gemm;
mod gemm_fp8;
mod gemv;
mod graphs;
mod instruments;
mod kernels;
mod launch;
mod moe;
mod moe_cublas;
pub mod nccl;
pub mod options;
mod profile;
mod programmatic;
mod tensor;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

pub use batch::CudaBatch;
pub use options::{CudaOptions, SplitOptions, MOE_GEMM_DEFAULT_ROWS, MOE_GEMM_FP8_DEFAULT_ROWS};
pub use tensor::{CudaBuf, CudaKv, CudaTensor};

use super::{
    AttnLayer, Delta, Device, ForwardBatch, KvCacheDtype, KvLayout, MoeParams, MoeWeights, Part,
};
use crate::config::Activation;
use crate::error::DeviceError;
use crate::tensor::HostTensor;

const DEV: &str = "cuda";

fn op_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> DeviceError {
    move |e| DeviceError::Driver {
        device: DEV,
        op,
        source: Box::new(e),
    }
}

/// Whether a CUDA device can be opened here (libraries present and a GPU visible).
pub fn available() -> Result<(), DeviceError> {
    let missing = |lib: &str| {
        DeviceError::Unavailable(
            "cuda".into(),
            format!("{lib} was not found (is the NVIDIA driver / CUDA 13 on LD_LIBRARY_PATH?)"),
        )
    };
    // SAFETY: each probe only tries to dlopen a library by its usual names.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            return Err(missing("libcuda"));
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            return Err(missing("libnvrtc"));
        }
        if !cudarc::cublas::sys::is_culib_present() {
            return Err(missing("libcublas"));
        }
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(DeviceError::Unavailable(
            "cuda".into(),
            "no CUDA GPU is visible".into(),
        )),
        Err(e) => Err(DeviceError::Unavailable(
            "cuda".into(),
            format!("cuInit failed: {e:?}"),
        )),
    }
}

/// GPUs visible here (`CUDA_VISIBLE_DEVICES` picks them); an error where CUDA is unusable.
pub fn gpu_count() -> Result<usize, DeviceError> {
    available()?;
    CudaContext::device_count()
        .map(|n| n as usize)
        .map_err(op_err("device count"))
}

/// The architectures (`sm_XY`) of the GPUs visible here, one per GPU.
pub fn gpu_archs() -> Result<Vec<String>, DeviceError> {
    (0..gpu_count()?)
        .map(|i| {
            let ctx = CudaContext::new(i).map_err(op_err("open device"))?;
            let (major, minor) = ctx
                .compute_capability()
                .map_err(op_err("compute capability"))?;
            Ok(format!("sm_{major}{minor}"))
        })
        .collect()
}

/// Compiles the kernels for `arch` into the kernel cache `cache` a start reads
/// (`loader::fetch::kernel_cache_dir`; `CACHET_KERNEL_DIR`'s sources where set, as a start
/// would), unless they are there; whether they were. Needs NVRTC, not a GPU.
pub fn build_kernels(arch: &str, cache: &std::path::Path) -> Result<bool, DeviceError> {
    let options = CudaOptions::from_env(Some(cache.to_path_buf()))?;
    let compiled = cachet_kernels::compile::compile(
        arch,
        options.kernel_cache.as_deref(),
        options.kernel_dir.as_deref(),
    )
    .map_err(|e| DeviceError::Driver {
        device: DEV,
        op: "compile kernels",
        source: Box::new(e),
    })?;
    Ok(compiled.from_cache)
}

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: gemm::Blas,
    /// cuBLASLt's FP8 GEMM, made when the first weight is quantized (`None` inside: no
    /// libcublasLt).
    fp8_gemm: std::cell::OnceCell<Option<gemm_fp8::Fp8Gemm>>,
    k: kernels::Kernels,
    pub name: String,
    pub arch: String,
    block_size: usize,
    /// Streaming multiprocessors (sizes the attention split).
    sms: usize,
    options: CudaOptions,
    /// Decode graphs join our kernels by programmatic edges (Hopper and later, with the
    /// driver's capture calls; off for good if the driver refuses one): programmatic.rs.
    pdl: std::cell::Cell<bool>,
    /// The module of our kernels (programmatic edges join two of them only).
    ours: cudarc::driver::sys::CUmodule,
    /// A decode graph is being captured (launches then make their edges programmatic).
    capturing: std::cell::Cell<bool>,
    /// Programmatic edges made so far.
    pdl_edges: std::cell::Cell<usize>,
    /// This device's rank of a tensor-parallel group (none: the model is whole here).
    tp: Option<nccl::NcclRank>,
    profiler: profile::Profiler,
}

// SAFETY: the context, stream, cuBLAS handle and functions are only used from the thread that
// owns the device (the engine thread); cudarc's handles are thread-agnostic once bound.
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    /// Opens GPU `ordinal` with `options`, compiles (or loads cached) kernels for its
    /// architecture.
    pub fn new(
        ordinal: usize,
        block_size: usize,
        options: CudaOptions,
    ) -> Result<Self, DeviceError> {
        available()?;
        let ctx = CudaContext::new(ordinal).map_err(op_err("open device"))?;
        // Everything runs on one stream, so cudarc's cross-stream event tracking is not needed
        // (and its events would break graph capture).
        // SAFETY: no buffer of this context is ever used on another stream.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(op_err("create stream"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(op_err("compute capability"))?;
        let arch = format!("sm_{major}{minor}");
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(op_err("SM count"))? as usize;
        let loaded = kernels::Kernels::load(
            &ctx,
            &arch,
            options.kernel_cache.as_deref(),
            options.kernel_dir.as_deref(),
        )?;
        // Programmatic dependent launch needs Hopper and the driver's capture calls.
        let pdl = major >= 9 && programmatic::supported(stream.cu_stream());
        let ours =
            programmatic::module_of(&loaded.kernels.rms_norm).map_err(op_err("kernel module"))?;
        let blas = gemm::Blas::new(&stream)?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA GPU".into());
        tracing::info!(gpu = %name, %arch, kernels_cached = loaded.from_cache, ?options, ?pdl, "CUDA device ready");
        Ok(CudaDevice {
            ctx,
            stream,
            blas,
            fp8_gemm: Default::default(),
            k: loaded.kernels,
            name,
            arch,
            block_size,
            sms,
            pdl: std::cell::Cell::new(pdl),
            ours,
            capturing: Default::default(),
            pdl_edges: Default::default(),
            options,
            tp: None,
            profiler: Default::default(),
        })
    }
}

impl CudaDevice {
    /// Makes this device rank `rank` of a tensor-parallel group: the decoder's collectives go
    /// through the group's NCCL communicator from here on.
    pub fn join(&mut self, rank: nccl::NcclRank) {
        self.tp = Some(rank);
    }

    /// Makes this device's context the calling thread's current one.
    pub fn bind_to_thread(&self) -> Result<(), DeviceError> {
        self.ctx.bind_to_thread().map_err(op_err("bind context"))
    }
}

impl Device for CudaDevice {
    type Tensor = CudaTensor;
    type Kv = CudaKv;
    type Batch = CudaBatch;

    fn name(&self) -> &'static str {
        DEV
    }

    fn upload(&self, t: &HostTensor) -> Result<CudaTensor, DeviceError> {
        let (rows, cols) = super::matrix_dims(&t.shape, DEV, "upload")?;
        let buf = self
            .stream
            .clone_htod(&tensor::host_bf16(t))
            .map_err(op_err("upload"))?;
        Ok(CudaTensor::new_bf16(rows, cols, buf))
    }

    fn upload_table(&self, t: &HostTensor) -> Result<CudaTensor, DeviceError> {
        let (rows, cols) = super::matrix_dims(&t.shape, DEV, "upload")?;
        let buf = self.stream.clone_htod(&t.data).map_err(op_err("upload"))?;
        Ok(CudaTensor::new_f32(rows, cols, buf))
    }

    fn random(
        &self,
        shape: &[usize],
        seed: u64,
        mean: f32,
        std: f32,
    ) -> Result<CudaTensor, DeviceError> {
        let (rows, cols) = super::matrix_dims(shape, DEV, "random")?;
        let whole = 0..if shape.len() == 2 { rows } else { rows * cols };
        let cols = if shape.len() == 2 { 0..cols } else { 0..1 };
        let part = Part {
            rows: std::slice::from_ref(&whole),
            cols,
        };
        self.random_part(shape, &part, seed, mean, std)
    }

    fn random_part(
        &self,
        shape: &[usize],
        part: &Part<'_>,
        seed: u64,
        mean: f32,
        std: f32,
    ) -> Result<CudaTensor, DeviceError> {
        let full_cols = if shape.len() == 2 { shape[1] } else { 1 };
        let (rows, cols) = super::matrix_dims(&part.shape(shape), DEV, "random")?;
        let mut buf = self.alloc_bf16(rows * cols, "dummy weight")?;
        let width = part.cols.len();
        let mut at = 0;
        for r in part.rows.iter().filter(|r| !r.is_empty()) {
            let n = r.len() * width;
            let offset = r.start * full_cols + part.cols.start;
            let mut out = buf.slice_mut(at..at + n);
            self.launch_fill_normal(&mut out, n, seed, (mean, std), (width, full_cols, offset))?;
            at += n;
        }
        Ok(CudaTensor::new_bf16(rows, cols, buf))
    }

    fn supports(
        &self,
        config: &crate::config::ModelConfig,
    ) -> Result<(), crate::device::Unsupported> {
        if config.head_dim > kernels::ATT_MAXD_WIDE {
            return Err(crate::device::Unsupported::HeadDim {
                got: config.head_dim,
                max: kernels::ATT_MAXD_WIDE,
            });
        }
        Ok(())
    }

    fn alloc_kv(
        &self,
        layout: &KvLayout,
        int8: Option<&crate::device::kv_int8::KvInt8Table>,
    ) -> Result<CudaKv, DeviceError> {
        self.alloc_kv_cache(layout, int8)
    }

    fn kv_rows(
        &self,
        kv: &CudaKv,
        layer: usize,
        slots: std::ops::Range<usize>,
    ) -> Result<(Vec<f32>, Vec<f32>), DeviceError> {
        let l = kv.layout;
        if l.dtype != KvCacheDtype::Auto || layer >= l.num_layers || slots.end > l.num_slots() {
            return Err(DeviceError::Op {
                device: DEV,
                op: "kv_rows",
                msg: "reads an unquantized cache's layers and slots only".into(),
            });
        }
        // bf16: two bytes per value.
        let bytes = 2 * l.num_kv_heads * l.head_dim;
        let read = |buf: &CudaSlice<u8>| -> Result<Vec<f32>, DeviceError> {
            let raw = self
                .stream
                .clone_dtoh(&buf.slice(slots.start * bytes..slots.end * bytes))
                .map_err(op_err("download"))?;
            Ok(raw
                .chunks_exact(2)
                .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect())
        };
        Ok((read(&kv.k[layer])?, read(&kv.v[layer])?))
    }

    fn prepare_batch(&self, batch: &ForwardBatch) -> Result<CudaBatch, DeviceError> {
        self.upload_batch(batch)
    }

    fn embed(
        &self,
        table: &CudaTensor,
        b: &CudaBatch,
        scale: f32,
    ) -> Result<CudaTensor, DeviceError> {
        // A tensor-parallel rank holding its part of the vocabulary looks up the ids it holds,
        // and the ranks' rows are summed (each id's row is on exactly one rank).
        let part = match &self.tp {
            Some(tp) => crate::shard::vocab_part(&tp.gather_widths, tp.rank, table.rows, DEV)?,
            None => None,
        };
        let mut out = self.timed("embed", || {
            let cols = table.cols;
            let mut out = self.alloc_f32(b.n * cols, "embedding")?;
            if b.n > 0 {
                let (ids, t) = (&b.ids, table.bf16("embed")?);
                let rows = (part.as_ref().map_or(0, |p| p.start), table.rows);
                self.launch_embed(ids, t, &mut out, (b.n, cols), scale, rows)?;
            }
            Ok(CudaTensor::new_f32(b.n, cols, out))
        })?;
        if part.is_some() {
            self.tp_all_reduce(&mut out)?;
        }
        Ok(out)
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, DeviceError> {
        self.timed("rms_norm", || {
            let mut out = self.alloc_bf16(x.rows * x.cols, "rms_norm")?;
            if x.rows > 0 {
                let (xs, ws) = (x.f32("rms_norm")?, w.bf16("rms_norm")?);
                self.launch_rms_norm(xs, ws, &mut out, x.rows, x.cols, eps)?;
            }
            Ok(CudaTensor::new_bf16(x.rows, x.cols, out))
        })
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaTensor,
        delta: Delta<'_, CudaTensor>,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, DeviceError> {
        let op = if delta.norm.is_some() {
            "add_rms_norm + output norm"
        } else {
            "add_rms_norm"
        };
        self.timed(op, || {
            let (rows, cols) = (residual.rows, residual.cols);
            let mut out = self.alloc_bf16(rows * cols, "add_rms_norm")?;
            if rows > 0 {
                let d = gemv::delta_slice(&delta, "add_rms_norm", true)?;
                let wv = w.bf16("add_rms_norm")?;
                let r = residual.f32_mut("add_rms_norm")?;
                self.launch_add_rms_norm(r, d, wv, &mut out, (rows, cols), eps)?;
            }
            Ok(CudaTensor::new_bf16(rows, cols, out))
        })
    }

    fn all_reduce_sum(&self, t: &mut CudaTensor) -> Result<(), DeviceError> {
        self.tp_all_reduce(t)
    }

    fn all_gather_cols(&self, t: CudaTensor) -> Result<CudaTensor, DeviceError> {
        self.tp_all_gather_cols(t)
    }

    fn linear(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor, DeviceError> {
        match self.gemv_variant(x.rows, x.cols, &w.weight("linear")?) {
            Some(v) if x.cols == w.cols => self.timed("gemv", || self.gemv(x, w, v)),
            _ => self.timed(if x.rows == 1 { "gemm (1 row)" } else { "gemm" }, || {
                self.gemm(x, w, false)
            }),
        }
    }

    fn linear_delta(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor, DeviceError> {
        self.linear_unscaled(x, w)
    }

    fn quantize_fp8(&self, w: CudaTensor) -> Result<CudaTensor, DeviceError> {
        if self.fp8_gemm.get().is_none() {
            let _ = self.fp8_gemm.set(gemm_fp8::Fp8Gemm::new(&self.stream)?);
        }
        let (n, k) = (w.rows, w.cols);
        let mut codes = self.alloc_out::<u8>(n * k, "FP8 weights")?;
        let mut scales = self.alloc_f32(n, "FP8 weight scales")?;
        self.launch_quantize_rows_e4m3(
            true,
            w.bf16("quantize_fp8")?,
            &mut codes,
            &mut scales,
            (n, k),
        )?;
        Ok(CudaTensor {
            rows: n,
            cols: k,
            buf: CudaBuf::E4m3 {
                codes,
                scales: Arc::new(scales),
            },
        })
    }

    fn norm_linear(
        &self,
        residual: &mut CudaTensor,
        delta: Option<Delta<'_, CudaTensor>>,
        norm: &CudaTensor,
        eps: f32,
        w: &CudaTensor,
    ) -> Result<CudaTensor, DeviceError> {
        self.norm_projection(residual, delta, norm, eps, w, None)
    }

    fn norm_glu(
        &self,
        residual: &mut CudaTensor,
        delta: Option<Delta<'_, CudaTensor>>,
        norm: &CudaTensor,
        eps: f32,
        gate_up: &CudaTensor,
        act: Activation,
    ) -> Result<CudaTensor, DeviceError> {
        self.norm_projection(residual, delta, norm, eps, gate_up, Some(act))
    }

    fn lm_head(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor, DeviceError> {
        self.timed("gemm lm_head", || self.gemm(x, w, true))
    }

    fn attention(
        &self,
        qkv: &mut CudaTensor,
        kv: &mut CudaKv,
        b: &CudaBatch,
        l: AttnLayer<'_, CudaTensor>,
    ) -> Result<CudaTensor, DeviceError> {
        self.paged_attention(qkv, kv, b, l)
    }

    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaTensor) -> Result<(), DeviceError> {
        self.timed("add_bias", || {
            let (rows, cols) = (x.rows, x.cols);
            if bias.rows * bias.cols != cols {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "add_bias",
                    msg: format!("bias of {} for {cols} columns", bias.rows * bias.cols),
                });
            }
            if rows > 0 {
                let b = bias.bf16("add_bias")?;
                self.launch_add_bias(x.bf16_mut("add_bias")?, b, rows, cols)?;
            }
            Ok(())
        })
    }

    fn glu(&self, gu: &CudaTensor, act: Activation) -> Result<CudaTensor, DeviceError> {
        let op = match act {
            Activation::Silu => "silu_mul",
            Activation::GeluTanh => "gelu_tanh_mul",
        };
        self.timed(op, || {
            let i = gu.cols / 2;
            let mut out = self.alloc_bf16(gu.rows * i, op)?;
            if gu.rows * i > 0 {
                self.launch_glu(act, gu.bf16(op)?, &mut out, gu.rows, i)?;
            }
            Ok(CudaTensor::new_bf16(gu.rows, i, out))
        })
    }

    /// Routing on the device (the router's f32 logits from cuBLAS, then `moe_route_f32`); then,
    /// for a few rows, the chosen experts' rows only (gate|up + SwiGLU per (token, slot) pair
    /// and the weighted down per token, moe.cu's GEMVs), or for many rows two grouped GEMMs
    /// around the activation, then the weighted sum: outside a capture cuBLAS's grouped GEMM
    /// (the routing read back to the host: `moe_cublas.rs`; measured faster than moe.cu's on
    /// prefills), inside one moe.cu's, over the pairs sorted by expert on the device, with no
    /// host round trip, so decode graphs capture it.
    fn moe(
        &self,
        x: &CudaTensor,
        w: MoeWeights<'_, CudaTensor>,
        p: &MoeParams,
    ) -> Result<CudaTensor, DeviceError> {
        let (n, h, e, k) = (x.rows, x.cols, p.num_experts, p.top_k);
        moe::check(h, &w, p)?;
        if n == 0 {
            return Ok(CudaTensor::new_bf16(0, h, self.alloc_bf16(1, "moe")?));
        }
        let mut ids = self.alloc_out::<i32>(n * k, "moe routing")?;
        let mut weights = self.alloc_f32(n * k, "moe routing")?;
        let gemv = match &w.router.buf {
            CudaBuf::Bf16(r) => self
                .gemv_variant(n, h, &w.router.weight("moe")?)
                .map(|v| (r, v)),
            _ => None,
        };
        // f32 logits: bf16 ones turn near ties into other experts than the model's. A few rows
        // (decode) through the GEMV, which reads the router's rows once at the copy rate; more
        // through cuBLAS. (The router and the routing in one launch, and the routing inside the
        // expert GEMVs, each saved a launch and measured no faster: BENCHMARKS-HISTORY.md.)
        let logits = self.timed("moe router", || match gemv {
            Some((r, v)) => {
                let mut out = self.alloc_f32(n * e, "moe router")?;
                self.launch_gemv_f32out(v, r, x.bf16("moe")?, &mut out, (n, h, e))?;
                Ok(CudaTensor {
                    rows: n,
                    cols: e,
                    buf: CudaBuf::F32(out),
                })
            }
            None => self.gemm(x, w.router, true),
        })?;
        self.timed("moe routing", || {
            self.launch_moe_route(
                logits.f32("moe")?,
                &mut ids,
                &mut weights,
                (n, e, k, p.norm_topk_prob),
            )
        })?;
        let y = self.moe_experts(x.bf16("moe")?, w, p, (&mut ids, &mut weights), n)?;
        Ok(CudaTensor::new_bf16(n, h, y))
    }

    fn norm_moe(
        &self,
        residual: &mut CudaTensor,
        delta: Option<Delta<'_, CudaTensor>>,
        norm: &CudaTensor,
        eps: f32,
        w: MoeWeights<'_, CudaTensor>,
        p: &MoeParams,
    ) -> Result<CudaTensor, DeviceError> {
        if let Some(y) = self.norm_moe_fused(residual, delta, norm, eps, w, p)? {
            return Ok(y);
        }
        let x = self.norm(residual, delta, norm, eps)?;
        self.moe(&x, w, p)
    }

    fn gather_logit_rows(&self, x: &CudaTensor, b: &CudaBatch) -> Result<CudaTensor, DeviceError> {
        self.timed("gather_rows", || {
            let m = b.num_logit_rows;
            let mut out = self.alloc_bf16(m * x.cols, "gather")?;
            if m > 0 {
                self.launch_gather_rows(&b.logit_rows, x.bf16("gather")?, &mut out, m, x.cols)?;
            }
            Ok(CudaTensor::new_bf16(m, x.cols, out))
        })
    }

    fn to_host(&self, t: &CudaTensor) -> Result<Vec<f32>, DeviceError> {
        let n = t.rows * t.cols;
        if t.is_unscaled() {
            let b = CudaTensor::new_bf16(t.rows, t.cols, self.scaled_copy(t)?);
            return self.to_host(&b);
        }
        match &t.buf {
            CudaBuf::F32(b) => {
                let mut v = self.stream.clone_dtoh(b).map_err(op_err("download"))?;
                v.truncate(n);
                Ok(v)
            }
            CudaBuf::Bf16(b) => {
                let v = self.stream.clone_dtoh(b).map_err(op_err("download"))?;
                Ok(v.into_iter()
                    .take(n)
                    .map(|x| half::bf16::from_bits(x).to_f32())
                    .collect())
            }
            CudaBuf::Fp8Unscaled { .. } => unreachable!("settled above"),
            CudaBuf::E4m3 { codes, scales } => {
                let c = self.stream.clone_dtoh(codes).map_err(op_err("download"))?;
                let s = self
                    .stream
                    .clone_dtoh(&**scales)
                    .map_err(op_err("download"))?;
                Ok(c.into_iter()
                    .take(n)
                    .enumerate()
                    .map(|(i, c)| crate::device::fp8::decode_e4m3(c) * s[i / t.cols.max(1)])
                    .collect())
            }
        }
    }

    fn mask_logits(
        &self,
        logits: &mut CudaTensor,
        masks: &super::RowMasks,
    ) -> Result<(), DeviceError> {
        if masks.is_empty() {
            return Ok(());
        }
        self.timed("mask_logits", || {
            let rows = self.htod_u32(&masks.rows)?;
            let bits = self.htod_u32(&masks.bits)?;
            let vocab = logits.cols;
            self.launch_mask_logits(
                logits.f32_mut("mask_logits")?,
                &rows,
                &bits,
                (masks.rows.len(), masks.words, vocab),
            )
        })
    }

    fn edit_logits(
        &self,
        logits: &mut CudaTensor,
        edits: &super::LogitEdits,
    ) -> Result<(), DeviceError> {
        if edits.is_empty() {
            return Ok(());
        }
        self.timed("edit_logits", || {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            let row = self.htod_u32(&edits.row)?;
            let token = self.htod_u32(&edits.token)?;
            let pos = self.htod_u32(&bits(&edits.pos))?;
            let neg = self.htod_u32(&bits(&edits.neg))?;
            let add = self.htod_u32(&bits(&edits.add))?;
            let vocab = logits.cols;
            self.launch_edit_logits(
                logits.f32_mut("edit_logits")?,
                [&row, &token, &pos, &neg, &add],
                edits.len(),
                vocab,
            )
        })
    }

    fn sample(
        &self,
        logits: &CudaTensor,
        rows: &[super::RowSampling],
        logprobs: &[i32],
    ) -> Result<Option<super::DeviceSample>, DeviceError> {
        self.timed("sample", || {
            let n = logits.rows;
            if n == 0 {
                return Ok(Some(super::DeviceSample::default()));
            }
            let params = self.htod_u32(&super::RowSampling::to_words(rows))?;
            let any_random = rows.iter().any(|r| r.temperature > 0.0 && r.top_k != 1);
            let mut scratch =
                self.alloc_f32(if any_random { n * logits.cols } else { 1 }, "sampling")?;
            let mut ids = self.htod_u32(&vec![0u32; n])?;
            let x = logits.f32("sample")?;
            self.launch_sample(x, &params, &mut scratch, &mut ids, (n, logits.cols))?;
            let mut lps = vec![None; n];
            if logprobs.iter().any(|&k| k >= 0) {
                const TOP: usize = crate::sampler::MAX_TOP_LOGPROBS;
                let want =
                    self.htod_u32(&logprobs.iter().map(|&k| k as u32).collect::<Vec<_>>())?;
                let mut lp = self.alloc_f32(n * (1 + TOP), "logprobs")?;
                let mut top = self.htod_u32(&vec![0u32; n * TOP])?;
                self.launch_logprobs(x, &ids, &want, &mut lp, &mut top, (n, logits.cols))?;
                let lp = self
                    .stream
                    .clone_dtoh(&lp)
                    .map_err(op_err("download logprobs"))?;
                let top = self
                    .stream
                    .clone_dtoh(&top)
                    .map_err(op_err("download logprobs"))?;
                let chosen = self
                    .stream
                    .clone_dtoh(&ids)
                    .map_err(op_err("download tokens"))?;
                for (r, &k) in logprobs.iter().enumerate() {
                    if k < 0 {
                        continue;
                    }
                    let k = (k as usize).min(TOP).min(logits.cols);
                    let l = &lp[r * (1 + TOP)..(r + 1) * (1 + TOP)];
                    lps[r] = Some(crate::sampler::RowLogprobs {
                        token: chosen[r],
                        logprob: l[0],
                        top: (0..k).map(|j| (top[r * TOP + j], l[1 + j])).collect(),
                    });
                }
                return Ok(Some(super::DeviceSample {
                    ids: chosen,
                    logprobs: lps,
                }));
            }
            Ok(Some(super::DeviceSample {
                ids: self
                    .stream
                    .clone_dtoh(&ids)
                    .map_err(op_err("download tokens"))?,
                logprobs: lps,
            }))
        })
    }

    fn samples_on_device(&self) -> bool {
        true
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.ctx.mem_get_info().ok()
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.stream.synchronize().map_err(op_err("synchronize"))
    }
}
