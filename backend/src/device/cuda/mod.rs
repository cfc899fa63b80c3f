//! The CUDA device: bf16 weights and activations, an f32 residual stream, f32 logits; cuBLAS for
//! every matmul; Cachet's own kernels (compiled by NVRTC at start-up for the GPU's architecture,
//! cached on disk) for everything else.
//!
//! All unsafe code of the GPU path is in this module: kernel launches (argument lists checked
//! against the kernels' documented signatures) and the cuBLAS call. Every CUDA call's status is
//! checked and becomes a typed [`DeviceError`].
//!
//! cudarc loads libcuda / libnvrtc / libcublas at run time and panics if one is missing, so
//! [`CudaDevice::new`] probes for them first and fails with a clear error instead.

mod graphs;

use std::sync::Arc;

use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use half::bf16;

use super::{AttnParams, Device, ForwardBatch, KvCacheDtype, KvLayout};
use crate::error::DeviceError;
use crate::loader::HostTensor;

const DEV: &str = "cuda";

fn op_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> DeviceError {
    move |e| DeviceError::Op {
        device: DEV,
        op,
        msg: format!("{e:?}"),
    }
}

/// Device memory of a tensor.
pub enum CudaBuf {
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

pub struct CudaTensor {
    pub rows: usize,
    pub cols: usize,
    pub buf: CudaBuf,
}

impl CudaTensor {
    fn bf16(&self, op: &'static str) -> Result<&CudaSlice<u16>, DeviceError> {
        match &self.buf {
            CudaBuf::Bf16(b) => Ok(b),
            CudaBuf::F32(_) => Err(DeviceError::Op {
                device: DEV,
                op,
                msg: "expected a bf16 tensor".into(),
            }),
        }
    }
    fn f32(&self, op: &'static str) -> Result<&CudaSlice<f32>, DeviceError> {
        match &self.buf {
            CudaBuf::F32(b) => Ok(b),
            CudaBuf::Bf16(_) => Err(DeviceError::Op {
                device: DEV,
                op,
                msg: "expected an f32 tensor".into(),
            }),
        }
    }
}

/// The paged KV cache: per layer, K and V of `[num_slots, n_kv, d]`, bf16 (as raw bytes) or e4m3
/// codes with f32 scales of `[num_slots, n_kv]` (one-element placeholders for bf16).
pub struct CudaKv {
    pub layout: KvLayout,
    k: Vec<CudaSlice<u8>>,
    v: Vec<CudaSlice<u8>>,
    k_scale: Vec<CudaSlice<f32>>,
    v_scale: Vec<CudaSlice<f32>>,
    /// Decode graphs captured over this cache.
    graphs: Option<graphs::DecodeGraphs>,
}

/// One step's batch metadata in device memory.
pub struct CudaBatch {
    n: usize,
    ids: CudaSlice<u32>,
    pos: CudaSlice<u32>,
    slots: CudaSlice<u32>,
    block_tables: CudaSlice<u32>,
    max_blocks: usize,
    logit_rows: CudaSlice<u32>,
    num_logit_rows: usize,
    block_size: usize,
    /// Attention query tiles: up to ATT_TQ consecutive tokens of one sequence each.
    tile_seq: CudaSlice<u32>,
    tile_start: CudaSlice<u32>,
    tile_len: CudaSlice<u32>,
    num_tiles: usize,
    tile_lens: Vec<u32>,
    /// Longest context any tile attends over.
    max_ctx: usize,
}

impl CudaBatch {
    /// Tokens of the longest attention tile (0 for an empty batch).
    fn longest_tile(&self) -> usize {
        self.tile_lens.iter().copied().max().unwrap_or(0) as usize
    }

    /// Whether each sequence's new tokens form one attention unit of `sub_tokens` (decode and
    /// verification steps, short chunks): no tile longer than a unit, and none a full ATT_TQ,
    /// so no sequence was cut into several tiles.
    fn one_unit_per_sequence(&self, sub_tokens: usize) -> bool {
        let longest = self.longest_tile();
        longest <= sub_tokens && longest < ATT_TQ
    }
}

struct Kernels {
    rms_norm: CudaFunction,
    add_rms_norm: CudaFunction,
    embed: CudaFunction,
    silu_mul: CudaFunction,
    silu_mul_x8: CudaFunction,
    gather_rows: CudaFunction,
    rope_kv: CudaFunction,
    attention: CudaFunction,
    attention_mma_d64: CudaFunction,
    attention_mma_d128: CudaFunction,
    rope_kv_fp8: CudaFunction,
    attention_fp8: CudaFunction,
    attention_mma_d64_fp8: CudaFunction,
    attention_mma_d128_fp8: CudaFunction,
    combine: CudaFunction,
    fill_normal: CudaFunction,
    sample: CudaFunction,
    /// gemv.cu, one per entry of GEMV_ROWS.
    gemv: [CudaFunction; 3],
    gemv_norm: [CudaFunction; 3],
    gemv_norm_swiglu: [CudaFunction; 3],
}

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    _blas_workspace: CudaSlice<u8>,
    k: Kernels,
    pub name: String,
    pub arch: String,
    block_size: usize,
    /// Streaming multiprocessors (sizes the attention split).
    sms: usize,
    /// Force the CUDA-core attention kernel (`CACHET_ATTENTION=simt`), for comparisons.
    simt_attention: bool,
    /// Let the tensor-core attention rotate q/k and write K/V itself where it can (see
    /// `fuses_rope`); `CACHET_ROPE=separate` keeps the rope_kv launch, for comparisons.
    fused_rope: bool,
    /// Shortest key range of an attention split, most splits, how many waves of blocks the
    /// splits may fill, and the multiple of keys a tensor-core split is rounded to
    /// (`CACHET_ATTENTION_SPLIT=keys,n[,waves[,step]]` overrides MIN_SPLIT, MAX_SPLITS,
    /// SPLIT_WAVES and ATT_TK, for comparisons; the CUDA-core kernel always takes ATT_TK).
    split: (usize, usize, usize, usize),
    /// Projections of at most this many rows (≤ GEMV_ROWS' last) go through gemv.cu, norms and
    /// SwiGLU fused in; `CACHET_GEMV=off` (0) or a row count sets it, for comparisons.
    gemv_max_rows: usize,
    /// Per-operation events while profiling.
    profiling: std::cell::Cell<bool>,
    events: std::cell::RefCell<
        Vec<(
            &'static str,
            cudarc::driver::CudaEvent,
            cudarc::driver::CudaEvent,
        )>,
    >,
}

// SAFETY: the context, stream, cuBLAS handle and functions are only used from the thread that
// owns the device (the engine thread); cudarc's handles are thread-agnostic once bound.
unsafe impl Send for CudaDevice {}

// Must match attention.cu.
const ATT_THREADS: u32 = 128;
const ATT_TQ: usize = 32;
const ATT_TK: usize = 64;
const ATT_MAXD: usize = 128;
/// Query rows (tokens × GQA group) per block of the tensor-core kernel (MMA_TQ in attention_mma.cu).
const MMA_ROWS: usize = 64;
/// Threads of a combine block (COMBINE_THREADS in attention.cu): four per output element.
const COMBINE_THREADS: u32 = 512;
/// Output elements a combine block merges (COMBINE_ELEMS).
const COMBINE_ELEMS: usize = 128;

