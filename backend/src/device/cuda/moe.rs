//! A mixture-of-experts layer on CUDA, after its routing: the experts (per-pair GEMVs for few
//! rows; moe.cu's sorted grouped GEMMs or cuBLAS's grouped GEMM for more — see `Device::moe`
//! in mod.rs, which routes and then calls [`CudaDevice::moe_experts`]), and
//! [`CudaDevice::norm_moe_fused`], the layer with its norm in the router's GEMV.

use cudarc::driver::CudaSlice;

use super::kernels::{self, GEMV_ROWS, GEMV_SMEM_MAX};
use super::launch;
use super::moe_cublas;
use super::tensor::{CudaBuf, CudaTensor, WeightRef};
use super::{CudaDevice, DEV};
use crate::config::Activation;
use crate::device::{Delta, MoeParams, MoeWeights};
use crate::error::DeviceError;

/// A MoE layer's shapes against its hidden size `h`, and its activation (the CUDA experts are
/// SwiGLU's).
pub(super) fn check(
    h: usize,
    w: &MoeWeights<'_, CudaTensor>,
    p: &MoeParams,
) -> Result<(), DeviceError> {
    let err = |msg: String| DeviceError::Op {
        device: DEV,
        op: "moe",
        msg,
    };
    p.check_shapes(
        h,
        (w.router.rows, w.router.cols),
        (w.gate_up.rows, w.gate_up.cols),
        (w.down.rows, w.down.cols),
    )
    .map_err(|e| err(e.to_string()))?;
    if p.act != Activation::Silu {
        return Err(err(format!(
            "{:?} experts: the CUDA expert kernels are SwiGLU's",
            p.act
        )));
    }
    Ok(())
}

impl CudaDevice {
    /// [`Device::norm_moe`] with the norm in the router's GEMV (`gemv_norm_f32out_*` writes the
    /// new residual, the normalised rows for the experts and the f32 logits in one launch), then
    /// the routing and the experts as in `Device::moe`: a launch fewer a layer, measured on an
    /// H100 at batch 1 (BENCHMARKS.md §8): Qwen3-30B-A3B 3.60–3.61 ms a step against 3.63–3.68,
    /// its thin twin 1.61 against 1.71–1.72. `None` (nothing done) where it does not apply: more
    /// rows than the router's GEMV takes, a router that is not bf16, or a delta whose FP8 scales
    /// are still to apply.
    pub(super) fn norm_moe_fused(
        &self,
        residual: &mut CudaTensor,
        delta: Option<Delta<'_, CudaTensor>>,
        norm: &CudaTensor,
        eps: f32,
        w: MoeWeights<'_, CudaTensor>,
        p: &MoeParams,
    ) -> Result<Option<CudaTensor>, DeviceError> {
        let (n, h, e, k) = (residual.rows, residual.cols, p.num_experts, p.top_k);
        let applies = n > 0
            && matches!(w.router.buf, CudaBuf::Bf16(_))
            && matches!(residual.buf, CudaBuf::F32(_))
            && !delta.as_ref().is_some_and(|d| d.x.is_unscaled());
        if !applies {
            return Ok(None);
        }
        let router = w.router.weight("moe")?;
        let v = match self.gemv_variant(n, h, &router) {
            Some(v) if GEMV_ROWS[v] * h * 2 <= GEMV_SMEM_MAX => v,
            _ => return Ok(None),
        };
        check(h, &w, p)?;
        let CudaBuf::F32(res) = &residual.buf else {
            return Ok(None);
        };
        let mut xs = self.alloc_bf16(n * h, "moe")?;
        let mut logits = self.alloc_f32(n * e, "moe router")?;
        let mut res_out = match delta {
            Some(_) => Some(self.alloc_f32(n * h, "moe")?),
            None => None,
        };
        self.timed("moe norm + router", || {
            let d = super::gemv::delta_slices(delta.as_ref(), "moe", false)?;
            let out = launch::NormGemvOut::Router {
                logits: &mut logits,
                xs: &mut xs,
            };
            let input = launch::NormIn {
                residual: res,
                delta: d,
                residual_out: res_out.as_mut(),
                norm: norm.bf16("moe")?,
                eps,
            };
            self.launch_gemv_norm((v, None), input, router, out, (n, h, e))
        })?;
        if let Some(r) = res_out {
            residual.buf = CudaBuf::F32(r);
        }
        let mut ids = self.alloc_out::<i32>(n * k, "moe routing")?;
        let mut weights = self.alloc_f32(n * k, "moe routing")?;
        self.timed("moe routing", || {
            self.launch_moe_route(&logits, &mut ids, &mut weights, (n, e, k, p.norm_topk_prob))
        })?;
        let y = self.moe_experts(&xs, w, p, (&mut ids, &mut weights), n)?;
        Ok(Some(CudaTensor::new_bf16(n, h, y)))
    }

