//! Matrix products through cuBLAS: bf16 inputs, f32 accumulation, bf16 or f32 out. The handle
//! gets a workspace of its own at start-up, so no GEMM allocates while a graph is captured.
//! FP8 weights go through cuBLASLt's FP8 GEMM ([`super::gemm_fp8`]) with the activations
//! quantized per token; where it has no algorithm, through this GEMM, dequantized to bf16 first
//! (one launch, into a buffer freed after the product: each weight byte read once and two more
//! written and read).

use std::sync::Arc;

use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::gemm_fp8::{Fp8Out, Fp8Product};
use super::tensor::{CudaBuf, CudaTensor};
use super::{op_err, CudaDevice, DEV};
use crate::config::Activation;
use crate::device::Delta;
use crate::error::DeviceError;

/// cuBLAS workspace (what NVIDIA recommends for Hopper).
const CUBLAS_WORKSPACE: usize = 32 << 20;

/// A cuBLAS handle on the device's stream, with its workspace.
pub struct Blas {
    pub(super) handle: CudaBlas,
    _workspace: CudaSlice<u8>,
}

fn blas_err(op: &'static str) -> impl Fn(String) -> DeviceError {
    move |msg| DeviceError::Op {
        device: DEV,
        op,
        msg,
    }
}

impl Blas {
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, DeviceError> {
        let handle =
            CudaBlas::new(stream.clone()).map_err(|e| blas_err("cublas")(format!("{e:?}")))?;
        // SAFETY: u8 has no invalid bit patterns and cuBLAS only writes its workspace.
        let workspace =
            unsafe { stream.alloc::<u8>(CUBLAS_WORKSPACE) }.map_err(op_err("cublas workspace"))?;
        {
            let (ptr, _g) = workspace.device_ptr(stream);
            // SAFETY: a live allocation of CUBLAS_WORKSPACE bytes, kept for the handle's lifetime
            // (stored next to it).
            let status = unsafe {
                blas_sys::cublasSetWorkspace_v2(
                    *handle.handle(),
                    ptr as *mut std::ffi::c_void,
                    CUBLAS_WORKSPACE,
                )
            };
            if status != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(blas_err("cublasSetWorkspace")(format!("{status:?}")));
            }
        }
        Ok(Blas {
            handle,
            _workspace: workspace,
        })
    }
}

impl CudaDevice {
    /// `out = x · wᵀ` with cuBLAS (bf16 inputs, f32 accumulation), out bf16 or f32.
    pub(super) fn gemm(
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
        if let CudaBuf::E4m3 { codes, scales } = &w.buf {
            let x = Fp8Input::Bf16(xs);
            if let Some(out) = self.gemm_fp8(x, (codes, scales), (m, n, k), out_f32, None, false)? {
                return Ok(out);
            }
        }
        let dequantized;
        let ws = match &w.buf {
            CudaBuf::E4m3 { codes, scales } if n > 0 => {
                let mut b = self.alloc_bf16(m * k, "dequantized weights")?;
                self.launch_dequantize_rows_e4m3(
                    &codes.as_view(),
                    &scales.as_view(),
                    &mut b,
                    (m, k),
                )?;
                dequantized = b;
                &dequantized
            }
            _ => w.bf16("linear")?,
        };
        // The product's own buffer: f32 or bf16, never FP8.
        enum Out {
            F32(CudaSlice<f32>),
            Bf16(CudaSlice<u16>),
        }
        let tensor = |out: Out| CudaTensor {
            rows: n,
            cols: m,
            buf: match out {
                Out::F32(o) => CudaBuf::F32(o),
                Out::Bf16(o) => CudaBuf::Bf16(o),
            },
        };
        let mut out = if out_f32 {
            Out::F32(self.alloc_f32(n * m, "linear")?)
        } else {
            Out::Bf16(self.alloc_bf16(n * m, "linear")?)
        };
        if n == 0 {
            return Ok(tensor(out));
        }
        {
            let (xp, _gx) = xs.device_ptr(&self.stream);
            let (wp, _gw) = ws.device_ptr(&self.stream);
            let (op, ot) = match &mut out {
                Out::F32(o) => (
                    o.device_ptr_mut(&self.stream),
                    blas_sys::cudaDataType_t::CUDA_R_32F,
                ),
                Out::Bf16(o) => (
                    o.device_ptr_mut(&self.stream),
                    blas_sys::cudaDataType_t::CUDA_R_16BF,
                ),
            };
            // SAFETY: the three are live allocations of n·k, m·k and n·m elements (bf16, bf16
            // and the output's type) on the handle's stream, borrowed until the product is
            // enqueued.
            unsafe { self.gemm_bf16_at((wp, xp, op.0), (m, n, k), ot) }?;
        }
        Ok(tensor(out))
    }