/// Tokens per block unit of the tensor-core attention: as many as fill its MMA_ROWS query rows
/// with a GQA group each, at most a tile.
fn mma_sub_tokens(group: usize) -> usize {
    (MMA_ROWS / group).clamp(1, ATT_TQ)
}
/// Shortest key range an attention split is given.
const MIN_SPLIT: usize = 64;
/// Most blocks a key range is split over.
const MAX_SPLITS: usize = 64;
/// Waves of attention blocks the splits may fill. Measured on the H200 (8B shape, ctx 4096,
/// graphs), two waves against one: batch 1 4.59 vs 4.64 ms, batch 2 4.94 vs 5.10, batch 4 5.58 vs
/// 5.80, batch 16 7.52 vs 9.01, batch 64 17.77 vs 17.71 — with the one-round-trip combine, more
/// and shorter splits pay even as a partial second wave. Decode and verification steps only: a
/// 512-token prefill split three ways took 23 ms against 14 unsplit.
const SPLIT_WAVES: usize = 2;
/// cuBLAS workspace (what NVIDIA recommends for Hopper).
const CUBLAS_WORKSPACE: usize = 32 << 20;
/// Threads per block of the tensor-core kernel (four warps of 16 rows).
const MMA_THREADS: u32 = 128;
/// Blocks of the tensor-core kernel resident per SM (its __launch_bounds__ minimum).
const MMA_BLOCKS_PER_SM: usize = 3;

/// Rows of input each GEMV instantiation takes (gemv.cu's `_r{R}` kernels), smallest first.
const GEMV_ROWS: [usize; 3] = [1, 2, 4];
/// Rows served by gemv.cu unless CACHET_GEMV says otherwise: up to two. Measured on the H200
/// (8B shape, CUDA graphs): 1 row 4.46 vs 4.87 ms a step with cuBLAS, 2 rows 4.66 vs 4.93 ms,
/// but 4 rows 5.33 vs 5.04 ms (cuBLAS hardly slows from 1 to 4 rows; the GEMV's arithmetic
/// per weight grows with the rows).
const GEMV_DEFAULT_ROWS: usize = 2;
/// Threads of a GEMV block (GEMV_THREADS in gemv.cu); one block per SM.
const GEMV_THREADS: u32 = 512;
/// Most shared memory a fused-norm GEMV may take for its normalised inputs (R · k bf16).
const GEMV_SMEM_MAX: usize = 96 << 10;

/// How an attention launch laid out its split rows (see attention_combine_bf16).
#[derive(Clone, Copy)]
struct CombineShape {
    units: usize,
    grid_y: usize,
    splits: usize,
    group: usize,
    sub_tokens: usize,
    units_per_tile: usize,
    /// Rows per unit in the split buffers.
    unit_rows: usize,
}

/// Shared memory of the tensor-core kernel (attention_mma.cu): two stages of K and V tiles in
/// bf16 (Q is staged in the second before the loop).
fn mma_smem_bytes(d: usize) -> u32 {
    (4 * ATT_TK * (d + 8) * 2) as u32
}

/// Shared memory of the FP8 tensor-core kernels: one bf16 K/V tile and two raw stages of K and V
/// codes (Q is staged in the raw stages before the loop).
fn mma_fp8_smem_bytes(d: usize) -> u32 {
    (2 * ATT_TK * (d + 8) * 2 + 4 * ATT_TK * d) as u32
}