    /// The experts of `n` normalised rows `xs` (`[n, h]`) routed to `ids` with `weights`
    /// (`[n, k]` each), summed per row into bf16 `[n, h]`.
    pub(super) fn moe_experts(
        &self,
        xs: &CudaSlice<u16>,
        w: MoeWeights<'_, CudaTensor>,
        p: &MoeParams,
        (ids, weights): (&mut CudaSlice<i32>, &mut CudaSlice<f32>),
        n: usize,
    ) -> Result<CudaSlice<u16>, DeviceError> {
        let (e, k, i) = (p.num_experts, p.top_k, p.inter);
        let h = w.router.cols;
        let mut y = self.alloc_bf16(n * h, "moe")?;
        // bf16 or FP8 experts (both projections alike) for the grouped products.
        let (gu, dw) = (w.gate_up.weight("moe")?, w.down.weight("moe")?);
        let fp8 = matches!(gu, WeightRef::E4m3 { .. });
        let min_rows = match fp8 {
            true => self.options.moe_gemm_min_rows_fp8,
            false => self.options.moe_gemm_min_rows,
        };
        let grouped = (n >= min_rows
            && gu.format() == dw.format()
            && h.is_multiple_of(kernels::MOE_BK)
            && i.is_multiple_of(kernels::MOE_BK))
        .then_some((gu, dw));
        // FP8 experts on cuBLAS's path only where an expert's gate|up product averages a GEMM
        // of its own (few large experts: Mixtral's prefill): cuBLASLt's FP8 GEMM an expert.
        let cublas_fits = !fp8
            || moe_cublas::own_gemm_tiles(2 * i, n * k / e.min(n * k))
                >= self.options.moe_gemm_own_tiles;
        match grouped {
            // cuBLAS's grouped GEMM takes its shapes on the host: never inside a capture.
            // Outside one it beat moe.cu's on the H200's prefills: 512 / 4,096 tokens 23.5–24.9
            // / 137.7–139.0 ms against 27.1–27.4 / 150.0–152.3 (Qwen3-30B-A3B), 63.8–65.6 /
            // 425.7–429.0 against 89.7–90.4 / 523.2–525.7 (Mixtral-8x7B).
            Some((gu, dw)) if !self.capturing.get() && cublas_fits => {
                self.timed("moe grouped gemm (cuBLAS)", || {
                    self.moe_grouped_cublas(xs, (gu, dw), &*ids, &*weights, &mut y, (n, k, e, h, i))
                })?;
            }
            Some((gu, dw)) => {
                let pairs = n * k;
                // FP8 experts on the FP8 tensor cores in 16- and 64-row tiles: each product's
                // input rows quantized to e4m3 per row first. Measured on an H100 against the
                // weights widened to bf16 (Qwen3-30B-A3B, FP8 experts, three rounds): decode
                // batch 64 21.3–21.5 against 22.1–22.2 ms, batch 256 28.3–28.4 against 29.0,
                // prefill 512 26.6–26.9 against 27.0–27.2; but prefill 4,096 (128-row tiles)
                // 171 against 152, so those keep widening. Widths the kernel's 64-code k step
                // does not divide widen too.
                let f8f8 = |bm: usize| {
                    fp8 && bm < 128
                        && h.is_multiple_of(kernels::MOE_BK8)
                        && i.is_multiple_of(kernels::MOE_BK8)
                };
                // A product over `rows` input rows of `cols`: its input as it is, or quantized.
                let product = |input: &CudaSlice<u16>,
                               rows: usize,
                               cols: usize,
                               w: WeightRef<'_>,
                               groups: &launch::MoeGroups,
                               out: &mut CudaSlice<u16>,
                               (n_out, a_div): (usize, usize)| {
                    if !f8f8(groups.bm) {
                        return self.timed("↳ moe: grouped GEMMs (ours)", || {
                            self.launch_moe_gemm(
                                launch::MoeInput::Bf16(input),
                                w,
                                groups,
                                out,
                                (pairs, e, n_out, cols, a_div),
                            )
                        });
                    }
                    self.timed("↳ moe: FP8 × FP8 grouped GEMMs (ours)", || {
                        let mut codes = self.alloc_out::<u8>(rows * cols, "moe FP8 activations")?;
                        let mut scales = self.alloc_f32(rows, "moe FP8 activation scales")?;
                        self.launch_quantize_rows_e4m3(
                            false,
                            input,
                            &mut codes,
                            &mut scales,
                            (rows, cols),
                        )?;
                        let a = launch::MoeInput::E4m3 {
                            codes: &codes,
                            scales: &scales,
                        };
                        self.launch_moe_gemm(a, w, groups, out, (pairs, e, n_out, cols, a_div))
                    })
                };
                self.timed("moe grouped gemm", || {
                    // Tiles of 128 rows where the experts average that many pairs (prefill), 16
                    // where FP8 experts average 16 or fewer (decode: steps 8–13% faster at batch
                    // 64 and 3–4% at 256 on the H200; bf16's within ±3% either way), else 64.
                    let bm = if pairs >= 96 * e {
                        128
                    } else if pairs <= 16 * e && fp8 {
                        16
                    } else {
                        64
                    };
                    let cap = launch::moe_sorted_capacity(pairs, e, bm);
                    let mut groups = launch::MoeGroups {
                        bm,
                        sorted: self.alloc_out::<i32>(cap, "moe groups")?,
                        tile_expert: self.alloc_out::<i32>(cap / bm, "moe groups")?,
                        num_tiles: self.alloc_out::<i32>(1, "moe groups")?,
                    };
                    self.launch_moe_sort(&*ids, &mut groups, (pairs, e))?;
                    let mut gate_up = self.alloc_bf16(pairs * 2 * i, "moe gate_up")?;
                    product(xs, n, h, gu, &groups, &mut gate_up, (2 * i, k))?;
                    let mut act = self.alloc_bf16(pairs * i, "moe activations")?;
                    self.launch_glu(Activation::Silu, &gate_up, &mut act, pairs, i)?;
                    drop(gate_up);
                    let mut down = self.alloc_bf16(pairs * h, "moe down")?;
                    product(&act, pairs, i, dw, &groups, &mut down, (h, 1))?;
                    self.launch_moe_combine(&down, &*weights, &mut y, (n, k, h))
                })?;
            }
            None => {
                self.timed("moe expert gemv", || {
                    let mut act = self.alloc_bf16(n * k * i, "moe activations")?;
                    self.launch_moe_gate_up(gu, xs, &*ids, &mut act, (n, k, i, h))?;
                    self.launch_moe_down(dw, &act, &*ids, &*weights, &mut y, (n, k, i, h))
                })?;
            }
        }
        Ok(y)
    }
}