    /// `out[n, m] = x[n, k] · w[m, k]ᵀ` (row-major) on device addresses through cuBLAS: bf16
    /// inputs, f32 accumulation, the output in `out_type` — column-major outᵀ[m, n] = wᵀ·x with
    /// w seen as a k×m column-major matrix (transposed) and x as k×n.
    ///
    /// # Safety
    /// `wp`, `xp` and `op` address m·k bf16, n·k bf16 and n·m `out_type` elements of allocations
    /// that stay live on the handle's stream until the product has run.
    pub(super) unsafe fn gemm_bf16_at(
        &self,
        (wp, xp, op): (u64, u64, u64),
        (m, n, k): (usize, usize, usize),
        out_type: blas_sys::cudaDataType_t,
    ) -> Result<(), DeviceError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's addresses (see above); alpha/beta outlive the call.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle.handle(),
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
                op as *mut _,
                out_type,
                m as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| blas_err("cublasGemmEx")(format!("{e:?}")))
    }

    /// `x · wᵀ` for FP8 weights through cuBLASLt: x quantized per token, the e4m3 product in
    /// bf16 (in f32 for an f32 result), then both scale
    /// vectors applied — with `glu`, on a gate|up product, in the same pass as the gated
    /// activation (bf16 product only: [`Self::fp8_glu_fused`]), the result then [n, m / 2]; with
    /// `unscaled` (a bf16 product, no `glu`), not at all: the result is the product with its
    /// scales ([`CudaBuf::Fp8Unscaled`]), for the next norm to apply.
    /// `None` when there is no cuBLASLt or no algorithm for the shape.
    fn gemm_fp8(
        &self,
        x: Fp8Input<'_>,
        (codes, w_scale): (&CudaSlice<u8>, &Arc<CudaSlice<f32>>),
        (m, n, k): (usize, usize, usize),
        out_f32: bool,
        glu: Option<Activation>,
        unscaled: bool,
    ) -> Result<Option<CudaTensor>, DeviceError> {
        let Some(Some(lt)) = self.fp8_gemm.get() else {
            return Ok(None);
        };
        if n == 0 || !k.is_multiple_of(16) || !m.is_multiple_of(16) {
            return Ok(None);
        }
        if glu.is_some() && !self.fp8_glu_fused(n, m, out_f32) {
            return Err(DeviceError::Op {
                device: DEV,
                op: "fp8 gate|up",
                msg: format!("no fused epilogue for {n} rows of {m}"),
            });
        }
        // The product runs on a padded row count, so cuBLASLt plans a few dozen shapes, not one
        // per prompt length: the pad rows' codes are whatever the buffer held and their
        // products are never read (each output row depends on its own input row only).
        let n_pad = fp8_padded_rows(n);
        let (x_codes, x_scale) = match x {
            Fp8Input::Bf16(xs) => {
                let (mut x_codes, mut x_scale) = self.alloc_fp8_input(n, k)?;
                // The parts are timed under `gemm` too (`↳`: the profile counts them once, in
                // `gemm`).
                self.timed("↳ fp8: quantize activations", || {
                    self.launch_quantize_rows_e4m3(false, xs, &mut x_codes, &mut x_scale, (n, k))
                })?;
                (x_codes, x_scale)
            }
            Fp8Input::Codes(c, s) if c.len() >= n_pad * k && s.len() >= n => (c, s),
            Fp8Input::Codes(..) => {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "fp8 gemm",
                    msg: format!(
                        "quantized input too short for {n} rows (padded to {n_pad}) of {k}"
                    ),
                })
            }
        };
        if unscaled && (out_f32 || glu.is_some()) {
            return Err(DeviceError::Op {
                device: DEV,
                op: "fp8 gemm",
                msg: "only a bf16 product with no activation leaves its scales to the next norm"
                    .into(),
            });
        }
        let scales = (&**w_scale, &x_scale);
        // The scales applied on the way to the result.
        let scaled = |product: Fp8Product| -> Result<CudaBuf, DeviceError> {
            if let (Some(act), Fp8Product::Bf16(d)) = (glu, &product) {
                return self.timed("↳ fp8: scales + gated activation", || {
                    let mut o = self.alloc_bf16(n * m / 2, "linear")?;
                    self.launch_fp8_scale_glu(act, d, scales, &mut o, (n, m / 2))?;
                    Ok(CudaBuf::Bf16(o))
                });
            }
            self.timed("↳ fp8: scales", || {
                Ok(if out_f32 {
                    let mut o = self.alloc_f32(n * m, "linear")?;
                    self.launch_fp8_scale_out(product, scales, Fp8Out::F32(&mut o), (n, m))?;
                    CudaBuf::F32(o)
                } else {
                    let mut o = self.alloc_bf16(n * m, "linear")?;
                    self.launch_fp8_scale_out(product, scales, Fp8Out::Bf16(&mut o), (n, m))?;
                    CudaBuf::Bf16(o)
                })
            })
        };
        // cuBLASLt's product of the codes; false: no algorithm for the shape. The profile also
        // times each product by its shape (a `↳↳` row: a part of the line above).
        let product = |raw: Fp8Out| {
            let launch = || lt.matmul(&self.stream, (codes, &x_codes), (m, n_pad, k), raw);
            let label = self
                .profiling_on()
                .then(|| self.label(format!("↳↳ cuBLASLt {m}×{k}, {n_pad} rows")));
            self.timed("↳ fp8: cuBLASLt product", move || match label {
                Some(label) => self.timed(label, launch),
                None => launch(),
            })
        };
        // A bf16 result's product is written by cuBLASLt in bf16 (4 bytes an element through
        // the epilogue, not 10 through an f32 product): prefill 2.5–4% faster on the H200, the
        // logits' error the same (BENCHMARKS-HISTORY.md).
        let buf = if out_f32 {
            let mut raw = self.alloc_f32(n_pad * m, "FP8 product")?;
            if !product(Fp8Out::F32(&mut raw))? {
                return Ok(None);
            }
            scaled(Fp8Product::F32(&raw))?
        } else {
            let mut raw = self.alloc_bf16(n_pad * m, "FP8 product")?;
            if !product(Fp8Out::Bf16(&mut raw))? {
                return Ok(None);
            }
            if unscaled {
                CudaBuf::Fp8Unscaled {
                    product: raw,
                    w_scale: w_scale.clone(),
                    x_scale,
                }
            } else {
                scaled(Fp8Product::Bf16(&raw))?
            }
        };
        Ok(Some(CudaTensor {
            rows: n,
            cols: if glu.is_some() { m / 2 } else { m },
            buf,
        }))
    }

    /// `t` with its scales applied where it is an unscaled FP8 product ([`CudaBuf::Fp8Unscaled`]:
    /// into a bf16 buffer of its own, by the scales' launch it skipped); anything else as it is.
    pub(super) fn settle(&self, t: &mut CudaTensor) -> Result<(), DeviceError> {
        if t.is_unscaled() {
            t.buf = CudaBuf::Bf16(self.scaled_copy(t)?);
        }
        Ok(())
    }

    /// The bf16 values of an unscaled FP8 product (`fp8_scale_bf16_bf16`).
    pub(super) fn scaled_copy(&self, t: &CudaTensor) -> Result<CudaSlice<u16>, DeviceError> {
        let CudaBuf::Fp8Unscaled {
            product,
            w_scale,
            x_scale,
        } = &t.buf
        else {
            return Err(DeviceError::Op {
                device: DEV,
                op: "fp8 scales",
                msg: "not an unscaled FP8 product".into(),
            });
        };
        self.timed("↳ fp8: scales", || {
            let mut o = self.alloc_bf16(t.rows * t.cols, "linear")?;
            self.launch_fp8_scale_out(
                Fp8Product::Bf16(product),
                (w_scale, x_scale),
                Fp8Out::Bf16(&mut o),
                (t.rows, t.cols),
            )?;
            Ok(o)
        })
    }

    /// [`crate::device::Device::linear_delta`]: an FP8 projection of more rows than the GEMV
    /// takes leaves its scales to the next norm (`add_rms_norm_bf16` / `rms_norm_e4m3` read the
    /// unscaled product and both scale vectors) where that norm holds a row in registers and
    /// cuBLASLt has the product, else [`crate::device::Device::linear`].
    pub(super) fn linear_unscaled(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
    ) -> Result<CudaTensor, DeviceError> {
        use crate::device::Device;
        if let CudaBuf::E4m3 { codes, scales } = &w.buf {
            let (n, k, m) = (x.rows, x.cols, w.rows);
            let applies = n > 0
                && k == w.cols
                && m <= FP8_NORM_MAX_COLS
                && self.gemv_variant(n, k, &w.weight("linear")?).is_none();
            if applies {
                let xs = Fp8Input::Bf16(x.bf16("linear")?);
                let out = self.timed("gemm", || {
                    self.gemm_fp8(xs, (codes, scales), (m, n, k), false, None, true)
                })?;
                if let Some(out) = out {
                    return Ok(out);
                }
            }
        }
        self.linear(x, w)
    }

    /// The sub-layer's norm straight into the FP8 GEMM's input codes ([`Fp8Input::Codes`], the
    /// `rms_norm_e4m3` kernel: the separate launches' codes bit for bit), then the product — with
    /// `glu`, gated in the scales' pass as [`Self::linear_glu`] does (batch-64 FP8 decode −1.7%,
    /// batch 256 −0.8% on the H200 against the two launches). `None` (nothing done, the residual
    /// untouched) where that path does not apply: weights not FP8, a step the GEMV takes, rows
    /// wider than [`FP8_NORM_MAX_COLS`], or no cuBLASLt algorithm for the shape.
    pub(super) fn norm_fp8_projection(
        &self,
        residual: &mut CudaTensor,
        delta: Option<Delta<'_, CudaTensor>>,
        norm: &CudaTensor,
        eps: f32,
        w: &CudaTensor,
        glu: Option<Activation>,
    ) -> Result<Option<CudaTensor>, DeviceError> {
        let (n, k, m) = (residual.rows, residual.cols, w.rows);
        let CudaBuf::E4m3 { codes, scales } = &w.buf else {
            return Ok(None);
        };
        let Some(Some(lt)) = self.fp8_gemm.get() else {
            return Ok(None);
        };
        let applies = n > 0
            && k == w.cols
            && k <= FP8_NORM_MAX_COLS
            && k.is_multiple_of(16)
            && m.is_multiple_of(16)
            && self.gemv_variant(n, k, &w.weight("linear")?).is_none()
            && glu.is_none_or(|_| self.fp8_glu_fused(n, m, false))
            && lt.supports((m, fp8_padded_rows(n), k, true))?;
        if !applies {
            return Ok(None);
        }
        let (mut x_codes, mut x_scale) = self.alloc_fp8_input(n, k)?;
        let op = match &delta {
            Some(d) if d.norm.is_some() => "add_rms_norm + output norm",
            Some(_) => "add_rms_norm",
            None => "rms_norm",
        };
        self.timed(op, || {
            self.timed("↳ fp8: norm into codes", || {
                let delta = super::gemv::delta_slices(delta.as_ref(), "add_rms_norm", true)?;
                let wv = norm.bf16("rms_norm")?;
                let r = residual.f32_mut("rms_norm")?;
                self.launch_rms_norm_e4m3(r, delta, wv, (&mut x_codes, &mut x_scale), (n, k), eps)
            })
        })?;
        self.timed("gemm", || {
            self.gemm_fp8(
                Fp8Input::Codes(x_codes, x_scale),
                (codes, scales),
                (m, n, k),
                false,
                glu,
                false,
            )
        })?
        .map(Some)
        .ok_or_else(|| DeviceError::Op {
            device: DEV,
            op: "fp8 gemm",
            msg: format!("cuBLASLt planned {n}×{k} · ({m}×{k})ᵀ and then had no algorithm"),
        })
    }

    /// An FP8 product's input buffers for `n` rows of `k`: the codes of the padded rows
    /// ([`fp8_padded_rows`]; the pad rows' codes are whatever the buffer held, and their
    /// products are never read) and a scale a row.
    fn alloc_fp8_input(
        &self,
        n: usize,
        k: usize,
    ) -> Result<(CudaSlice<u8>, CudaSlice<f32>), DeviceError> {
        let codes = self.alloc_out::<u8>(fp8_padded_rows(n) * k, "FP8 activations")?;
        Ok((codes, self.alloc_f32(n, "FP8 activation scales")?))
    }

    /// Whether an FP8 gate|up product of `n` rows and `m` columns takes its gated activation in
    /// the scales' pass (`fp8_scale_{silu|gelu_tanh}_bf16`): a bf16 product, half its columns a
    /// multiple of 8, at most 65,535 rows.
    pub(super) fn fp8_glu_fused(&self, n: usize, m: usize, out_f32: bool) -> bool {
        !out_f32 && (m / 2).is_multiple_of(8) && n <= 65535
    }

    /// `act(x · gateᵀ) ⊙ (x · upᵀ)` for a gate|up weight `w` ([gate rows; up rows]): for FP8
    /// weights through cuBLASLt with the scales and the activation in one pass, else the
    /// product, then [`crate::device::Device::glu`].
    pub(super) fn linear_glu(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        act: Activation,
    ) -> Result<CudaTensor, DeviceError> {
        use crate::device::Device;
        let fused = match &w.buf {
            CudaBuf::E4m3 { codes, scales }
                if x.cols == w.cols
                    && x.rows > 0
                    && self
                        .gemv_variant(x.rows, x.cols, &w.weight("linear")?)
                        .is_none()
                    && self.fp8_glu_fused(x.rows, w.rows, false) =>
            {
                let xs = Fp8Input::Bf16(x.bf16("linear")?);
                self.timed("gemm", || {
                    self.gemm_fp8(
                        xs,
                        (codes, scales),
                        (w.rows, x.rows, x.cols),
                        false,
                        Some(act),
                        false,
                    )
                })?
            }
            _ => None,
        };
        match fused {
            Some(out) => Ok(out),
            None => {
                let y = self.linear(x, w)?;
                self.glu(&y, act)
            }
        }
    }
}

