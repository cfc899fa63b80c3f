//! One typed launch function per kernel: the only `unsafe` kernel launches of the device. Each
//! takes the kernel's arguments with their device types and shapes (as documented on the kernel
//! in `kernels/`), checks what the kernel cannot, and says in its `SAFETY:` line why the launch
//! is sound. Everything above this file is safe code.

use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaView, CudaViewMut, DriverError, LaunchArgs,
    LaunchConfig, PushKernelArg,
};

use super::kernels::{
    mma_threads, ATT_THREADS, COMBINE_ELEMS, COMBINE_THREADS, GEMV_ROWS, GEMV_SMEM_MAX,
    GEMV_THREADS, MOE_BK, MOE_BK8, MOE_BMS, MOE_BN, MOE_MAX_EXPERTS, MOE_MAX_K, MOE_THREADS,
};
use super::programmatic;
use super::tensor::WeightRef;
use super::{op_err, CudaDevice};
use crate::config::Activation;
use crate::error::DeviceError;

/// Threads of a token-selection block (`SAMPLE_THREADS` / `LOGPROB_THREADS` in sampling.cu).
const SAMPLE_THREADS: u32 = 512;

/// Entries of the expert-sorted pair list of `pairs` pairs over `e` experts: every expert's run
/// padded to whole `bm`-row tiles.
pub(super) fn moe_sorted_capacity(pairs: usize, e: usize, bm: usize) -> usize {
    (pairs + e * (bm - 1)).div_ceil(bm) * bm
}

