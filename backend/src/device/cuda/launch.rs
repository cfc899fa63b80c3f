//! One typed launch function per kernel: the only `unsafe` kernel launches of the device. Each
//! takes the kernel's arguments with their device types and shapes (as documented on the kernel
//! in `kernels/`), checks what the kernel cannot, and says in its `SAFETY:` line why the launch
//! is sound (the MoE, FP8 and GEMV kernels' in `launch/`). Everything above these files is safe
//! code.

use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaViewMut, DriverError, LaunchArgs, LaunchConfig,
    PushKernelArg,
};

use super::kernels::{mma_threads, ATT_THREADS, COMBINE_ELEMS, COMBINE_THREADS};
use super::programmatic;
use super::{op_err, CudaDevice};
use crate::config::Activation;
use crate::error::DeviceError;

mod fp8;
mod gemv;
mod moe;

pub(super) use gemv::{NormGemvOut, NormIn};
pub(super) use moe::{moe_sorted_capacity, MoeGroups, MoeInput};

/// Threads of a token-selection block (`SAMPLE_THREADS` / `LOGPROB_THREADS` in sampling.cu).
const SAMPLE_THREADS: u32 = 512;

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
    pub(super) fn launch_rope_kv(
        &self,
        func: &CudaFunction,
        qkv: &mut CudaSlice<u16>,
        (rope, pos, slots): (&CudaSlice<f32>, &CudaSlice<u32>, &CudaSlice<u32>),
        kv: LayerKv<'_>,
        (n, nh, nkv, d): (usize, usize, usize, usize),
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
}
