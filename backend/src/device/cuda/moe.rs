//! A mixture-of-experts layer on CUDA, after its routing: the experts (per-pair GEMVs for few
//! rows; moe.cu's sorted grouped GEMMs or cuBLAS's grouped GEMM for more — see `Device::moe`
//! in mod.rs, which routes and then calls [`CudaDevice::moe_experts`]), and
//! [`CudaDevice::norm_moe_fused`], the layer with its norm in the router's GEMV.

use cudarc::driver::CudaSlice;

use super::kernels::{self, GEMV_ROWS, GEMV_SMEM_MAX};
use super::launch;
use super::moe_cublas;
use super::tensor::{CudaBuf, CudaTensor, WeightRef};
use super::{CudaDevice, MoeRouter, DEV};
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
    .map_err(err)?;
    if p.act != Activation::Silu {
        return Err(err(format!(
            "{:?} experts: the CUDA expert kernels are SwiGLU's",
            p.act
        )));
    }
    Ok(())
}

impl CudaDevice {
    /// [`Device::norm_moe`] with the norm in the router's GEMV (`CACHET_MOE_NORM=fused`:
    /// `gemv_norm_f32out_*` writes the new residual, the normalised rows for the experts and
    /// the f32 logits in one launch), then the routing and the experts as in `Device::moe`.
    /// `None` (nothing done) where it does not apply: the switch off, more rows than the
    /// router's GEMV takes, a router that is not bf16, the routing fused into the router
    /// (`CACHET_MOE_ROUTER=fused|gemm`), or a delta whose FP8 scales are still to apply. With
    /// `CACHET_MOE_ROUTER=experts` the expert GEMVs route (no routing launch either).
    #[allow(clippy::too_many_arguments)]
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
        let in_experts = self.options.moe_router == MoeRouter::Experts;
        let applies = self.options.moe_norm_fused
            && (self.options.moe_router == MoeRouter::Gemv || in_experts)
            && n > 0
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
            self.launch_gemv_norm(
                v,
                None,
                res,
                d,
                res_out.as_mut(),
                norm.bf16("moe")?,
                router,
                out,
                (n, h, e),
                eps,
            )
        })?;
        if let Some(r) = res_out {
            residual.buf = CudaBuf::F32(r);
        }
        let mut ids = self.alloc_out::<i32>(n * k, "moe routing")?;
        let mut weights = self.alloc_f32(n * k, "moe routing")?;
        if !in_experts {
            self.timed("moe routing", || {
                self.launch_moe_route(&logits, &mut ids, &mut weights, (n, e, k, p.norm_topk_prob))
            })?;
        }
        let logits = in_experts.then_some(&logits);
        let y = self.moe_experts(&xs, w, p, (&mut ids, &mut weights), logits, n)?;
        Ok(Some(CudaTensor::new_bf16(n, h, y)))
    }

    /// The experts of `n` normalised rows `xs` (`[n, h]`) routed to `ids` with `weights`
    /// (`[n, k]` each), summed per row into bf16 `[n, h]`. With `logits` (the router's, f32
    /// `[n, E]`) the routing is still to do, into `ids` and `weights`: inside the expert
    /// GEMVs' blocks where the rows take them (`CACHET_MOE_ROUTER=experts`), else by the
    /// routing kernel first.
    pub(super) fn moe_experts(
        &self,
        xs: &CudaSlice<u16>,
        w: MoeWeights<'_, CudaTensor>,
        p: &MoeParams,
        (ids, weights): (&mut CudaSlice<i32>, &mut CudaSlice<f32>),
        logits: Option<&CudaSlice<f32>>,
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
        if let (Some(l), Some(_)) = (logits, grouped) {
            self.timed("moe routing", || {
                self.launch_moe_route(l, ids, weights, (n, e, k, p.norm_topk_prob))
            })?;
        }
        match grouped {
            // cuBLAS's grouped GEMM takes its shapes on the host: never inside a capture.
            Some((gu, dw))
                if self.options.moe_grouped_cublas && !self.capturing.get() && cublas_fits =>
            {
                self.timed("moe grouped gemm (cuBLAS)", || {
                    self.moe_grouped_cublas(xs, (gu, dw), &*ids, &*weights, &mut y, (n, k, e, h, i))
                })?;
            }
            Some((gu, dw)) => {
                let pairs = n * k;
                // FP8 experts on the FP8 tensor cores (CACHET_MOE_FP8_MMA=fp8): each product's
                // input rows quantized to e4m3 per row first; widths the kernel's 64-code k step
                // does not divide widen as before.
                let f8f8 = fp8
                    && self.options.moe_fp8_mma
                    && h.is_multiple_of(kernels::MOE_BK8)
                    && i.is_multiple_of(kernels::MOE_BK8);
                // A product over `rows` input rows of `cols`: its input as it is, or quantized.
                let product = |input: &CudaSlice<u16>,
                               rows: usize,
                               cols: usize,
                               w: WeightRef<'_>,
                               groups: &launch::MoeGroups,
                               out: &mut CudaSlice<u16>,
                               (n_out, a_div): (usize, usize)| {
                    if !f8f8 {
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
                        let exact = self.options.fp8_exact_activations;
                        self.launch_quantize_rows_e4m3(
                            exact,
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
                    // where they average 16 or fewer (decode; FP8 experts unless
                    // CACHET_MOE_SMALL_TILES says otherwise), else 64.
                    let bm = if pairs >= 96 * e {
                        128
                    } else if pairs <= 16 * e && self.options.moe_small_tiles.apply(fp8) {
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
                    let routing = match logits {
                        // Each block routes its token: the routing's launch saved.
                        Some(logits) => launch::GateUpRouting::Logits {
                            logits,
                            ids: &mut *ids,
                            weights: &mut *weights,
                            e,
                            norm: p.norm_topk_prob,
                        },
                        None => launch::GateUpRouting::Routed(&*ids),
                    };
                    self.launch_moe_gate_up(gu, xs, routing, &mut act, (n, k, i, h))?;
                    self.launch_moe_down(dw, &act, &*ids, &*weights, &mut y, (n, k, i, h))
                })?;
            }
        }
        Ok(y)
    }
}