/// The bf16 FP8 epilogues' grid (`fp8_scale_bf16_bf16*`, `fp8_scale_{act}_bf16`): eight columns
/// a thread, 256 threads a block (gemv.cu's FP8_SCALE_THREADS), a row of blocks per token.
fn fp8_scale_config(n: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (cols.div_ceil(8 * 256) as u32, n as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The pairs of a step sorted by expert into tiles of `bm` rows (moe_sort's outputs).
/// Where a fused norm + GEMV writes: bf16 products, or (a MoE router over the layer's input) f32
/// logits and the normalised rows, which the experts then read.
pub(super) enum NormGemvOut<'a> {
    Bf16(&'a mut CudaSlice<u16>),
    Router {
        logits: &'a mut CudaSlice<f32>,
        xs: &'a mut CudaSlice<u16>,
    },
}

/// A grouped GEMM's input rows: bf16, or e4m3 codes with a scale a row (the FP8 × FP8 kernel).
#[derive(Clone, Copy)]
pub(super) enum MoeInput<'a> {
    Bf16(&'a CudaSlice<u16>),
    E4m3 {
        codes: &'a CudaSlice<u8>,
        scales: &'a CudaSlice<f32>,
    },
}

pub(super) struct MoeGroups {
    pub bm: usize,
    pub sorted: CudaSlice<i32>,
    pub tile_expert: CudaSlice<i32>,
    pub num_tiles: CudaSlice<i32>,
}

/// What an f32-output GEMV of instantiation `v` needs: rows ≤ R, k a multiple of one 16-byte
/// load of bf16, w [n, k], x [rows, k] and y [rows, n].
fn gemv_f32out_fits(
    op: &'static str,
    v: usize,
    (w, x, y): (usize, usize, usize),
    (rows, k, n): (usize, usize, usize),
) -> Result<(), DeviceError> {
    if rows > GEMV_ROWS[v] || !k.is_multiple_of(8) {
        return Err(unfit(op, rows, GEMV_ROWS[v], k));
    }
    if w < n * k || x < rows * k || y < rows * n {
        return Err(short_buffers(op, rows, n));
    }
    Ok(())
}

/// What routing n tokens over e experts needs: e ≤ MOE_MAX_EXPERTS, 1 ≤ k ≤ e, logits [n, e],
/// ids and weights [n, k].
fn routable(
    op: &'static str,
    (logits, ids, weights): (usize, usize, usize),
    (n, e, k): (usize, usize, usize),
) -> Result<(), DeviceError> {
    if e > MOE_MAX_EXPERTS || k == 0 || k > e {
        return Err(DeviceError::Op {
            device: super::DEV,
            op,
            msg: format!("{k} of {e} experts (at most {MOE_MAX_EXPERTS} experts)"),
        });
    }
    if logits < n * e || ids < n * k || weights < n * k {
        return Err(short_buffers(op, n, e));
    }
    Ok(())
}

/// A launch of one block per row.
fn rows_config(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A row-normalisation launch: one block per row, threads enough that each keeps at most
/// RMS_PER_THREAD (rms_norm.cu) elements in registers.
fn norm_config(rows: usize, cols: usize) -> LaunchConfig {
    let threads = (cols.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32;
    rows_config(rows, threads)
}

/// A GEMV asked for a shape its instantiation cannot take (a bug of the caller's choice).
fn unfit(op: &'static str, rows: usize, max_rows: usize, k: usize) -> DeviceError {
    DeviceError::Op {
        device: super::DEV,
        op,
        msg: format!("{rows} rows of {k} features do not fit the {max_rows}-row instantiation (k must be a multiple of 8 for bf16 weights and 16 for FP8, R·k·2 bytes within its shared memory)"),
    }
}

fn short_buffers(op: &'static str, n: usize, k: usize) -> DeviceError {
    DeviceError::Op {
        device: super::DEV,
        op,
        msg: format!("buffers smaller than {n} rows of {k}"),
    }
}

/// The KV cache of one layer as the attention and RoPE kernels take it.
pub(super) struct LayerKv<'a> {
    pub k: &'a mut CudaSlice<u8>,
    pub v: &'a mut CudaSlice<u8>,
    pub k_scale: &'a mut CudaSlice<f32>,
    pub v_scale: &'a mut CudaSlice<f32>,
    /// The INT8 cache's table of this layer (unread for other dtypes).
    pub table: &'a CudaSlice<f32>,
}

/// The arguments every attention kernel takes (attention.cu / attention_mma.cu).
pub(super) struct AttentionArgs<'a> {
    /// bf16 `[n, (nh + 2·nkv)·d]`.
    pub qkv: &'a CudaSlice<u16>,
    pub kv: LayerKv<'a>,
    /// u32 `[n]` positions, and per tile: sequence, first token, length.
    pub pos: &'a CudaSlice<u32>,
    pub tile_seq: &'a CudaSlice<u32>,
    pub tile_start: &'a CudaSlice<u32>,
    pub tile_len: &'a CudaSlice<u32>,
    /// u32 `[seqs, max_blocks]`.
    pub block_tables: &'a CudaSlice<u32>,
    pub max_blocks: i32,
    /// bf16 `[n, nh·d]`.
    pub out: &'a mut CudaSlice<u16>,
    /// f32 `[part_rows, d]` and `[part_rows, 2]` when split, one-element placeholders otherwise.
    pub part_o: &'a mut CudaSlice<f32>,
    pub part_ml: &'a mut CudaSlice<f32>,
    pub num_heads: i32,
    pub num_kv_heads: i32,
    pub head_dim: i32,
    pub block_size: i32,
    pub scale: f32,
    pub split_len: i32,
    pub group: i32,
    pub sub_tokens: i32,
    pub units_per_tile: i32,
    /// f32 `[max_pos, d]` cos|sin, and u32 `[n]` slots: read when `fused` bit 0 is set.
    pub rope: &'a CudaSlice<f32>,
    pub slots: &'a CudaSlice<u32>,
    /// Bit 0: the fused rope + cache write; bit 1 (tensor-core kernel): the grid is (kv heads,
    /// units, splits).
    pub fused: i32,
    /// Keys a query sees in a sliding-window layer (0: all).
    pub window: i32,
    /// The q and k heads' RMSNorm weights (bf16 `[d]` each) and eps: read when `fused` is 1.
    pub qk_norm: QkNorm<'a>,
}

/// The q and k head-norm weights of a model that has them, with their eps.
pub(super) type QkNorm<'a> = Option<(&'a CudaSlice<u16>, &'a CudaSlice<u16>, f32)>;

/// The arguments of `attention_combine_bf16`.
pub(super) struct CombineArgs<'a> {
    pub part_o: &'a CudaSlice<f32>,
    pub part_ml: &'a CudaSlice<f32>,
    pub tile_start: &'a CudaSlice<u32>,
    pub tile_len: &'a CudaSlice<u32>,
    pub out: &'a mut CudaSlice<u16>,
    pub num_heads: i32,
    pub head_dim: i32,
    pub splits: i32,
    pub group: i32,
    pub sub_tokens: i32,
    pub units_per_tile: i32,
    pub unit_rows: i32,
}

impl CudaDevice {
    /// Enqueues one of our kernels. While a decode graph is being captured with programmatic
    /// dependent launch on, the edge from the kernel before it (when that is one of ours too)
    /// is made programmatic first (programmatic.rs); a driver that refuses turns it off.
    ///
    /// # Safety
    /// As `LaunchArgs::launch`: the arguments match the kernel's parameters.
    pub(super) unsafe fn enqueue(
        &self,
        l: &mut LaunchArgs<'_>,
        cfg: LaunchConfig,
    ) -> Result<Option<(CudaEvent, CudaEvent)>, DriverError> {
        // Edges exist only in a capture; eager launches skip all of it.
        if self.capturing.get() && self.pdl.get() {
            // SAFETY: our stream; every kernel of ours starts with wait_for_prior_kernels()
            // (kernels/src/lib.rs tests it).
            match unsafe { programmatic::programmatic_edge(self.stream.cu_stream(), self.ours) } {
                Ok(made) => self.pdl_edges.set(self.pdl_edges.get() + made as usize),
                Err(e) => {
                    tracing::warn!(error = %e, "programmatic graph edges refused; plain edges from now on");
                    self.pdl.set(false);
                }
            }
        }
        // SAFETY: the caller's.
        unsafe { l.launch(cfg) }
    }

    /// `embed_bf16(u32 ids[n], bf16 table[vocab, cols], f32 out[n, cols], int cols, float scale)`.
    pub(super) fn launch_embed(
        &self,
        ids: &CudaSlice<u32>,
        table: &CudaSlice<u16>,
        out: &mut CudaSlice<f32>,
        (n, cols): (usize, usize),
        scale: f32,
        (first, rows): (usize, usize),
    ) -> Result<(), DeviceError> {
        let (c, first, rows) = (cols as i32, first as u32, rows as u32);
        let mut l = self.stream.launch_builder(&self.k.embed);
        l.arg(ids).arg(table).arg(out).arg(&c).arg(&scale);
        l.arg(&first).arg(&rows);
        // SAFETY: `out` holds n × cols f32, `table` rows × cols bf16; an id outside
        // [first, first + rows) reads nothing (its row is zeros).
        unsafe { self.enqueue(&mut l, rows_config(n, 256)) }.map_err(op_err("embed"))?;
        Ok(())
    }

    /// `rms_norm_bf16(f32 x[rows, cols], bf16 w[cols], bf16 out[rows, cols], int, float)`.
    pub(super) fn launch_rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<u16>,
        out: &mut CudaSlice<u16>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<(), DeviceError> {
        let c = cols as i32;
        let mut l = self.stream.launch_builder(&self.k.rms_norm);
        l.arg(x).arg(w).arg(out).arg(&c).arg(&eps);
        // SAFETY: x and out hold rows × cols elements, w cols; one block per row.
        unsafe { self.enqueue(&mut l, norm_config(rows, cols)) }.map_err(op_err("rms_norm"))?;
        Ok(())
    }

    /// `add_bias_bf16(bf16 x[n, cols] (in/out), bf16 bias[cols], int cols, u64 n·cols)`.
    pub(super) fn launch_add_bias(
        &self,
        x: &mut CudaSlice<u16>,
        bias: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
    ) -> Result<(), DeviceError> {
        let (c, total) = (cols as i32, (rows * cols) as u64);
        let mut l = self.stream.launch_builder(&self.k.add_bias);
        l.arg(x).arg(bias).arg(&c).arg(&total);
        let cfg = LaunchConfig {
            grid_dim: (total.div_ceil(256).min(4096) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x holds rows × cols elements, bias cols; grid-stride loop.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("add_bias"))?;
        Ok(())
    }

    /// `add_rms_norm_bf16(f32 residual[rows, cols] (in/out), bf16 delta[rows, cols], bf16
    /// delta_w[cols] or null, bf16 w[cols], bf16 out[rows, cols], int cols, float eps, f32
    /// delta_ws[cols] or null, f32 delta_xs[rows] or null)`; an unscaled FP8 delta's scales only
    /// for rows the kernel holds in registers (cols ≤ [`super::gemm::FP8_NORM_MAX_COLS`]).
    pub(super) fn launch_add_rms_norm(
        &self,
        residual: &mut CudaSlice<f32>,
        delta: super::gemv::DeltaSlices<'_>,
        w: &CudaSlice<u16>,
        out: &mut CudaSlice<u16>,
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<(), DeviceError> {
        let short = residual.len() < rows * cols
            || delta.short(rows, cols)
            || w.len() < cols
            || out.len() < rows * cols;
        if short {
            return Err(short_buffers("add_rms_norm", rows, cols));
        }
        if delta.scales.is_some() && cols > super::gemm::FP8_NORM_MAX_COLS {
            return Err(DeviceError::Op {
                device: super::DEV,
                op: "add_rms_norm",
                msg: format!(
                    "an unscaled FP8 delta of {cols} columns (at most {})",
                    super::gemm::FP8_NORM_MAX_COLS
                ),
            });
        }
        let c = cols as i32;
        let null = 0u64;
        let mut l = self.stream.launch_builder(&self.k.add_rms_norm);
        l.arg(residual).arg(delta.x);
        match delta.norm {
            Some(dw) => l.arg(dw),
            None => l.arg(&null),
        };
        l.arg(w).arg(out).arg(&c).arg(&eps);
        match delta.scales {
            Some((ws, xs)) => l.arg(ws).arg(xs),
            None => l.arg(&null).arg(&null),
        };
        // SAFETY: the buffers hold what the kernel reads and writes (checked above); each block
        // reads and writes only its own row of the residual; scales only where norm_config's
        // threads hold a row in registers.
        unsafe { self.enqueue(&mut l, norm_config(rows, cols)) }.map_err(op_err("add_rms_norm"))?;
        Ok(())
    }

    /// `rope_kv_{bf16,fp8}(bf16 qkv[n, (nh+2nkv)d], f32 rope[max_pos, d], u32 pos[n], u32 slots[n],
    /// k_cache[slots, nkv, d], v_cache[slots, nkv, d], f32 k_scale[slots, nkv], f32
    /// v_scale[slots, nkv], int nh, int nkv, int d, bf16 q_norm[d] or null, bf16 k_norm[d] or
    /// null, float eps)`: `func` is the kernel for the cache's dtype.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_rope_kv(
        &self,
        func: &CudaFunction,
        qkv: &mut CudaSlice<u16>,
        rope: &CudaSlice<f32>,
        pos: &CudaSlice<u32>,
        slots: &CudaSlice<u32>,
        kv: LayerKv<'_>,
        n: usize,
        (nh, nkv, d): (usize, usize, usize),
        qk_norm: QkNorm<'_>,
    ) -> Result<(), DeviceError> {
        let (nhi, nkvi, di) = (nh as i32, nkv as i32, d as i32);
        let mut l = self.stream.launch_builder(func);
        l.arg(qkv)
            .arg(rope)
            .arg(pos)
            .arg(slots)
            .arg(kv.k)
            .arg(kv.v)
            .arg(kv.k_scale)
            .arg(kv.v_scale)
            .arg(&nhi)
            .arg(&nkvi)
            .arg(&di);
        let (null, mut eps) = (0u64, 0f32);
        match qk_norm {
            Some((q, k, e)) => {
                eps = e;
                l.arg(q).arg(k)
            }
            None => l.arg(&null).arg(&null),
        };
        l.arg(&eps).arg(kv.table);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, (nh + nkv) as u32, 1),
            block_dim: ((d / 2) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: grid (n, nh + nkv), block d/2 (d even, checked by the config; the device caps it
        // at 256, so at most 128 threads, as the head norm's reduction needs); the norm weights
        // hold d elements each; the cache buffers are the layer's, allocated for the layout's
        // dtype with the kernel chosen for it; positions are below max_pos and slots inside the
        // cache or the padding mark (validated by the runner).
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("rope_kv"))?;
        Ok(())
    }

    /// One attention kernel (`func`: paged_attention_{bf16,fp8} or paged_attention_mma_d{64,128}_
    /// {bf16,fp8}) over `grid` with `shared` bytes of dynamic shared memory.
    pub(super) fn launch_attention(
        &self,
        func: &CudaFunction,
        a: AttentionArgs<'_>,
        grid: (usize, usize, usize),
        tensor_cores: bool,
        shared: u32,
    ) -> Result<(), DeviceError> {
        let mut l = self.stream.launch_builder(func);
        l.arg(a.qkv)
            .arg(a.kv.k)
            .arg(a.kv.v)
            .arg(a.kv.k_scale)
            .arg(a.kv.v_scale)
            .arg(a.pos)
            .arg(a.tile_seq)
            .arg(a.tile_start)
            .arg(a.tile_len)
            .arg(a.block_tables)
            .arg(&a.max_blocks)
            .arg(a.out)
            .arg(a.part_o)
            .arg(a.part_ml)
            .arg(&a.num_heads)
            .arg(&a.num_kv_heads)
            .arg(&a.head_dim)
            .arg(&a.block_size)
            .arg(&a.scale)
            .arg(&a.split_len)
            .arg(&a.group)
            .arg(&a.sub_tokens)
            .arg(&a.units_per_tile)
            .arg(a.rope)
            .arg(a.slots)
            .arg(&a.fused)
            .arg(&a.window);
        let (null, mut eps) = (0u64, 0f32);
        match a.qk_norm {
            Some((q, k, e)) => {
                eps = e;
                l.arg(q).arg(k)
            }
            None => l.arg(&null).arg(&null),
        };
        l.arg(&eps).arg(a.kv.table);
        let cfg = LaunchConfig {
            grid_dim: (grid.0 as u32, grid.1 as u32, grid.2 as u32),
            block_dim: (
                if tensor_cores {
                    mma_threads(a.head_dim as usize)
                } else {
                    ATT_THREADS
                },
                1,
                1,
            ),
            shared_mem_bytes: shared,
        };
        // SAFETY: every attention kernel takes this argument list, the _fp8 ones chosen exactly
        // for an FP8 cache (codes + scales allocated by alloc_kv): tiles cover the batch's tokens
        // within their sequences, block tables cover every position (validated by the runner),
        // split buffers hold units × grid_y × splits × unit_rows rows (AttentionPlan::part_rows),
        // shared memory is sized for d within the attribute set at load, the tensor-core kernel
        // only for its own d with group ≤ 64 (AttentionPlan::choose); `fused` only where the plan
        // allows it (each sequence one unit), with the rope table (max_pos × d, positions
        // validated by the runner) and one slot per token.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("attention"))?;
        Ok(())
    }

    /// `attention_combine_bf16` over the split buffers an attention launch filled: `units` ×
    /// `grid_y` × blocks enough for `elems` outputs of the fullest unit.
    pub(super) fn launch_combine(
        &self,
        a: CombineArgs<'_>,
        (units, grid_y): (usize, usize),
        elems: usize,
    ) -> Result<(), DeviceError> {
        let mut c = self.stream.launch_builder(&self.k.combine);
        c.arg(a.part_o)
            .arg(a.part_ml)
            .arg(a.tile_start)
            .arg(a.tile_len)
            .arg(a.out)
            .arg(&a.num_heads)
            .arg(&a.head_dim)
            .arg(&a.splits)
            .arg(&a.group)
            .arg(&a.sub_tokens)
            .arg(&a.units_per_tile)
            .arg(&a.unit_rows);
        let cfg = LaunchConfig {
            grid_dim: (
                units as u32,
                grid_y as u32,
                elems.div_ceil(COMBINE_ELEMS) as u32,
            ),
            block_dim: (COMBINE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the split buffers were filled by the attention launch of the same plan
        // (units × grid_y × splits × unit_rows rows); blocks past a unit's outputs return.
        unsafe { self.enqueue(&mut c, cfg) }.map_err(op_err("attention combine"))?;
        Ok(())
    }

    /// `{silu,gelu_tanh}_mul_bf16x8(bf16 gu[n, 2i], bf16 out[n, i], int i, u32 n·i/8)` when
    /// `i % 8 == 0`, else `{silu,gelu_tanh}_mul_bf16(bf16 gu[n, 2i], bf16 out[n, i], int i, u64
    /// n·i)`, for the activation `act`.
    pub(super) fn launch_glu(
        &self,
        act: Activation,
        gu: &CudaSlice<u16>,
        out: &mut CudaSlice<u16>,
        rows: usize,
        i: usize,
    ) -> Result<(), DeviceError> {
        let total = rows * i;
        let ii = i as i32;
        let a = act as usize;
        if i.is_multiple_of(8) && total / 8 < u32::MAX as usize {
            let total8 = (total / 8) as u32;
            let mut l = self.stream.launch_builder(&self.k.glu_x8[a]);
            l.arg(gu).arg(out).arg(&ii).arg(&total8);
            let cfg = LaunchConfig {
                grid_dim: (total8.div_ceil(256).min(8192), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: i % 8 == 0 and both buffers whole allocations (16-byte aligned), holding
            // rows × 2i and rows × i elements.
            unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("glu"))?;
        } else {
            let total = total as u64;
            let mut l = self.stream.launch_builder(&self.k.glu[a]);
            l.arg(gu).arg(out).arg(&ii).arg(&total);
            let cfg = LaunchConfig {
                grid_dim: (total.div_ceil(256).min(4096) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the buffers hold rows × 2i and rows × i elements; grid-stride loop.
            unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("glu"))?;
        }
        Ok(())
    }

    /// `fp8_scale_{silu|gelu_tanh}_bf16(bf16 d[n, 2i], f32 w_scale[2i], f32 x_scale[n],
    /// bf16 out[n, i], int n, int i)`: the FP8 gate|up product scaled and gated in one pass.
    pub(super) fn launch_fp8_scale_glu(
        &self,
        act: Activation,
        d: &CudaSlice<u16>,
        (w_scale, x_scale): (&CudaSlice<f32>, &CudaSlice<f32>),
        out: &mut CudaSlice<u16>,
        (n, i): (usize, usize),
    ) -> Result<(), DeviceError> {
        if d.len() < n * 2 * i || w_scale.len() < 2 * i || x_scale.len() < n || out.len() < n * i {
            return Err(short_buffers("fp8_scale_glu", n, 2 * i));
        }
        if !i.is_multiple_of(8) || n > 65535 {
            return Err(DeviceError::Op {
                device: super::DEV,
                op: "fp8_scale_glu",
                msg: format!("{n} rows of {i}: at most 65,535 rows of a multiple of 8"),
            });
        }
        let (ni, ii) = (n as i32, i as i32);
        let mut l = self
            .stream
            .launch_builder(&self.k.fp8_scale_glu[act as usize]);
        l.arg(d)
            .arg(w_scale)
            .arg(x_scale)
            .arg(out)
            .arg(&ni)
            .arg(&ii);
        let cfg = fp8_scale_config(n, i);
        // SAFETY: d holds n rows of 2i, out n rows of i, the scales 2i and n (checked above),
        // i a multiple of 8 for the 16-byte accesses (fresh allocations, 16-byte aligned);
        // threads past i return.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("fp8_scale_glu"))?;
        Ok(())
    }

    /// `gather_rows_bf16(u32 rows[m], bf16 x[n, cols], bf16 out[m, cols], int cols)`.
    pub(super) fn launch_gather_rows(
        &self,
        rows: &CudaSlice<u32>,
        x: &CudaSlice<u16>,
        out: &mut CudaSlice<u16>,
        m: usize,
        cols: usize,
    ) -> Result<(), DeviceError> {
        let c = cols as i32;
        let mut l = self.stream.launch_builder(&self.k.gather_rows);
        l.arg(rows).arg(x).arg(out).arg(&c);
        // SAFETY: every row index is below n (validated by the runner); out holds m × cols.
        unsafe { self.enqueue(&mut l, rows_config(m, 256)) }.map_err(op_err("gather"))?;
        Ok(())
    }

    /// `fill_normal_bf16(bf16 out[n], u64 n, u64 seed, f32 mean, f32 std, u64 cols, u64
    /// full_cols, u64 offset)`: `out`'s rows of `cols` are taken from a tensor `full_cols` wide
    /// from element `offset` on (`(n, n, 0)`: the whole tensor).
    pub(super) fn launch_fill_normal(
        &self,
        out: &mut CudaViewMut<'_, u16>,
        n: usize,
        seed: u64,
        (mean, std): (f32, f32),
        (cols, full_cols, offset): (usize, usize, usize),
    ) -> Result<(), DeviceError> {
        let (n64, cols, full_cols, offset) =
            (n as u64, cols as u64, full_cols as u64, offset as u64);
        let mut b = self.stream.launch_builder(&self.k.fill_normal);
        b.arg(out).arg(&n64).arg(&seed).arg(&mean).arg(&std);
        b.arg(&cols).arg(&full_cols).arg(&offset);
        let cfg = LaunchConfig {
            grid_dim: (1024, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `out` holds n elements; grid-stride loop.
        unsafe { self.enqueue(&mut b, cfg) }.map_err(op_err("fill_normal"))?;
        Ok(())
    }

    /// `sample_f32(f32 logits[rows, vocab], RowParams params[rows], f32 scratch[rows, vocab] when
    /// any row samples, u32 out[rows], int vocab)`.
    pub(super) fn launch_sample(
        &self,
        logits: &CudaSlice<f32>,
        params: &CudaSlice<u32>,
        scratch: &mut CudaSlice<f32>,
        ids: &mut CudaSlice<u32>,
        (rows, vocab): (usize, usize),
    ) -> Result<(), DeviceError> {
        let v = vocab as i32;
        let mut l = self.stream.launch_builder(&self.k.sample);
        l.arg(logits).arg(params).arg(scratch).arg(ids).arg(&v);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: params holds 8 words a row (the layout of RowSampling); scratch is rows × vocab
        // whenever a row samples (the kernel touches it only then); ids holds rows.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("sample"))?;
        Ok(())
    }

    /// `edit_logits_f32`: the `n` edits `[row, token, pos, neg, add]` (floats as their bits).
    pub(super) fn launch_edit_logits(
        &self,
        logits: &mut CudaSlice<f32>,
        e: [&CudaSlice<u32>; 5],
        n: usize,
        vocab: usize,
    ) -> Result<(), DeviceError> {
        let (n32, v) = (n as i32, vocab as i32);
        let mut l = self.stream.launch_builder(&self.k.edit_logits);
        l.arg(logits)
            .arg(e[0])
            .arg(e[1])
            .arg(e[2])
            .arg(e[3])
            .arg(e[4])
            .arg(&n32)
            .arg(&v);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the five arrays hold n entries each, every (row, token) inside the logits
        // (LogitEdits::validate) and none twice.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("edit_logits"))?;
        Ok(())
    }

    /// `mask_logits_f32`: -inf where a row's grammar mask has no bit.
    pub(super) fn launch_mask_logits(
        &self,
        logits: &mut CudaSlice<f32>,
        rows: &CudaSlice<u32>,
        bits: &CudaSlice<u32>,
        (n, words, vocab): (usize, usize, usize),
    ) -> Result<(), DeviceError> {
        let (w, v) = (words as i32, vocab as i32);
        let mut l = self.stream.launch_builder(&self.k.mask_logits);
        l.arg(logits).arg(rows).arg(bits).arg(&w).arg(&v);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: rows holds n row indices inside the logits (RowMasks::validate), bits n × words
        // with words = ceil(vocab / 32).
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("mask_logits"))?;
        Ok(())
    }

    /// `logprobs_f32`: the chosen token's and the top `want[r]` log-probabilities of each row.
    pub(super) fn launch_logprobs(
        &self,
        logits: &CudaSlice<f32>,
        chosen: &CudaSlice<u32>,
        want: &CudaSlice<u32>,
        lp: &mut CudaSlice<f32>,
        top: &mut CudaSlice<u32>,
        (rows, vocab): (usize, usize),
    ) -> Result<(), DeviceError> {
        let v = vocab as i32;
        let mut l = self.stream.launch_builder(&self.k.logprobs);
        l.arg(logits).arg(chosen).arg(want).arg(lp).arg(top).arg(&v);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: chosen and want hold rows entries, lp rows × 21 and top rows × 20
        // (MAX_TOP_LOGPROBS); chosen ids are inside the vocabulary (the sampler's output).
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("logprobs"))?;
        Ok(())
    }

    fn gemv_config(&self, smem: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.sms as u32, 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        }
    }

    /// `gemv_{bf16|e4m3}_r{R}(w[n, k], f32 w_scale[n] or null, bf16 x[rows, k], bf16 y[rows,
    /// n], int n, int k, int rows)` for the instantiation `v` (R = GEMV_ROWS[v]) and the weights'
    /// format.
    pub(super) fn launch_gemv(
        &self,
        v: usize,
        w: WeightRef<'_>,
        x: &CudaSlice<u16>,
        y: &mut CudaSlice<u16>,
        (rows, k, n): (usize, usize, usize),
    ) -> Result<(), DeviceError> {
        if rows > GEMV_ROWS[v] || !k.is_multiple_of(w.k_multiple()) {
            return Err(unfit("gemv", rows, GEMV_ROWS[v], k));
        }
        let (ni, ki, ri) = (n as i32, k as i32, rows as i32);
        let mut l = self.stream.launch_builder(&self.k.gemv[w.format()][v]);
        let null = 0u64;
        match w {
            WeightRef::Bf16(b) => l.arg(b).arg(&null),
            WeightRef::E4m3 { codes, scales } => l.arg(codes).arg(scales),
        };
        l.arg(x).arg(y).arg(&ni).arg(&ki).arg(&ri);
        // SAFETY: rows ≤ R and k a multiple of one 16-byte load of the format (checked above),
        // fresh 16-byte-aligned allocations, so every row starts 16-byte aligned; e4m3 weights
        // come with their n row scales.
        unsafe { self.enqueue(&mut l, self.gemv_config(0)) }.map_err(op_err("gemv"))?;
        Ok(())
    }

    /// gemv.cu's `gemv_f32out_bf16_r{R}` (instantiation `v`): `y[rows, n] = x · wᵀ` in f32, for
    /// bf16 weights.
    pub(super) fn launch_gemv_f32out(
        &self,
        v: usize,
        w: &CudaSlice<u16>,
        x: &CudaSlice<u16>,
        y: &mut CudaSlice<f32>,
        (rows, k, n): (usize, usize, usize),
    ) -> Result<(), DeviceError> {
        gemv_f32out_fits("gemv_f32out", v, (w.len(), x.len(), y.len()), (rows, k, n))?;
        let (ni, ki, ri) = (n as i32, k as i32, rows as i32);
        let null = 0u64;
        let mut l = self.stream.launch_builder(&self.k.gemv_f32out[v]);
        l.arg(w).arg(&null).arg(x).arg(y).arg(&ni).arg(&ki).arg(&ri);
        // SAFETY: rows ≤ R, k a multiple of one 16-byte load of bf16 and the buffers' sizes
        // (checked above); fresh 16-byte-aligned allocations, so every row starts aligned.
        unsafe { self.enqueue(&mut l, self.gemv_config(0)) }.map_err(op_err("gemv_f32out"))?;
        Ok(())
    }

    /// `moe_route_f32(f32 logits[n, E], i32 ids[n, k], f32 weights[n, k], int n, int E, int k,
    /// int norm)`: a warp per token.
    pub(super) fn launch_moe_route(
        &self,
        logits: &CudaSlice<f32>,
        ids: &mut CudaSlice<i32>,
        weights: &mut CudaSlice<f32>,
        (n, e, k, norm): (usize, usize, usize, bool),
    ) -> Result<(), DeviceError> {
        routable(
            "moe_route",
            (logits.len(), ids.len(), weights.len()),
            (n, e, k),
        )?;
        let (ni, ei, ki, normi) = (n as i32, e as i32, k as i32, i32::from(norm));
        let mut l = self.stream.launch_builder(&self.k.moe_route);
        l.arg(logits)
            .arg(ids)
            .arg(weights)
            .arg(&ni)
            .arg(&ei)
            .arg(&ki)
            .arg(&normi);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: E ≤ MOE_MAX_EXPERTS, 1 ≤ k ≤ E, buffers hold n·E and n·k (checked above).
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("moe_route"))?;
        Ok(())
    }

    /// `moe_gate_up_{fmt}(w[E·2·inter, h], f32 w_scale[E·2·inter] or null, bf16 x[n, h], i32
    /// ids[n·k], bf16 act[n·k, inter], int inter, int h, int k)`. Every id must be < E (the
    /// routing kernel writes them).
    pub(super) fn launch_moe_gate_up(
        &self,
        w: WeightRef<'_>,
        x: &CudaSlice<u16>,
        ids: &CudaSlice<i32>,
        act: &mut CudaSlice<u16>,
        (n, k, inter, h): (usize, usize, usize, usize),
    ) -> Result<(), DeviceError> {
        if !h.is_multiple_of(w.k_multiple()) {
            return Err(unfit("moe_gate_up", 1, 1, h));
        }
        if x.len() < n * h || ids.len() < n * k || act.len() < n * k * inter {
            return Err(short_buffers("moe_gate_up", n * k, inter));
        }
        let (ii, hi, ki) = (inter as i32, h as i32, k as i32);
        let mut l = self.stream.launch_builder(&self.k.moe_gate_up[w.format()]);
        let null = 0u64;
        match w {
            WeightRef::Bf16(b) => l.arg(b).arg(&null),
            WeightRef::E4m3 { codes, scales } => l.arg(codes).arg(scales),
        };
        l.arg(x).arg(ids).arg(act).arg(&ii).arg(&hi).arg(&ki);
        let cfg = LaunchConfig {
            grid_dim: (
                (n * k) as u32,
                inter.div_ceil((MOE_THREADS / 32) as usize) as u32,
                1,
            ),
            block_dim: (MOE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: h a multiple of one 16-byte load of the format, whole (16-byte aligned)
        // allocations, buffer sizes checked above; the expert rows read are those of ids < E,
        // which the routing kernel wrote, into a weight of E·2·inter rows (the caller checks it).
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("moe_gate_up"))?;
        Ok(())
    }

    /// `moe_down_{fmt}(w[E·h, inter], f32 w_scale[E·h] or null, bf16 act[n·k, inter], i32
    /// ids[n·k], f32 weights[n·k], bf16 y[n, h], int h, int inter, int k, int kp)`: kp = k
    /// rounded up to a power of two, MOE_MAX_K warps a block, MOE_MAX_K / kp output rows each.
    pub(super) fn launch_moe_down(
        &self,
        w: WeightRef<'_>,
        act: &CudaSlice<u16>,
        ids: &CudaSlice<i32>,
        weights: &CudaSlice<f32>,
        y: &mut CudaSlice<u16>,
        (n, k, inter, h): (usize, usize, usize, usize),
    ) -> Result<(), DeviceError> {
        if !inter.is_multiple_of(w.k_multiple()) || k == 0 || k > MOE_MAX_K {
            return Err(unfit("moe_down", k, MOE_MAX_K, inter));
        }
        if act.len() < n * k * inter
            || ids.len() < n * k
            || weights.len() < n * k
            || y.len() < n * h
        {
            return Err(short_buffers("moe_down", n, h));
        }
        let kp = k.next_power_of_two();
        let (hi, ii, ki, kpi) = (h as i32, inter as i32, k as i32, kp as i32);
        let mut l = self.stream.launch_builder(&self.k.moe_down[w.format()]);
        let null = 0u64;
        match w {
            WeightRef::Bf16(b) => l.arg(b).arg(&null),
            WeightRef::E4m3 { codes, scales } => l.arg(codes).arg(scales),
        };
        l.arg(act)
            .arg(ids)
            .arg(weights)
            .arg(y)
            .arg(&hi)
            .arg(&ii)
            .arg(&ki)
            .arg(&kpi);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, h.div_ceil(MOE_MAX_K / kp) as u32, 1),
            block_dim: (MOE_MAX_K as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as launch_moe_gate_up, over a down weight of E·h rows of inter; k ≤ kp ≤
        // MOE_MAX_K (the block's warps and its shared partial sums).
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("moe_down"))?;
        Ok(())
    }

    /// `moe_sort(i32 ids[pairs], i32 sorted[cap], i32 tile_expert[cap / bm], i32 num_tiles[1],
    /// int pairs, int E, int cap, int bm)`: one block.
    pub(super) fn launch_moe_sort(
        &self,
        ids: &CudaSlice<i32>,
        groups: &mut MoeGroups,
        (pairs, e): (usize, usize),
    ) -> Result<(), DeviceError> {
        let bm = groups.bm;
        let cap = moe_sorted_capacity(pairs, e, bm);
        if e > MOE_MAX_EXPERTS
            || !MOE_BMS.contains(&bm)
            || ids.len() < pairs
            || groups.sorted.len() < cap
            || groups.tile_expert.len() < cap / bm
        {
            return Err(short_buffers("moe_sort", pairs, e));
        }
        let (pi, ei, ci, bmi) = (pairs as i32, e as i32, cap as i32, bm as i32);
        let mut l = self.stream.launch_builder(&self.k.moe_sort);
        l.arg(ids)
            .arg(&mut groups.sorted)
            .arg(&mut groups.tile_expert)
            .arg(&mut groups.num_tiles)
            .arg(&pi)
            .arg(&ei)
            .arg(&ci)
            .arg(&bmi);
        // SAFETY: E ≤ MOE_MAX_EXPERTS (its shared counters), every id < E (the routing kernel
        // wrote them), sorted holds cap ≥ pairs + E·(bm − 1) entries, which bounds every
        // expert's padded run and so every tile index below cap / bm.
        unsafe { self.enqueue(&mut l, rows_config(1, 1024)) }.map_err(op_err("moe_sort"))?;
        Ok(())
    }

    /// `moe_gemm_bm{16,64,128}_{bf16,e4m3}(bf16 a[rows, K], bf16 or e4m3 w[E·N, K], f32
    /// w_scale[E·N] or null, i32 sorted[cap], i32 tile_expert[..], i32 num_tiles[1], bf16
    /// out[pairs, N], int N, int K, int a_div)`, or with e4m3 input rows
    /// `moe_gemm_bm{16,64,128}_f8f8(e4m3 a[rows, K], f32 a_scale[rows], e4m3 w[E·N, K], f32
    /// w_scale[E·N], …)` (e4m3 weights only, K a multiple of MOE_BK8): grid (cap / bm, ⌈N /
    /// MOE_BN⌉) for the groups' tile rows bm; pair p reads row p / a_div of `a`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_moe_gemm(
        &self,
        a: MoeInput<'_>,
        w: WeightRef<'_>,
        groups: &MoeGroups,
        out: &mut CudaSlice<u16>,
        (pairs, e, n, k, a_div): (usize, usize, usize, usize, usize),
    ) -> Result<(), DeviceError> {
        let f8f8 = matches!(a, MoeInput::E4m3 { .. });
        let k_step = if f8f8 { MOE_BK8 } else { MOE_BK };
        let refuse = |msg: String| DeviceError::Op {
            device: super::DEV,
            op: "moe_gemm",
            msg,
        };
        if !k.is_multiple_of(k_step) || !n.is_multiple_of(8) || a_div == 0 {
            return Err(refuse(format!(
                "K {k} must be a multiple of {k_step} and N {n} of 8"
            )));
        }
        if f8f8 && !matches!(w, WeightRef::E4m3 { .. }) {
            return Err(refuse("e4m3 input rows need e4m3 weights".into()));
        }
        let bm = groups.bm;
        let Some(v) = MOE_BMS.iter().position(|&b| b == bm) else {
            return Err(short_buffers("moe_gemm", pairs, n));
        };
        let max_tiles = moe_sorted_capacity(pairs, e, bm) / bm;
        let weights_fit = match w {
            WeightRef::Bf16(b) => b.len() >= e * n * k,
            WeightRef::E4m3 { codes, scales } => codes.len() >= e * n * k && scales.len() >= e * n,
        };
        let a_rows = pairs.div_ceil(a_div);
        let input_fits = match a {
            MoeInput::Bf16(x) => x.len() >= a_rows * k,
            MoeInput::E4m3 { codes, scales } => codes.len() >= a_rows * k && scales.len() >= a_rows,
        };
        if !input_fits || !weights_fit || out.len() < pairs * n {
            return Err(short_buffers("moe_gemm", pairs, n));
        }
        let (ni, ki, di) = (n as i32, k as i32, a_div as i32);
        let func = match f8f8 {
            true => self
                .k
                .moe_gemm_f8f8
                .get(v)
                .ok_or_else(|| unfit("moe_gemm_f8f8", bm, 64, k))?,
            false => &self.k.moe_gemm[w.format()][v],
        };
        let mut l = self.stream.launch_builder(func);
        let null = 0u64;
        match a {
            MoeInput::Bf16(x) => l.arg(x),
            MoeInput::E4m3 { codes, scales } => l.arg(codes).arg(scales),
        };
        match w {
            WeightRef::Bf16(b) => l.arg(b).arg(&null),
            WeightRef::E4m3 { codes, scales } => l.arg(codes).arg(scales),
        };
        l.arg(&groups.sorted)
            .arg(&groups.tile_expert)
            .arg(&groups.num_tiles)
            .arg(out)
            .arg(&ni)
            .arg(&ki)
            .arg(&di);
        let cfg = LaunchConfig {
            grid_dim: (max_tiles as u32, n.div_ceil(MOE_BN) as u32, 1),
            block_dim: (super::kernels::moe_gemm_threads(bm), 1, 1),
            // The FP8 × FP8 kernel's stages are bf16's (64 bytes a row), no widened tile.
            shared_mem_bytes: super::kernels::moe_gemm_smem_bytes(
                bm,
                matches!(w, WeightRef::E4m3 { .. }) && !f8f8,
            ),
        };
        // SAFETY: K a multiple of the k step and N of 8 (whole 16-byte loads and 4-byte stores
        // of whole allocations), buffer sizes checked above (an input's scales one a row); the
        // FP8 × FP8 kernel is only loaded by a device that checked sm_89+ before taking this
        // path (CudaDevice::new); the sort wrote every tile's expert (< E) and pairs (< pairs,
        // or −1 skipped) for the tiles below num_tiles ≤ max_tiles.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("moe_gemm"))?;
        Ok(())
    }

    /// `moe_combine_bf16(bf16 yp[n·k, h], f32 weights[n·k], bf16 y[n, h], int n, int k, int h)`.
    pub(super) fn launch_moe_combine(
        &self,
        yp: &CudaSlice<u16>,
        weights: &CudaSlice<f32>,
        y: &mut CudaSlice<u16>,
        (n, k, h): (usize, usize, usize),
    ) -> Result<(), DeviceError> {
        if yp.len() < n * k * h || weights.len() < n * k || y.len() < n * h {
            return Err(short_buffers("moe_combine", n, h));
        }
        let (ni, ki, hi) = (n as i32, k as i32, h as i32);
        let mut l = self.stream.launch_builder(&self.k.moe_combine);
        l.arg(yp).arg(weights).arg(y).arg(&ni).arg(&ki).arg(&hi);
        let cfg = LaunchConfig {
            grid_dim: ((n * h).div_ceil(256).min(8192) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: buffer sizes checked above; grid-stride over n·h.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("moe_combine"))?;
        Ok(())
    }

    /// `quantize_rows_e4m3` / `quantize_act_rows_e4m3(bf16 w[n, k], e4m3 codes[n, k], f32
    /// scale[n], int n, int k)`, one block per row: `exact` (weights, the CPU's arithmetic) or
    /// a GEMM's input rows, each read once (k a multiple of 8).
    pub(super) fn launch_quantize_rows_e4m3(
        &self,
        exact: bool,
        w: &CudaSlice<u16>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        (n, k): (usize, usize),
    ) -> Result<(), DeviceError> {
        let (name, f) = if exact {
            ("quantize_rows_e4m3", &self.k.quantize_rows_e4m3)
        } else {
            ("quantize_act_rows_e4m3", &self.k.quantize_act_rows_e4m3)
        };
        if w.len() < n * k
            || codes.len() < n * k
            || scales.len() < n
            || !(exact || k.is_multiple_of(8))
        {
            return Err(short_buffers(name, n, k));
        }
        let (ni, ki) = (n as i32, k as i32);
        let mut l = self.stream.launch_builder(f);
        l.arg(w).arg(codes).arg(scales).arg(&ni).arg(&ki);
        // SAFETY: w and codes hold n·k elements and scales n (checked above); for the
        // vectorized kernel k is a multiple of 8, so every row starts 16-byte aligned in both
        // (allocations are); one block of 256 threads (its ACT_Q_THREADS) per row.
        unsafe { self.enqueue(&mut l, rows_config(n, 256)) }.map_err(op_err(name))?;
        Ok(())
    }

    /// `rms_norm_e4m3(f32 residual[rows, cols], bf16 delta[rows, cols] or null, bf16 delta_w[cols]
    /// or null, bf16 w[cols], e4m3 codes[rows, cols], f32 scale[rows], int cols, float eps)`: a
    /// sub-layer's norm (adding `delta` into the residual when given) into the FP8 GEMM's input.
    /// Rows of at most 8 · 1024 columns (held in registers: the caller checks
    /// [`super::gemm::FP8_NORM_MAX_COLS`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_rms_norm_e4m3(
        &self,
        residual: &mut CudaSlice<f32>,
        delta: Option<super::gemv::DeltaSlices<'_>>,
        w: &CudaSlice<u16>,
        codes: &mut CudaSlice<u8>,
        scale: &mut CudaSlice<f32>,
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<(), DeviceError> {
        let short = residual.len() < rows * cols
            || delta.is_some_and(|d| d.short(rows, cols))
            || w.len() < cols
            || codes.len() < rows * cols
            || scale.len() < rows;
        if short || cols > super::gemm::FP8_NORM_MAX_COLS {
            return Err(short_buffers("rms_norm_e4m3", rows, cols));
        }
        let c = cols as i32;
        let null = 0u64;
        let mut l = self.stream.launch_builder(&self.k.rms_norm_e4m3);
        l.arg(residual);
        match delta {
            Some(d) => {
                l.arg(d.x);
                match d.norm {
                    Some(n) => l.arg(n),
                    None => l.arg(&null),
                };
            }
            None => {
                l.arg(&null).arg(&null);
            }
        }
        l.arg(w).arg(codes).arg(scale).arg(&c).arg(&eps);
        match delta.and_then(|d| d.scales) {
            Some((ws, xs)) => l.arg(ws).arg(xs),
            None => l.arg(&null).arg(&null),
        };
        // SAFETY: the buffers hold what the kernel reads and writes (checked above); each block
        // reads and writes its own row; cols ≤ 8 · 1024, so norm_config's threads hold a row in
        // registers.
        unsafe { self.enqueue(&mut l, norm_config(rows, cols)) }
            .map_err(op_err("rms_norm_e4m3"))?;
        Ok(())
    }

    /// `dequantize_rows_e4m3(e4m3 codes[n, k], f32 scale[n], bf16 w[n, k], int n, int k)`: the
    /// codes and scales may be views into a larger weight (an expert's block of rows).
    pub(super) fn launch_dequantize_rows_e4m3(
        &self,
        codes: &CudaView<'_, u8>,
        scales: &CudaView<'_, f32>,
        w: &mut CudaSlice<u16>,
        (n, k): (usize, usize),
    ) -> Result<(), DeviceError> {
        if w.len() < n * k || codes.len() < n * k || scales.len() < n {
            return Err(short_buffers("dequantize_rows_e4m3", n, k));
        }
        let (ni, ki) = (n as i32, k as i32);
        let mut l = self.stream.launch_builder(&self.k.dequantize_rows_e4m3);
        l.arg(codes).arg(scales).arg(w).arg(&ni).arg(&ki);
        let cfg = LaunchConfig {
            grid_dim: ((self.sms * 4) as u32, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every buffer holds what n rows of k take (checked above); grid-stride loop.
        // With k % 16 == 0 the kernel's 16-byte loads start at row boundaries of a whole
        // allocation (views are taken at whole rows), so they are aligned.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("dequantize_rows_e4m3"))?;
        Ok(())
    }

    /// `fp8_scale_bf16_bf16_rows(bf16 d[n, m], f32 w_scale[..], u32 w_first[n], f32
    /// x_scale[n], bf16 out[n, m], int n, int m)`: row t scaled by `w_scale[w_first[t]..][..m]`
    /// and `x_scale[t]` (a mixture's sorted rows, each by its expert's weight rows); `w_first`
    /// is checked here and uploaded.
    pub(super) fn launch_fp8_scale_rows(
        &self,
        d: &CudaSlice<u16>,
        (w_scale, w_first, x_scale): (&CudaSlice<f32>, &[u32], &CudaSlice<f32>),
        out: &mut CudaSlice<u16>,
        (n, m): (usize, usize),
    ) -> Result<(), DeviceError> {
        let scales_fit = w_first
            .iter()
            .all(|&f| f.is_multiple_of(4) && f as usize + m <= w_scale.len());
        if d.len() < n * m
            || w_first.len() < n
            || !scales_fit
            || x_scale.len() < n
            || out.len() < n * m
            || !m.is_multiple_of(8)
            || n > 65535
        {
            return Err(short_buffers("fp8_scale_bf16_bf16_rows", n, m));
        }
        let w_first = self.htod_u32(w_first)?;
        let (ni, mi) = (n as i32, m as i32);
        let mut l = self.stream.launch_builder(&self.k.fp8_scale_rows);
        l.arg(d)
            .arg(w_scale)
            .arg(&w_first)
            .arg(x_scale)
            .arg(out)
            .arg(&ni)
            .arg(&mi);
        let cfg = fp8_scale_config(n, m);
        // SAFETY: d and out hold n·m elements, w_first and x_scale n, and every row's m weight
        // scales lie inside w_scale from a multiple of 4 (checked above), so the scales'
        // 16-byte loads are aligned; m % 8 == 0 for the 16-byte accesses of d and out.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("fp8_scale_bf16_bf16_rows"))?;
        Ok(())
    }

    /// `fp8_scale_out_{bf16|f32}(f32 d[n, m], f32 w_scale[m], f32 x_scale[n], out[n, m], int n,
    /// int m)`: the FP8 GEMM's product scaled by its weight rows' and tokens' scales.
    pub(super) fn launch_fp8_scale_out(
        &self,
        d: super::gemm_fp8::Fp8Product<'_>,
        (w_scale, x_scale): (&CudaSlice<f32>, &CudaSlice<f32>),
        out: super::gemm_fp8::Fp8Out<'_>,
        (n, m): (usize, usize),
    ) -> Result<(), DeviceError> {
        use super::gemm_fp8::{Fp8Out, Fp8Product};
        let out_len = match &out {
            Fp8Out::Bf16(o) => o.len(),
            Fp8Out::F32(o) => o.len(),
        };
        let d_len = match &d {
            Fp8Product::F32(d) => d.len(),
            Fp8Product::Bf16(d) => d.len(),
        };
        if d_len < n * m
            || w_scale.len() < m
            || x_scale.len() < n
            || out_len < n * m
            || !m.is_multiple_of(4)
        {
            return Err(short_buffers("fp8_scale_out", n, m));
        }
        let (ni, mi) = (n as i32, m as i32);
        let cfg = match &d {
            // m is a multiple of 16 (the FP8 GEMM's condition).
            Fp8Product::Bf16(_) if m.is_multiple_of(8) && n <= 65535 => fp8_scale_config(n, m),
            Fp8Product::Bf16(_) => {
                return Err(DeviceError::Op {
                    device: super::DEV,
                    op: "fp8_scale_bf16_bf16",
                    msg: format!("{n} rows of {m}: at most 65,535 rows of a multiple of 8"),
                })
            }
            Fp8Product::F32(_) => LaunchConfig {
                grid_dim: ((self.sms * 4) as u32, 1, 1),
                block_dim: (512, 1, 1),
                shared_mem_bytes: 0,
            },
        };
        let mut l = self.stream.launch_builder(match (&d, &out) {
            (Fp8Product::F32(_), Fp8Out::Bf16(_)) => &self.k.fp8_scale_out[0],
            (Fp8Product::F32(_), Fp8Out::F32(_)) => &self.k.fp8_scale_out[1],
            (Fp8Product::Bf16(_), Fp8Out::Bf16(_)) => &self.k.fp8_scale_out[2],
            (Fp8Product::Bf16(_), Fp8Out::F32(_)) => {
                return Err(DeviceError::Op {
                    device: super::DEV,
                    op: "fp8_scale_out",
                    msg: "a bf16 product is scaled into bf16 only".into(),
                })
            }
        });
        match d {
            Fp8Product::F32(d) => l.arg(d),
            Fp8Product::Bf16(d) => l.arg(d),
        };
        l.arg(w_scale).arg(x_scale);
        match out {
            Fp8Out::Bf16(o) => l.arg(o),
            Fp8Out::F32(o) => l.arg(o),
        };
        l.arg(&ni).arg(&mi);
        // SAFETY: d and out hold n·m elements (out a buffer of its own), the scales m and n, m a
        // multiple of four — of eight for the bf16 product's 16-byte accesses — (checked above;
        // fresh allocations, 16-byte aligned); a grid-stride loop, or a thread per eight
        // columns of one row with the threads past m returning.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("fp8_scale_out"))?;
        Ok(())
    }

    /// `gemv_norm[_swiglu|_geglu]_{bf16|e4m3}_r{R}(f32 residual[rows, k], bf16 delta[rows, k]
    /// or null, bf16 delta_w[k] or null, f32 residual_out[rows, k] or null, bf16 norm_w[k], w[n
    /// or 2n, k], f32 w_scale[n or 2n] or null, bf16 out[rows, n], int n, int k, int rows, float
    /// eps)` for the instantiation `v` (the gated variant of `glu`, if any) and the weights'
    /// format; for [`NormGemvOut::Router`] `gemv_norm_f32out_bf16_r{R}(…, f32 out[rows, n], int
    /// n, int k, int rows, float eps, bf16 xs_out[rows, k])` (bf16 weights, no `glu`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_gemv_norm(
        &self,
        v: usize,
        glu: Option<Activation>,
        residual: &CudaSlice<f32>,
        delta: Option<super::gemv::DeltaSlices<'_>>,
        residual_out: Option<&mut CudaSlice<f32>>,
        norm: &CudaSlice<u16>,
        w: WeightRef<'_>,
        out: NormGemvOut<'_>,
        (rows, k, n): (usize, usize, usize),
        eps: f32,
    ) -> Result<(), DeviceError> {
        let smem = GEMV_ROWS[v] * k * 2;
        if rows > GEMV_ROWS[v] || !k.is_multiple_of(w.k_multiple()) || smem > GEMV_SMEM_MAX {
            return Err(unfit("gemv + norm", rows, GEMV_ROWS[v], k));
        }
        if let NormGemvOut::Router { logits, xs } = &out {
            if glu.is_some()
                || !matches!(w, WeightRef::Bf16(_))
                || logits.len() < rows * n
                || xs.len() < rows * k
            {
                return Err(DeviceError::Op {
                    device: super::DEV,
                    op: "gemv + norm",
                    msg: format!(
                        "a router's norm + GEMV takes bf16 weights, no activation, {rows}·{n} logits and {rows}·{k} rows out"
                    ),
                });
            }
        }
        if delta.is_some_and(|d| d.scales.is_some()) {
            return Err(DeviceError::Op {
                device: super::DEV,
                op: "gemv + norm",
                msg: "the delta is an FP8 product whose scales this kernel does not apply".into(),
            });
        }
        let null = 0u64;
        let (ni, ki, ri) = (n as i32, k as i32, rows as i32);
        let func = match (&out, glu) {
            (NormGemvOut::Router { .. }, _) => &self.k.gemv_norm_f32out[v],
            (_, Some(act)) => &self.k.gemv_norm_glu[w.format()][act as usize][v],
            (_, None) => &self.k.gemv_norm[w.format()][v],
        };
        let mut l = self.stream.launch_builder(func);
        l.arg(residual);
        match delta.map(|d| (d.x, d.norm)) {
            Some((d, Some(dw))) => l.arg(d).arg(dw),
            Some((d, None)) => l.arg(d).arg(&null),
            None => l.arg(&null).arg(&null),
        };
        match residual_out {
            Some(r) => l.arg(r),
            None => l.arg(&null),
        };
        l.arg(norm);
        match w {
            WeightRef::Bf16(b) => l.arg(b).arg(&null),
            WeightRef::E4m3 { codes, scales } => l.arg(codes).arg(scales),
        };
        match out {
            NormGemvOut::Bf16(o) => l.arg(o).arg(&ni).arg(&ki).arg(&ri).arg(&eps),
            NormGemvOut::Router { logits, xs } => {
                l.arg(logits).arg(&ni).arg(&ki).arg(&ri).arg(&eps).arg(xs)
            }
        };
        // SAFETY: rows ≤ R, k a multiple of one load and R·k·2 bytes of dynamic shared memory within the
        // attribute set at load (checked above); residual_out is a fresh buffer, so no block
        // reads what another writes; delta and residual_out are both given or both null; a
        // router's logits and rows out hold rows·n and rows·k elements (checked above; fresh
        // buffers, 16-byte aligned for the rows' 16-byte stores).
        unsafe { self.enqueue(&mut l, self.gemv_config(smem)) }.map_err(op_err("gemv + norm"))?;
        Ok(())
    }
}