/// Widest rows `rms_norm_e4m3` takes: eight values a thread of 1,024 (norm_config's threads).
pub(super) const FP8_NORM_MAX_COLS: usize = 8 * 1024;

/// An FP8 product's input: bf16 rows quantized on the way in, or codes and row scales already
/// made (owned: they live until the product is enqueued; the rows padded as
/// [`fp8_padded_rows`] says).
pub(super) enum Fp8Input<'a> {
    Bf16(&'a CudaSlice<u16>),
    Codes(CudaSlice<u8>, CudaSlice<f32>),
}

/// The rows an FP8 product runs on for `n` input rows: multiples of 16 up to 64 (batched decode
/// steps), of 128 beyond (prefill).
pub(super) fn fp8_padded_rows(n: usize) -> usize {
    if n <= 64 {
        n.next_multiple_of(16)
    } else {
        n.next_multiple_of(128)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fp8_products_run_on_a_few_padded_row_counts() {
        let pads: Vec<usize> = [1, 5, 16, 17, 64, 65, 128, 129, 2048, 8191]
            .iter()
            .map(|&n| super::fp8_padded_rows(n))
            .collect();
        assert_eq!(pads, [16, 16, 16, 32, 64, 128, 128, 256, 2048, 8192]);
        let shapes: std::collections::BTreeSet<usize> =
            (1..=8192).map(super::fp8_padded_rows).collect();
        assert_eq!(
            shapes.len(),
            4 + 64,
            "plans per weight shape up to 8192-token steps"
        );
    }
}
