//! Projections of a few rows (decode steps) through `gemv.cu`: weights streamed once with 16-byte
//! loads, one warp per output row, the sub-layer's residual add + RMSNorm (and the previous
//! sub-layer's output norm) fused in as a prologue and SwiGLU / GeGLU as the gate/up epilogue. Steps with more rows than `gemv_max_rows` (or
//! shapes the kernels cannot take) go through the norm kernels and cuBLAS.

use cudarc::driver::CudaSlice;

use super::kernels::{GEMV_ROWS, GEMV_SMEM_MAX};
use super::tensor::{CudaBuf, CudaTensor, WeightRef};
use super::{CudaDevice, DEV};
use crate::config::Activation;
use crate::device::{Delta, Device};
use crate::error::DeviceError;

/// A sub-layer's delta as the norm kernels take it: its rows, its own norm's weights where it
/// has one (Gemma's output norms), and for an FP8 product whose scales are still to apply
/// ([`CudaBuf::Fp8Unscaled`]) the weight rows' and the tokens' scales.
#[derive(Clone, Copy)]
pub(super) struct DeltaSlices<'a> {
    pub x: &'a CudaSlice<u16>,
    pub norm: Option<&'a CudaSlice<u16>>,
    pub scales: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>)>,
}

impl DeltaSlices<'_> {
    /// Whether the buffers are too short for `rows` rows of `cols`.
    pub fn short(&self, rows: usize, cols: usize) -> bool {
        self.x.len() < rows * cols
            || self.norm.is_some_and(|n| n.len() < cols)
            || self
                .scales
                .is_some_and(|(ws, xs)| ws.len() < cols || xs.len() < rows)
    }
}

/// [`DeltaSlices`] of `delta` (`op` names the caller in a wrong-dtype error). An unscaled FP8
/// product is refused unless `unscaled` says the caller's kernel applies its scales.
pub(super) fn delta_slices<'a>(
    delta: Option<&Delta<'a, CudaTensor>>,
    op: &'static str,
    unscaled: bool,
) -> Result<Option<DeltaSlices<'a>>, DeviceError> {
    delta.map(|d| delta_slice(d, op, unscaled)).transpose()
}

/// [`delta_slices`] of a delta that is there.
pub(super) fn delta_slice<'a>(
    d: &Delta<'a, CudaTensor>,
    op: &'static str,
    unscaled: bool,
) -> Result<DeltaSlices<'a>, DeviceError> {
    let norm = match d.norm {
        Some(nw) => Some(nw.bf16(op)?),
        None => None,
    };
    let (x, scales) = match &d.x.buf {
        CudaBuf::Fp8Unscaled {
            product,
            w_scale,
            x_scale,
        } if unscaled => (product, Some((&**w_scale, x_scale))),
        _ => (d.x.bf16(op)?, None),
    };
    Ok(DeltaSlices { x, norm, scales })
}

impl CudaDevice {
    /// Which GEMV instantiation serves `rows` input rows of `k` features by `w`, if any (up to
    /// `CACHET_GEMV`'s rows for bf16 weights, `CACHET_GEMV_FP8`'s for FP8); FP8 steps of more
    /// rows go to cuBLASLt's FP8 GEMM (or, without one, are dequantized for cuBLAS).
    pub(super) fn gemv_variant(&self, rows: usize, k: usize, w: &WeightRef<'_>) -> Option<usize> {
        let max_rows = match w {
            WeightRef::Bf16(_) => self.options.gemv_max_rows,
            WeightRef::E4m3 { .. } => self.options.gemv_max_rows_fp8,
        };
        if rows == 0
            || rows > max_rows
            || !k.is_multiple_of(w.k_multiple())
            || k > i32::MAX as usize
        {
            return None;
        }
        GEMV_ROWS.iter().position(|&r| rows <= r)
    }

    /// `x · wᵀ` for a few rows with instantiation `v` of gemv.cu.
    pub(super) fn gemv(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        v: usize,
    ) -> Result<CudaTensor, DeviceError> {
        let (rows, k, n) = (x.rows, x.cols, w.rows);
        let mut out = self.alloc_bf16(rows * n, "gemv")?;
        self.launch_gemv(
            v,
            w.weight("gemv")?,
            x.bf16("gemv")?,
            &mut out,
            (rows, k, n),
        )?;
        Ok(CudaTensor::new_bf16(rows, n, out))
    }

    /// The GEMV instantiation that fuses a norm over `residual` into a projection by `w` (and,
    /// `glu`, a gated activation over its gate|up halves), if one fits.
    fn gemv_norm_variant(&self, residual: &CudaTensor, w: &CudaTensor, glu: bool) -> Option<usize> {
        let v = self.gemv_variant(residual.rows, residual.cols, &w.weight("gemv").ok()?)?;
        let fits = GEMV_ROWS[v] * residual.cols * 2 <= GEMV_SMEM_MAX
            && w.cols == residual.cols
            && (!glu || w.rows.is_multiple_of(2));
        fits.then_some(v)
    }

    /// [`Device::norm_linear`] (or, with `glu`, [`Device::norm_glu`]): one fused gemv.cu launch
    /// where the rows fit one, else the norm, the GEMM (and the activation) as separate
    /// launches.
    pub(super) fn norm_projection(
        &self,
        residual: &mut CudaTensor,
        delta: Option<Delta<'_, CudaTensor>>,
        norm: &CudaTensor,
        eps: f32,
        w: &CudaTensor,
        glu: Option<Activation>,
    ) -> Result<CudaTensor, DeviceError> {
        // An unscaled FP8 delta (never at the GEMV's few rows, unless the sub-layers' weights
        // differ in format) takes the norm kernels, which apply its scales.
        let unscaled = delta.as_ref().is_some_and(|d| d.x.is_unscaled());
        let fused = self
            .gemv_norm_variant(residual, w, glu.is_some())
            .filter(|_| !unscaled);
        let Some(v) = fused else {
            if let Some(y) = self.norm_fp8_projection(residual, delta, norm, eps, w, glu)? {
                return Ok(y);
            }
            let x = self.norm(residual, delta, norm, eps)?;
            return match glu {
                Some(act) => self.linear_glu(&x, w, act),
                None => self.linear(&x, w),
            };
        };
        let op = match glu {
            Some(Activation::Silu) => "gemv + norm + swiglu",
            Some(Activation::GeluTanh) => "gemv + norm + geglu",
            None => "gemv + norm",
        };
        self.timed(op, || {
            let (rows, k) = (residual.rows, residual.cols);
            let n = if glu.is_some() { w.rows / 2 } else { w.rows };
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
            let delta = delta_slices(delta.as_ref(), "gemv", false)?;
            let input = super::launch::NormIn {
                residual: res,
                delta,
                residual_out: res_out.as_mut(),
                norm: norm.bf16("gemv")?,
                eps,
            };
            self.launch_gemv_norm(
                (v, glu),
                input,
                w.weight("gemv")?,
                super::launch::NormGemvOut::Bf16(&mut out),
                (rows, k, n),
            )?;
            if let Some(r) = res_out {
                residual.buf = CudaBuf::F32(r);
            }
            Ok(CudaTensor::new_bf16(rows, n, out))
        })
    }
}
