//! The mixture-of-experts kernels' launches (moe.cu): routing, the expert-sorted pair list,
//! the grouped GEMMs and the combine; each as safe as the launches of [`super`].

use super::{rows_config, short_buffers, unfit};
use crate::device::cuda::kernels::{
    MOE_BK, MOE_BK8, MOE_BMS, MOE_BN, MOE_MAX_EXPERTS, MOE_MAX_K, MOE_THREADS,
};
use crate::device::cuda::tensor::WeightRef;
use crate::device::cuda::{op_err, CudaDevice};
use crate::error::DeviceError;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// Entries of the expert-sorted pair list of `pairs` pairs over `e` experts: every expert's run
/// padded to whole `bm`-row tiles.
pub(in crate::device::cuda) fn moe_sorted_capacity(pairs: usize, e: usize, bm: usize) -> usize {
    (pairs + e * (bm - 1)).div_ceil(bm) * bm
}

/// A grouped GEMM's input rows: bf16, or e4m3 codes with a scale a row (the FP8 × FP8 kernel).
#[derive(Clone, Copy)]
pub(in crate::device::cuda) enum MoeInput<'a> {
    Bf16(&'a CudaSlice<u16>),
    E4m3 {
        codes: &'a CudaSlice<u8>,
        scales: &'a CudaSlice<f32>,
    },
}

pub(in crate::device::cuda) struct MoeGroups {
    pub bm: usize,
    pub sorted: CudaSlice<i32>,
    pub tile_expert: CudaSlice<i32>,
    pub num_tiles: CudaSlice<i32>,
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
            device: crate::device::cuda::DEV,
            op,
            msg: format!("{k} of {e} experts (at most {MOE_MAX_EXPERTS} experts)"),
        });
    }
    if logits < n * e || ids < n * k || weights < n * k {
        return Err(short_buffers(op, n, e));
    }
    Ok(())
}

impl CudaDevice {
    /// `moe_route_f32(f32 logits[n, E], i32 ids[n, k], f32 weights[n, k], int n, int E, int k,
    /// int norm)`: a warp per token.
    pub(in crate::device::cuda) fn launch_moe_route(
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
    pub(in crate::device::cuda) fn launch_moe_gate_up(
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
    pub(in crate::device::cuda) fn launch_moe_down(
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
    pub(in crate::device::cuda) fn launch_moe_sort(
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
    pub(in crate::device::cuda) fn launch_moe_gemm(
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
            device: crate::device::cuda::DEV,
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
            block_dim: (crate::device::cuda::kernels::moe_gemm_threads(bm), 1, 1),
            // The FP8 × FP8 kernel's stages are bf16's (64 bytes a row), no widened tile.
            shared_mem_bytes: crate::device::cuda::kernels::moe_gemm_smem_bytes(
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
    pub(in crate::device::cuda) fn launch_moe_combine(
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
}