fn attention_smem_bytes(d: usize) -> u32 {
    ((ATT_TQ * (d + 1) + 2 * ATT_TK * (d + 1) + ATT_TQ * ATT_TK) * 4) as u32
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

impl CudaDevice {
    /// Opens GPU `ordinal`, compiles (or loads cached) kernels for its architecture.
    pub fn new(ordinal: usize, block_size: usize) -> Result<Self, DeviceError> {
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
        let cache = crate::loader::fetch::cache_dir().join("kernels");
        let compiled =
            cachet_kernels::compile::compile(&arch, Some(&cache)).map_err(|e| DeviceError::Op {
                device: DEV,
                op: "compile kernels",
                msg: e.to_string(),
            })?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin))
            .map_err(op_err("load kernels"))?;
        let f = |name: &str| module.load_function(name).map_err(op_err("load kernel"));
        let k = Kernels {
            rms_norm: f("rms_norm_bf16")?,
            add_rms_norm: f("add_rms_norm_bf16")?,
            embed: f("embed_bf16")?,
            silu_mul: f("silu_mul_bf16")?,
            silu_mul_x8: f("silu_mul_bf16x8")?,
            gather_rows: f("gather_rows_bf16")?,
            rope_kv: f("rope_kv_bf16")?,
            attention: f("paged_attention_bf16")?,
            attention_mma_d64: f("paged_attention_mma_d64_bf16")?,
            attention_mma_d128: f("paged_attention_mma_d128_bf16")?,
            rope_kv_fp8: f("rope_kv_fp8")?,
            attention_fp8: f("paged_attention_fp8")?,
            attention_mma_d64_fp8: f("paged_attention_mma_d64_fp8")?,
            attention_mma_d128_fp8: f("paged_attention_mma_d128_fp8")?,
            combine: f("attention_combine_bf16")?,
            fill_normal: f("fill_normal_bf16")?,
            sample: f("sample_f32")?,
            gemv: [f("gemv_bf16_r1")?, f("gemv_bf16_r2")?, f("gemv_bf16_r4")?],
            gemv_norm: [
                f("gemv_norm_bf16_r1")?,
                f("gemv_norm_bf16_r2")?,
                f("gemv_norm_bf16_r4")?,
            ],
            gemv_norm_swiglu: [
                f("gemv_norm_swiglu_bf16_r1")?,
                f("gemv_norm_swiglu_bf16_r2")?,
                f("gemv_norm_swiglu_bf16_r4")?,
            ],
        };
        let smem = attention_smem_bytes(ATT_MAXD);
        for func in [&k.attention, &k.attention_fp8] {
            func.set_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
                .map_err(op_err("attention smem"))?;
        }
        for (func, bytes) in [
            (&k.attention_mma_d64, mma_smem_bytes(64)),
            (&k.attention_mma_d128, mma_smem_bytes(128)),
            (&k.attention_mma_d64_fp8, mma_fp8_smem_bytes(64)),
            (&k.attention_mma_d128_fp8, mma_fp8_smem_bytes(128)),
        ] {
            func.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(op_err("attention smem"))?;
        }
        for func in k.gemv_norm.iter().chain(&k.gemv_norm_swiglu) {
            func.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                GEMV_SMEM_MAX as i32,
            )
            .map_err(op_err("gemv smem"))?;
        }
        let simt_attention = std::env::var("CACHET_ATTENTION").is_ok_and(|v| v == "simt");
        let fused_rope = !std::env::var("CACHET_ROPE").is_ok_and(|v| v == "separate");
        let split = match std::env::var("CACHET_ATTENTION_SPLIT") {
            Err(_) => (MIN_SPLIT, MAX_SPLITS, SPLIT_WAVES, ATT_TK),
            Ok(v) => {
                let n: Vec<usize> = v
                    .split(',')
                    .map(|x| x.trim().parse().unwrap_or(0))
                    .collect();
                match n[..] {
                    [k, s] if k > 0 && s > 0 => (k, s, SPLIT_WAVES, ATT_TK),
                    [k, s, w] if k > 0 && s > 0 && w > 0 => (k, s, w, ATT_TK),
                    [k, s, w, t] if k > 0 && s > 0 && w > 0 && t > 0 => (k, s, w, t),
                    _ => {
                        return Err(DeviceError::Op {
                            device: DEV,
                            op: "CACHET_ATTENTION_SPLIT",
                            msg: format!(
                                "`{v}`: expected `min_keys,max_splits[,waves[,step]]`, e.g. `128,32` or `64,64,2`"
                            ),
                        })
                    }
                }
            }
        };
        let gemv_max_rows = match std::env::var("CACHET_GEMV").as_deref() {
            Ok("off") => 0,
            Ok(v) => v.parse::<usize>().map_err(|_| DeviceError::Op {
                device: DEV,
                op: "CACHET_GEMV",
                msg: format!("`{v}`: expected off or a row count"),
            })?,
            Err(_) => GEMV_DEFAULT_ROWS,
        }
        .min(GEMV_ROWS[GEMV_ROWS.len() - 1]);
        let blas = CudaBlas::new(stream.clone()).map_err(|e| DeviceError::Op {
            device: DEV,
            op: "cublas",
            msg: format!("{e:?}"),
        })?;
        // cuBLAS gets a workspace of its own up front, so no GEMM allocates while a graph is
        // being captured.
        let workspace =
            unsafe { stream.alloc::<u8>(CUBLAS_WORKSPACE) }.map_err(op_err("cublas workspace"))?;
        {
            let (ptr, _g) = workspace.device_ptr(&stream);
            // SAFETY: a live allocation of CUBLAS_WORKSPACE bytes, kept for the handle's lifetime
            // (stored in the device next to it).
            let status = unsafe {
                blas_sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut std::ffi::c_void,
                    CUBLAS_WORKSPACE,
                )
            };
            if status != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "cublasSetWorkspace",
                    msg: format!("{status:?}"),
                });
            }
        }
        let name = ctx.name().unwrap_or_else(|_| "CUDA GPU".into());
        tracing::info!(gpu = %name, %arch, kernels_cached = compiled.from_cache, "CUDA device ready");
        Ok(CudaDevice {
            ctx,
            stream,
            blas,
            _blas_workspace: workspace,
            k,
            name,
            arch,
            block_size,
            sms,
            simt_attention,
            fused_rope,
            split,
            gemv_max_rows,
            profiling: std::cell::Cell::new(false),
            events: std::cell::RefCell::new(Vec::new()),
        })
    }

    /// An output buffer: uninitialised, because every kernel and GEMM writing one covers all of it
    /// (no memset on the hot path).
    fn alloc_bf16(&self, n: usize, what: &str) -> Result<CudaSlice<u16>, DeviceError> {
        // SAFETY: u16 has no invalid bit patterns; callers fully write the buffer before reading it.
        unsafe { self.stream.alloc::<u16>(n.max(1)) }.map_err(|e| DeviceError::OutOfMemory {
            device: DEV,
            bytes: n * 2,
            what: format!("{what} ({e:?})"),
        })
    }
    fn alloc_f32(&self, n: usize, what: &str) -> Result<CudaSlice<f32>, DeviceError> {
        // SAFETY: as above, for f32.
        unsafe { self.stream.alloc::<f32>(n.max(1)) }.map_err(|e| DeviceError::OutOfMemory {
            device: DEV,
            bytes: n * 4,
            what: format!("{what} ({e:?})"),
        })
    }
    fn htod_u32(&self, v: &[u32]) -> Result<CudaSlice<u32>, DeviceError> {
        let v = if v.is_empty() { &[0u32][..] } else { v };
        self.stream.clone_htod(v).map_err(op_err("upload batch"))
    }

    /// A row-normalisation launch: one block per row, threads enough that each keeps at most
    /// RMS_PER_THREAD (rms_norm.cu) elements in registers.
    fn norm_config(rows: usize, cols: usize) -> LaunchConfig {
        let threads = (cols.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32;
        Self::rows_config(rows, threads)
    }

    fn rows_config(rows: usize, threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// `out = x · wᵀ` with cuBLAS (bf16 inputs, f32 accumulation), out bf16 or f32.
    fn gemm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        out_f32: bool,
    ) -> Result<CudaTensor, DeviceError> {
        if x.cols != w.cols {
            return Err(DeviceError::Op {
                device: DEV,
                op: "linear",
                msg: format!("x has {} columns, w has {}", x.cols, w.cols),
            });
        }
        let (n, k, m) = (x.rows, x.cols, w.rows);
        let xs = x.bf16("linear")?;
        let ws = w.bf16("linear")?;
        let mut out = if out_f32 {
            CudaBuf::F32(self.alloc_f32(n * m, "linear")?)
        } else {
            CudaBuf::Bf16(self.alloc_bf16(n * m, "linear")?)
        };
        if n == 0 {
            return Ok(CudaTensor {
                rows: n,
                cols: m,
                buf: out,
            });
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (xp, _gx) = xs.device_ptr(&self.stream);
        let (wp, _gw) = ws.device_ptr(&self.stream);
        let status = {
            let (op, ot) = match &mut out {
                CudaBuf::F32(o) => (
                    o.device_ptr_mut(&self.stream),
                    blas_sys::cudaDataType_t::CUDA_R_32F,
                ),
                CudaBuf::Bf16(o) => (
                    o.device_ptr_mut(&self.stream),
                    blas_sys::cudaDataType_t::CUDA_R_16BF,
                ),
            };
            // Row-major out[n, m] = x[n, k] · w[m, k]ᵀ is column-major outᵀ[m, n] = wᵀ·x with w seen as
            // a k×m column-major matrix (transposed) and x as k×n.
            // SAFETY: the pointers are live device allocations of the stated sizes (n·k, m·k, n·m
            // elements of the stated types), on the handle's stream; alpha/beta outlive the call.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    *self.blas.handle(),
                    blas_sys::cublasOperation_t::CUBLAS_OP_T,
                    blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    m as i32,
                    n as i32,
                    k as i32,
                    (&alpha as *const f32).cast(),
                    wp as *const _,
                    blas_sys::cudaDataType_t::CUDA_R_16BF,
                    k as i32,
                    xp as *const _,
                    blas_sys::cudaDataType_t::CUDA_R_16BF,
                    k as i32,
                    (&beta as *const f32).cast(),
                    op.0 as *mut _,
                    ot,
                    m as i32,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
        };
        status.map_err(|e| DeviceError::Op {
            device: DEV,
            op: "cublasGemmEx",
            msg: format!("{e:?}"),
        })?;
        Ok(CudaTensor {
            rows: n,
            cols: m,
            buf: out,
        })
    }
}

impl CudaDevice {
    /// Which GEMV instantiation serves `rows` input rows of `k` features, if any.
    fn gemv_variant(&self, rows: usize, k: usize) -> Option<usize> {
        if rows == 0 || rows > self.gemv_max_rows || !k.is_multiple_of(8) || k > i32::MAX as usize {
            return None;
        }
        GEMV_ROWS.iter().position(|&r| rows <= r)
    }

    fn gemv_config(&self, smem: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.sms as u32, 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        }
    }

    /// `x · wᵀ` for a few rows with gemv.cu.
    fn gemv(&self, x: &CudaTensor, w: &CudaTensor, v: usize) -> Result<CudaTensor, DeviceError> {
        let (rows, k, n) = (x.rows, x.cols, w.rows);
        let mut out = self.alloc_bf16(rows * n, "gemv")?;
        let (ni, ki, ri) = (n as i32, k as i32, rows as i32);
        let mut l = self.stream.launch_builder(&self.k.gemv[v]);
        l.arg(w.bf16("gemv")?)
            .arg(x.bf16("gemv")?)
            .arg(&mut out)
            .arg(&ni)
            .arg(&ki)
            .arg(&ri);
        // SAFETY: gemv_bf16_r{R}(bf16 w[n, k], bf16 x[rows, k], bf16 y[rows, n], int n, int k,
        // int rows) with rows ≤ R, k % 8 == 0 (gemv_variant) and fresh 16-byte-aligned
        // allocations, so every row starts 16-byte aligned.
        unsafe { l.launch(self.gemv_config(0)) }.map_err(op_err("gemv"))?;
        Ok(CudaTensor {
            rows,
            cols: n,
            buf: CudaBuf::Bf16(out),
        })
    }

    /// The GEMV instantiation that fuses a norm over `residual` into a projection by `w`, if
    /// one fits.
    fn gemv_norm_variant(
        &self,
        residual: &CudaTensor,
        w: &CudaTensor,
        swiglu: bool,
    ) -> Option<usize> {
        let v = self.gemv_variant(residual.rows, residual.cols)?;
        let fits = GEMV_ROWS[v] * residual.cols * 2 <= GEMV_SMEM_MAX
            && w.cols == residual.cols
            && (!swiglu || w.rows.is_multiple_of(2));
        fits.then_some(v)
    }

    /// [`Device::norm_linear`] (or, `swiglu`, [`Device::norm_swiglu`]): one fused gemv.cu launch
    /// where the rows fit one ([`CudaDevice::gemv_norm_variant`]), else the norm, the GEMM (and
    /// SwiGLU) as separate launches.
    fn norm_projection(
        &self,
        residual: &mut CudaTensor,
        delta: Option<&CudaTensor>,
        norm: &CudaTensor,
        eps: f32,
        w: &CudaTensor,
        swiglu: bool,
    ) -> Result<CudaTensor, DeviceError> {
        let Some(v) = self.gemv_norm_variant(residual, w, swiglu) else {
            let x = self.norm(residual, delta, norm, eps)?;
            let y = self.linear(&x, w)?;
            return if swiglu { self.silu_mul(&y) } else { Ok(y) };
        };
        let op = if swiglu {
            "gemv + norm + swiglu"
        } else {
            "gemv + norm"
        };
        self.timed(op, || {
            let (rows, k) = (residual.rows, residual.cols);
            let smem = GEMV_ROWS[v] * k * 2;
            let n = if swiglu { w.rows / 2 } else { w.rows };
            let mut out = self.alloc_bf16(rows * n, "gemv")?;
            let CudaBuf::F32(res) = &residual.buf else {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "gemv",
                    msg: "residual must be f32".into(),
                });
            };
            let mut res_out = match delta {
                Some(_) => Some(self.alloc_f32(rows * k, "gemv")?),
                None => None,
            };
            let null = 0u64;
            let (ni, ki, ri) = (n as i32, k as i32, rows as i32);
            let func = if swiglu {
                &self.k.gemv_norm_swiglu[v]
            } else {
                &self.k.gemv_norm[v]
            };
            let mut l = self.stream.launch_builder(func);
            l.arg(res);
            match delta {
                Some(d) => l.arg(d.bf16("gemv")?),
                None => l.arg(&null),
            };
            match &mut res_out {
                Some(r) => l.arg(r),
                None => l.arg(&null),
            };
            l.arg(norm.bf16("gemv")?)
                .arg(w.bf16("gemv")?)
                .arg(&mut out)
                .arg(&ni)
                .arg(&ki)
                .arg(&ri)
                .arg(&eps);
            // SAFETY: gemv_norm[_swiglu]_bf16_r{R}(f32 residual[rows, k], bf16 delta[rows, k] or null,
            // f32 residual_out[rows, k] or null, bf16 norm_w[k], bf16 w[n or 2n, k], bf16 out[rows, n],
            // int n, int k, int rows, float eps): rows ≤ R, k % 8 == 0, R·k·2 bytes of dynamic shared
            // memory within the attribute set at start-up; residual_out is a fresh buffer, so no
            // block reads what another writes.
            unsafe { l.launch(self.gemv_config(smem)) }.map_err(op_err("gemv"))?;
            if let Some(r) = res_out {
                residual.buf = CudaBuf::F32(r);
            }
            Ok(CudaTensor {
                rows,
                cols: n,
                buf: CudaBuf::Bf16(out),
            })
        })
    }

    /// Runs `f`, bracketed by timing events when profiling.
    fn timed<T>(
        &self,
        op: &'static str,
        f: impl FnOnce() -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        if !self.profiling.get() {
            return f();
        }
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(flags).map_err(op_err("event"))?;
        let out = f()?;
        let end = self.stream.record_event(flags).map_err(op_err("event"))?;
        self.events.borrow_mut().push((op, start, end));
        Ok(out)
    }

    /// The tensor-core attention kernel for head_dim `d` and the cache's dtype, if there is one
    /// (and `CACHET_ATTENTION=simt` does not ask for the CUDA-core kernel).
    fn mma_attention(&self, d: usize, fp8: bool) -> Option<&CudaFunction> {
        match (d, fp8) {
            _ if self.simt_attention => None,
            (64, false) => Some(&self.k.attention_mma_d64),
            (128, false) => Some(&self.k.attention_mma_d128),
            (64, true) => Some(&self.k.attention_mma_d64_fp8),
            (128, true) => Some(&self.k.attention_mma_d128_fp8),
            _ => None,
        }
    }

    /// Whether the attention kernel rotates q and k and writes K/V itself (no rope_kv launch):
    /// the tensor-core kernel (bf16 or FP8 cache), when each sequence of the batch is one block
    /// unit (decode steps, verification steps, short chunks): every tile at most `sub_tokens`
    /// long and shorter than ATT_TQ, so no sequence was cut into several tiles whose blocks
    /// would read each other's new keys.
    fn fuses_rope(&self, b: &CudaBatch, p: &AttnParams, fp8: bool) -> bool {
        let group = p.num_heads / p.num_kv_heads.max(1);
        self.fused_rope
            && b.n > 0
            && group <= MMA_ROWS
            && self.mma_attention(p.head_dim, fp8).is_some()
            && b.one_unit_per_sequence(mma_sub_tokens(group))
    }

    /// RoPE on the q and k heads of `qkv`, in place, and the K/V write into the cache of `layer`
    /// (rope_kv.cu): the step before the attention kernel, unless that kernel does it itself.
    fn rope_and_cache(
        &self,
        qkv: &mut CudaTensor,
        rope: &CudaTensor,
        kv: &mut CudaKv,
        layer: usize,
        b: &CudaBatch,
        p: &AttnParams,
    ) -> Result<(), DeviceError> {
        self.timed("rope+kv_write", || {
            if b.n == 0 {
                return Ok(());
            }
            let (nh, nkv, d) = (p.num_heads as i32, p.num_kv_heads as i32, p.head_dim as i32);
            let table = rope.f32("rope")?;
            let CudaBuf::Bf16(q) = &mut qkv.buf else {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "rope",
                    msg: "qkv must be bf16".into(),
                });
            };
            let func = match kv.layout.dtype {
                KvCacheDtype::Auto => &self.k.rope_kv,
                KvCacheDtype::Fp8E4m3 => &self.k.rope_kv_fp8,
            };
            let mut l = self.stream.launch_builder(func);
            l.arg(q)
                .arg(table)
                .arg(&b.pos)
                .arg(&b.slots)
                .arg(&mut kv.k[layer])
                .arg(&mut kv.v[layer])
                .arg(&mut kv.k_scale[layer])
                .arg(&mut kv.v_scale[layer])
                .arg(&nh)
                .arg(&nkv)
                .arg(&d);
            let cfg = LaunchConfig {
                grid_dim: (b.n as u32, (p.num_heads + p.num_kv_heads) as u32, 1),
                block_dim: ((p.head_dim / 2) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: rope_kv_{bf16,fp8}(bf16 qkv[n, (nh+2nkv)d], f32 rope[max_pos, d], u32 pos[n], u32 slots[n],
            // k_cache[slots, nkv, d], v_cache[slots, nkv, d] (bf16 or e4m3, as allocated for the layout's
            // dtype), f32 k_scale/v_scale[slots, nkv] (fp8), int, int, int) on grid (n, nh + nkv),
            // block d/2 (d even, checked by the config; attention caps it at 128); positions are below max_pos and slots inside
            // the cache or the padding mark (validated by the runner).
            unsafe { l.launch(cfg) }.map_err(op_err("rope_kv"))?;
            Ok(())
        })
    }

    /// Merges the attention splits (if any) into `out`.
    fn finish_attention(
        &self,
        mut out: CudaSlice<u16>,
        part_o: CudaSlice<f32>,
        part_ml: CudaSlice<f32>,
        b: &CudaBatch,
        p: &AttnParams,
        sh: CombineShape,
    ) -> Result<CudaTensor, DeviceError> {
        if sh.splits > 1 {
            let (nh, di, sp) = (p.num_heads as i32, p.head_dim as i32, sh.splits as i32);
            let (g, st, upt, ur) = (
                sh.group as i32,
                sh.sub_tokens as i32,
                sh.units_per_tile as i32,
                sh.unit_rows as i32,
            );
            let mut c = self.stream.launch_builder(&self.k.combine);
            c.arg(&part_o)
                .arg(&part_ml)
                .arg(&b.tile_start)
                .arg(&b.tile_len)
                .arg(&mut out)
                .arg(&nh)
                .arg(&di)
                .arg(&sp)
                .arg(&g)
                .arg(&st)
                .arg(&upt)
                .arg(&ur);
            // Outputs of the fullest unit: its tokens (at most sub_tokens, at most the longest
            // tile) × group × d, COMBINE_ELEMS a block.
            let longest = b.longest_tile().max(1);
            let elems = sh.sub_tokens.min(longest) * sh.group * p.head_dim;
            let cfg = LaunchConfig {
                grid_dim: (
                    sh.units as u32,
                    sh.grid_y as u32,
                    elems.div_ceil(COMBINE_ELEMS) as u32,
                ),
                block_dim: (COMBINE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: attention_combine_bf16 over the split buffers the attention launch filled;
            // blocks past a unit's outputs return.
            unsafe { c.launch(cfg) }.map_err(op_err("attention combine"))?;
        }
        Ok(CudaTensor {
            rows: b.n,
            cols: p.num_heads * p.head_dim,
            buf: CudaBuf::Bf16(out),
        })
    }

    /// Device-to-device copy bandwidth (bytes read + written per second) over `bytes`.
    pub fn measure_copy_bandwidth(&self, bytes: usize) -> Result<f64, DeviceError> {
        let n = bytes / 4;
        let src = self.random(&[n / 2, 2], 1, 0.0, 1.0)?;
        let src = src.bf16("copy")?;
        let mut dst = self.alloc_bf16(src.len(), "copy")?;
        let mut times = Vec::new();
        for i in 0..12 {
            self.synchronize()?;
            let t = std::time::Instant::now();
            self.stream
                .memcpy_dtod(src, &mut dst)
                .map_err(op_err("copy"))?;
            self.synchronize()?;
            if i >= 2 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(2.0 * (src.len() * 2) as f64 / times[times.len() / 2])
    }

    /// cuBLAS bf16 GEMM rate (FLOP/s) at `n`×`n`×`n` on random data.
    pub fn measure_gemm_flops(&self, n: usize) -> Result<f64, DeviceError> {
        let a = self.random(&[n, n], 2, 0.0, 1.0)?;
        let b = self.random(&[n, n], 3, 0.0, 1.0)?;
        let mut times = Vec::new();
        for i in 0..13 {
            self.synchronize()?;
            let t = std::time::Instant::now();
            let c = self.gemm(&a, &b, false)?;
            self.synchronize()?;
            drop(c);
            if i >= 3 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(2.0 * (n as f64).powi(3) / times[times.len() / 2])
    }
}

fn host_bf16(t: &HostTensor) -> Vec<u16> {
    t.data
        .iter()
        .map(|&x| bf16::from_f32(x).to_bits())
        .collect()
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
            .clone_htod(&host_bf16(t))
            .map_err(op_err("upload"))?;
        Ok(CudaTensor {
            rows,
            cols,
            buf: CudaBuf::Bf16(buf),
        })
    }

    fn upload_table(&self, t: &HostTensor) -> Result<CudaTensor, DeviceError> {
        let (rows, cols) = super::matrix_dims(&t.shape, DEV, "upload")?;
        let buf = self.stream.clone_htod(&t.data).map_err(op_err("upload"))?;
        Ok(CudaTensor {
            rows,
            cols,
            buf: CudaBuf::F32(buf),
        })
    }

    fn random(
        &self,
        shape: &[usize],
        seed: u64,
        mean: f32,
        std: f32,
    ) -> Result<CudaTensor, DeviceError> {
        let (rows, cols) = super::matrix_dims(shape, DEV, "random")?;
        let n = rows * cols;
        let mut buf = self.alloc_bf16(n, "dummy weight")?;
        let mut b = self.stream.launch_builder(&self.k.fill_normal);
        let (n64, seed) = (n as u64, seed);
        b.arg(&mut buf).arg(&n64).arg(&seed).arg(&mean).arg(&std);
        let cfg = LaunchConfig {
            grid_dim: (1024, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: fill_normal_bf16(bf16* out [n], u64 n, u64 seed, f32 mean, f32 std).
        unsafe { b.launch(cfg) }.map_err(op_err("fill_normal"))?;
        Ok(CudaTensor {
            rows,
            cols,
            buf: CudaBuf::Bf16(buf),
        })
    }

    fn alloc_kv(&self, layout: &KvLayout) -> Result<CudaKv, DeviceError> {
        let heads = layout.num_slots() * layout.num_kv_heads;
        let n = heads * layout.head_dim;
        let fp8 = layout.dtype == KvCacheDtype::Fp8E4m3;
        if fp8 && !layout.head_dim.is_multiple_of(8) {
            return Err(DeviceError::Op {
                device: DEV,
                op: "alloc_kv",
                msg: format!(
                    "an FP8 KV cache needs head_dim divisible by 8 (got {})",
                    layout.head_dim
                ),
            });
        }
        let (bytes, scales) = if fp8 { (n, heads) } else { (2 * n, 1) };
        fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
            stream: &Arc<CudaStream>,
            n: usize,
        ) -> Result<CudaSlice<T>, DeviceError> {
            stream
                .alloc_zeros::<T>(n.max(1))
                .map_err(|e| DeviceError::OutOfMemory {
                    device: DEV,
                    bytes: n * std::mem::size_of::<T>(),
                    what: format!("KV cache ({e:?})"),
                })
        }
        let mut kv = CudaKv {
            layout: *layout,
            k: Vec::with_capacity(layout.num_layers),
            v: Vec::with_capacity(layout.num_layers),
            k_scale: Vec::with_capacity(layout.num_layers),
            v_scale: Vec::with_capacity(layout.num_layers),
            graphs: None,
        };
        for _ in 0..layout.num_layers {
            kv.k.push(zeros(&self.stream, bytes)?);
            kv.v.push(zeros(&self.stream, bytes)?);
            kv.k_scale.push(zeros(&self.stream, scales)?);
            kv.v_scale.push(zeros(&self.stream, scales)?);
        }
        Ok(kv)
    }

    fn prepare_batch(&self, batch: &ForwardBatch) -> Result<CudaBatch, DeviceError> {
        let n = batch.num_tokens();
        let max_blocks = batch
            .seqs
            .iter()
            .map(|s| s.block_table.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let mut tables = vec![0u32; batch.seqs.len().max(1) * max_blocks];
        for (i, s) in batch.seqs.iter().enumerate() {
            tables[i * max_blocks..i * max_blocks + s.block_table.len()]
                .copy_from_slice(&s.block_table);
        }
        let (mut tseq, mut tstart, mut tlen) = (Vec::new(), Vec::new(), Vec::new());
        for (i, s) in batch.seqs.iter().enumerate() {
            let mut off = 0;
            while off < s.query_len {
                let len = (s.query_len - off).min(ATT_TQ);
                tseq.push(i as u32);
                tstart.push((s.query_start + off) as u32);
                tlen.push(len as u32);
                off += len;
            }
        }
        let max_ctx = batch.seqs.iter().map(|s| s.context_len).max().unwrap_or(0);
        Ok(CudaBatch {
            tile_seq: self.htod_u32(&tseq)?,
            tile_start: self.htod_u32(&tstart)?,
            tile_len: self.htod_u32(&tlen)?,
            num_tiles: tseq.len(),
            tile_lens: tlen.clone(),
            max_ctx,
            n,
            ids: self.htod_u32(&batch.token_ids)?,
            pos: self.htod_u32(&batch.positions)?,
            slots: self.htod_u32(&batch.slot_mapping)?,
            block_tables: self.htod_u32(&tables)?,
            max_blocks,
            logit_rows: self.htod_u32(&batch.logit_rows)?,
            num_logit_rows: batch.logit_rows.len(),
            block_size: self.block_size,
        })
    }

    fn embed(&self, table: &CudaTensor, b: &CudaBatch) -> Result<CudaTensor, DeviceError> {
        self.timed("embed", || {
            let cols = table.cols;
            let mut out = self.alloc_f32(b.n * cols, "embedding")?;
            if b.n > 0 {
                let w = table.bf16("embed")?;
                let c = cols as i32;
                let mut l = self.stream.launch_builder(&self.k.embed);
                l.arg(&b.ids).arg(w).arg(&mut out).arg(&c);
                // SAFETY: embed_bf16(u32 ids[n], bf16 table[vocab, cols], f32 out[n, cols], int cols);
                // ids were validated against the vocabulary by the runner.
                unsafe { l.launch(Self::rows_config(b.n, 256)) }.map_err(op_err("embed"))?;
            }
            Ok(CudaTensor {
                rows: b.n,
                cols,
                buf: CudaBuf::F32(out),
            })
        })
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
                let c = x.cols as i32;
                let mut l = self.stream.launch_builder(&self.k.rms_norm);
                l.arg(x.f32("rms_norm")?)
                    .arg(w.bf16("rms_norm")?)
                    .arg(&mut out)
                    .arg(&c)
                    .arg(&eps);
                // SAFETY: rms_norm_bf16(f32 x[rows, cols], bf16 w[cols], bf16 out[rows, cols], int, float).
                unsafe { l.launch(Self::norm_config(x.rows, x.cols)) }
                    .map_err(op_err("rms_norm"))?;
            }
            Ok(CudaTensor {
                rows: x.rows,
                cols: x.cols,
                buf: CudaBuf::Bf16(out),
            })
        })
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaTensor,
        delta: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, DeviceError> {
        self.timed("add_rms_norm", || {
            let (rows, cols) = (residual.rows, residual.cols);
            let mut out = self.alloc_bf16(rows * cols, "add_rms_norm")?;
            if rows > 0 {
                let c = cols as i32;
                let d = delta.bf16("add_rms_norm")?;
                let wv = w.bf16("add_rms_norm")?;
                let CudaBuf::F32(r) = &mut residual.buf else {
                    return Err(DeviceError::Op {
                        device: DEV,
                        op: "add_rms_norm",
                        msg: "residual must be f32".into(),
                    });
                };
                let mut l = self.stream.launch_builder(&self.k.add_rms_norm);
                l.arg(r).arg(d).arg(wv).arg(&mut out).arg(&c).arg(&eps);
                // SAFETY: add_rms_norm_bf16(f32 residual[rows, cols], bf16 delta[rows, cols], bf16 w[cols],
                // bf16 out[rows, cols], int cols, float eps).
                unsafe { l.launch(Self::norm_config(rows, cols)) }
                    .map_err(op_err("add_rms_norm"))?;
            }
            Ok(CudaTensor {
                rows,
                cols,
                buf: CudaBuf::Bf16(out),
            })
        })
    }

    fn linear(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor, DeviceError> {
        match self.gemv_variant(x.rows, x.cols) {
            Some(v) if x.cols == w.cols => self.timed("gemv", || self.gemv(x, w, v)),
            _ => self.timed(if x.rows == 1 { "gemm (1 row)" } else { "gemm" }, || {
                self.gemm(x, w, false)
            }),
        }
    }

    fn norm_linear(
        &self,
        residual: &mut CudaTensor,
        delta: Option<&CudaTensor>,
        norm: &CudaTensor,
        eps: f32,
        w: &CudaTensor,
    ) -> Result<CudaTensor, DeviceError> {
        self.norm_projection(residual, delta, norm, eps, w, false)
    }

    fn norm_swiglu(
        &self,
        residual: &mut CudaTensor,
        delta: Option<&CudaTensor>,
        norm: &CudaTensor,
        eps: f32,
        gate_up: &CudaTensor,
    ) -> Result<CudaTensor, DeviceError> {
        self.norm_projection(residual, delta, norm, eps, gate_up, true)
    }

    fn lm_head(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor, DeviceError> {
        self.timed("gemm lm_head", || self.gemm(x, w, true))
    }

    fn attention(
        &self,
        qkv: &mut CudaTensor,
        rope: &CudaTensor,
        kv: &mut CudaKv,
        layer: usize,
        b: &CudaBatch,
        p: &AttnParams,
    ) -> Result<CudaTensor, DeviceError> {
        let fp8 = kv.layout.dtype == KvCacheDtype::Fp8E4m3;
        let fused = self.fuses_rope(b, p, fp8);
        if !fused {
            self.rope_and_cache(qkv, rope, kv, layer, b, p)?;
        }
        self.timed("attention", || {
            let d = p.head_dim;
            let mut out = self.alloc_bf16(b.n * p.num_heads * d, "attention")?;
            if b.n == 0 {
                return Ok(CudaTensor {
                    rows: 0,
                    cols: p.num_heads * d,
                    buf: CudaBuf::Bf16(out),
                });
            }
            if d > ATT_MAXD {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "attention",
                    msg: format!("head_dim {d} > {ATT_MAXD}"),
                });
            }
            let mma = self.mma_attention(d, fp8);
            // Work units: the tensor-core kernel serves a GQA group per block (rows = tokens × group),
            // the CUDA-core kernel one q head per block (rows = tokens).
            let group = p.num_heads / p.num_kv_heads;
            if mma.is_some() && group > MMA_ROWS {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "attention",
                    msg: format!("GQA group {group} > {MMA_ROWS}"),
                });
            }
            let (sub_tokens, units_per_tile, grid_y, unit_rows) = match mma {
                Some(_) => {
                    // Units of `sub` tokens, as many per tile as its longest tile needs (one for
                    // a decode step), so no block is launched only to find no tokens.
                    let sub = mma_sub_tokens(group);
                    let longest = b.longest_tile().max(1);
                    (sub, longest.div_ceil(sub).max(1), p.num_kv_heads, MMA_ROWS)
                }
                None => (ATT_TQ, 1, p.num_heads, ATT_TQ),
            };
            let units = b.num_tiles * units_per_tile;
            // Split long key ranges over more blocks when too few blocks have work (decode); prefill-sized
            // batches run unsplit.
            let busy: usize = b
                .tile_lens
                .iter()
                .map(|&l| (l as usize).div_ceil(sub_tokens))
                .sum::<usize>()
                * grid_y;
            // As many splits as fill SPLIT_WAVES waves of blocks (the tensor-core kernels run 3
            // blocks per SM, the CUDA-core one 2) when every unit is a sequence's whole step
            // (decode, verification): each attends over its full range. Units of a longer prompt
            // attend over causal triangles and their partials cost a round trip: one wave (a
            // 512-token prefill ran 23 ms split three ways, 14 ms unsplit).
            let wave = self.sms * if mma.is_some() { MMA_BLOCKS_PER_SM } else { 2 };
            let waves = if b.one_unit_per_sequence(sub_tokens) {
                self.split.2
            } else {
                1
            };
            let want = (wave * waves / busy.max(1)).max(1);
            let max_splits = b.max_ctx.div_ceil(self.split.0).max(1);
            let splits = want.clamp(1, max_splits.min(self.split.1));
            // The CUDA-core kernel needs whole key tiles per split; the tensor-core one masks
            // any range.
            let step = if mma.is_some() { self.split.3 } else { ATT_TK };
            let split_len = b.max_ctx.div_ceil(splits).div_ceil(step) * step;
            let splits = b.max_ctx.div_ceil(split_len.max(1)).max(1);
            let part_rows = if splits > 1 {
                units * grid_y * splits * unit_rows
            } else {
                1
            };
            let mut part_o = self.alloc_f32(
                if splits > 1 { part_rows * d } else { 1 },
                "attention splits",
            )?;
            let mut part_ml = self.alloc_f32(
                if splits > 1 { part_rows * 2 } else { 1 },
                "attention splits",
            )?;
            let (nh, nkv, di) = (p.num_heads as i32, p.num_kv_heads as i32, d as i32);
            let (mb, bs, sl) = (b.max_blocks as i32, b.block_size as i32, split_len as i32);
            let (gi, sti, upti) = (group as i32, sub_tokens as i32, units_per_tile as i32);
            let fi = fused as i32;
            // Combine rows: token × group for the tensor-core kernel, token alone for the CUDA-core one.
            let shape = CombineShape {
                units,
                grid_y,
                splits,
                group: if mma.is_some() { group } else { 1 },
                sub_tokens,
                units_per_tile,
                unit_rows,
            };
            let (func, cfg) = match mma {
                Some(f) => (
                    f,
                    LaunchConfig {
                        grid_dim: (units as u32, grid_y as u32, splits as u32),
                        block_dim: (MMA_THREADS, 1, 1),
                        shared_mem_bytes: if fp8 {
                            mma_fp8_smem_bytes(d)
                        } else {
                            mma_smem_bytes(d)
                        },
                    },
                ),
                None => (
                    if fp8 {
                        &self.k.attention_fp8
                    } else {
                        &self.k.attention
                    },
                    LaunchConfig {
                        grid_dim: (b.num_tiles as u32, p.num_heads as u32, splits as u32),
                        block_dim: (ATT_THREADS, 1, 1),
                        shared_mem_bytes: attention_smem_bytes(d),
                    },
                ),
            };
            let mut l = self.stream.launch_builder(func);
            l.arg(qkv.bf16("attention")?)
                .arg(&mut kv.k[layer])
                .arg(&mut kv.v[layer])
                .arg(&mut kv.k_scale[layer])
                .arg(&mut kv.v_scale[layer])
                .arg(&b.pos)
                .arg(&b.tile_seq)
                .arg(&b.tile_start)
                .arg(&b.tile_len)
                .arg(&b.block_tables)
                .arg(&mb)
                .arg(&mut out)
                .arg(&mut part_o)
                .arg(&mut part_ml)
                .arg(&nh)
                .arg(&nkv)
                .arg(&di)
                .arg(&bs)
                .arg(&p.scale)
                .arg(&sl)
                .arg(&gi)
                .arg(&sti)
                .arg(&upti)
                .arg(rope.f32("rope")?)
                .arg(&b.slots)
                .arg(&fi);
            // SAFETY: every attention kernel takes this argument list (attention.cu / attention_mma.cu), the
            // _fp8 ones chosen exactly for an FP8 cache (codes + scales allocated by alloc_kv): tiles cover
            // the batch's tokens within their sequences, block tables cover every position (validated by
            // the runner), split buffers hold units × grid_y × splits × unit_rows rows, shared memory is
            // sized for d, the tensor-core kernel only for its own d (the match above) and group ≤ 64;
            // `fused` only where fuses_rope allows it (each sequence one unit), with the
            // rope table (max_pos × d, positions validated by the runner) and one slot per token.
            unsafe { l.launch(cfg) }.map_err(op_err("attention"))?;
            self.finish_attention(out, part_o, part_ml, b, p, shape)
        })
    }

    fn silu_mul(&self, gu: &CudaTensor) -> Result<CudaTensor, DeviceError> {
        self.timed("silu_mul", || {
            let i = gu.cols / 2;
            let mut out = self.alloc_bf16(gu.rows * i, "silu_mul")?;
            let total = gu.rows * i;
            let ii = i as i32;
            if total > 0 && i.is_multiple_of(8) && total / 8 < u32::MAX as usize {
                let total8 = (total / 8) as u32;
                let mut l = self.stream.launch_builder(&self.k.silu_mul_x8);
                l.arg(gu.bf16("silu_mul")?)
                    .arg(&mut out)
                    .arg(&ii)
                    .arg(&total8);
                let cfg = LaunchConfig {
                    grid_dim: (total8.div_ceil(256).min(8192), 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: silu_mul_bf16x8(bf16 gu[n, 2i], bf16 out[n, i], int i, u32 n·i/8) with
                // i % 8 == 0 and both buffers whole allocations (16-byte aligned).
                unsafe { l.launch(cfg) }.map_err(op_err("silu_mul"))?;
            } else if total > 0 {
                let total = total as u64;
                let mut l = self.stream.launch_builder(&self.k.silu_mul);
                l.arg(gu.bf16("silu_mul")?)
                    .arg(&mut out)
                    .arg(&ii)
                    .arg(&total);
                let blocks = total.div_ceil(256).min(4096) as u32;
                let cfg = LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: silu_mul_bf16(bf16 gu[n, 2i], bf16 out[n, i], int i, u64 n·i).
                unsafe { l.launch(cfg) }.map_err(op_err("silu_mul"))?;
            }
            Ok(CudaTensor {
                rows: gu.rows,
                cols: i,
                buf: CudaBuf::Bf16(out),
            })
        })
    }

    fn gather_logit_rows(&self, x: &CudaTensor, b: &CudaBatch) -> Result<CudaTensor, DeviceError> {
        self.timed("gather_rows", || {
            let m = b.num_logit_rows;
            let mut out = self.alloc_bf16(m * x.cols, "gather")?;
            if m > 0 {
                let c = x.cols as i32;
                let mut l = self.stream.launch_builder(&self.k.gather_rows);
                l.arg(&b.logit_rows)
                    .arg(x.bf16("gather")?)
                    .arg(&mut out)
                    .arg(&c);
                // SAFETY: gather_rows_bf16(u32 rows[m], bf16 x[n, cols], bf16 out[m, cols], int cols);
                // rows < n (validated by the runner).
                unsafe { l.launch(Self::rows_config(m, 256)) }.map_err(op_err("gather"))?;
            }
            Ok(CudaTensor {
                rows: m,
                cols: x.cols,
                buf: CudaBuf::Bf16(out),
            })
        })
    }

    fn to_host(&self, t: &CudaTensor) -> Result<Vec<f32>, DeviceError> {
        let n = t.rows * t.cols;
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
                    .map(|x| bf16::from_bits(x).to_f32())
                    .collect())
            }
        }
    }

    fn sample(
        &self,
        logits: &CudaTensor,
        rows: &[super::RowSampling],
    ) -> Result<Option<Vec<u32>>, DeviceError> {
        self.timed("sample", || {
            let n = logits.rows;
            if n == 0 {
                return Ok(Some(Vec::new()));
            }
            let vocab = logits.cols as i32;
            let params = self.htod_u32(&super::RowSampling::to_words(rows))?;
            let any_random = rows.iter().any(|r| r.temperature > 0.0 && r.top_k != 1);
            let mut scratch =
                self.alloc_f32(if any_random { n * logits.cols } else { 1 }, "sampling")?;
            let mut ids = self.htod_u32(&vec![0u32; n])?;
            let mut l = self.stream.launch_builder(&self.k.sample);
            l.arg(logits.f32("sample")?)
                .arg(&params)
                .arg(&mut scratch)
                .arg(&mut ids)
                .arg(&vocab);
            let cfg = LaunchConfig {
                grid_dim: (n as u32, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: sample_f32(f32 logits[rows, vocab], RowParams params[rows] (8 words each, the
            // layout of RowSampling), f32 scratch[rows, vocab] when any row samples, u32 out[rows], int).
            unsafe { l.launch(cfg) }.map_err(op_err("sample"))?;
            Ok(Some(
                self.stream
                    .clone_dtoh(&ids)
                    .map_err(op_err("download tokens"))?,
            ))
        })
    }

    fn samples_on_device(&self) -> bool {
        true
    }

    fn set_profiling(&self, on: bool) {
        self.profiling.set(on);
        self.events.borrow_mut().clear();
    }

    fn take_profile(&self) -> Result<Vec<(String, f64, usize)>, DeviceError> {
        self.synchronize()?;
        let mut by_op: std::collections::BTreeMap<&'static str, (f64, usize)> = Default::default();
        for (op, start, end) in self.events.borrow_mut().drain(..) {
            let ms = start.elapsed_ms(&end).map_err(op_err("event timing"))? as f64;
            let e = by_op.entry(op).or_default();
            e.0 += ms;
            e.1 += 1;
        }
        let mut v: Vec<(String, f64, usize)> = by_op
            .into_iter()
            .map(|(k, (ms, n))| (k.to_string(), ms, n))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(v)
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.ctx.mem_get_info().ok()
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.stream.synchronize().map_err(op_err("synchronize"))
    }

    fn calibrate(&self) -> Result<Option<super::Calibration>, DeviceError> {
        Ok(Some(super::Calibration {
            copy_bytes_per_s: self.measure_copy_bandwidth(4 << 30)?,
            gemm_flops: self.measure_gemm_flops(8192)?,
        }))
    }

    fn capture_decode_graphs(
        &self,
        kv: &mut CudaKv,
        shapes: &super::GraphShapes,
        max_len: usize,
        vocab: usize,
        body: &mut super::ForwardBody<'_, Self>,
    ) -> Result<Option<super::GraphReport>, crate::error::EngineError> {
        self.capture_all(kv, shapes, max_len, vocab, body)
    }

    fn forward_graphed(
        &self,
        kv: &mut CudaKv,
        batch: &ForwardBatch,
        body: &mut super::ForwardBody<'_, Self>,
    ) -> Result<Option<CudaTensor>, crate::error::EngineError> {
        self.replay(kv, batch, body)
    }

    fn set_graphs_enabled(&self, kv: &mut CudaKv, on: bool) -> bool {
        match &mut kv.graphs {
            Some(g) => {
                g.enabled = on;
                true
            }
            None => false,
        }
    }
}
