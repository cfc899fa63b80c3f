//! The GEMV kernels' launches (gemv.cu): decode's projections of a few rows, bf16 or f32 out,
//! and the norm fused in front; each as safe as the launches of [`super`].

use super::{short_buffers, unfit};
use crate::config::Activation;
use crate::device::cuda::kernels::{GEMV_ROWS, GEMV_SMEM_MAX, GEMV_THREADS};
use crate::device::cuda::tensor::WeightRef;
use crate::device::cuda::{op_err, CudaDevice};
use crate::error::DeviceError;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// The pairs of a step sorted by expert into tiles of `bm` rows (moe_sort's outputs).
/// Where a fused norm + GEMV writes: bf16 products, or (a MoE router over the layer's input) f32
/// logits and the normalised rows, which the experts then read.
pub(in crate::device::cuda) enum NormGemvOut<'a> {
    Bf16(&'a mut CudaSlice<u16>),
    Router {
        logits: &'a mut CudaSlice<f32>,
        xs: &'a mut CudaSlice<u16>,
    },
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

/// A sub-layer's input as the fused norm + GEMV kernels take it: the residual (with `delta`
/// added first, when given, written to `residual_out`), the norm's weight and its epsilon.
pub(in crate::device::cuda) struct NormIn<'a> {
    pub residual: &'a CudaSlice<f32>,
    pub delta: Option<crate::device::cuda::gemv::DeltaSlices<'a>>,
    pub residual_out: Option<&'a mut CudaSlice<f32>>,
    pub norm: &'a CudaSlice<u16>,
    pub eps: f32,
}

impl CudaDevice {
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
    pub(in crate::device::cuda) fn launch_gemv(
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
    pub(in crate::device::cuda) fn launch_gemv_f32out(
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

    /// `gemv_norm[_swiglu|_geglu]_{bf16|e4m3}_r{R}(f32 residual[rows, k], bf16 delta[rows, k]
    /// or null, bf16 delta_w[k] or null, f32 residual_out[rows, k] or null, bf16 norm_w[k], w[n
    /// or 2n, k], f32 w_scale[n or 2n] or null, bf16 out[rows, n], int n, int k, int rows, float
    /// eps)` for the instantiation `v` (the gated variant of `glu`, if any) and the weights'
    /// format; for [`NormGemvOut::Router`] `gemv_norm_f32out_bf16_r{R}(…, f32 out[rows, n], int
    /// n, int k, int rows, float eps, bf16 xs_out[rows, k])` (bf16 weights, no `glu`).
    pub(in crate::device::cuda) fn launch_gemv_norm(
        &self,
        (v, glu): (usize, Option<Activation>),
        input: NormIn<'_>,
        w: WeightRef<'_>,
        out: NormGemvOut<'_>,
        (rows, k, n): (usize, usize, usize),
    ) -> Result<(), DeviceError> {
        let NormIn {
            residual,
            delta,
            residual_out,
            norm,
            eps,
        } = input;
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
                    device: crate::device::cuda::DEV,
                    op: "gemv + norm",
                    msg: format!(
                        "a router's norm + GEMV takes bf16 weights, no activation, {rows}·{n} logits and {rows}·{k} rows out"
                    ),
                });
            }
        }
        if delta.is_some_and(|d| d.scales.is_some()) {
            return Err(DeviceError::Op {
                device: crate::device::cuda::DEV,
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
