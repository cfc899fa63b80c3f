//! A mixture-of-experts step's expert products through cuBLAS's grouped GEMM
//! (`cublasGemmGroupedBatchedEx`, CUDA 12.5+), what steps outside graph captures take: on the
//! H200 it made prefill 10–29% faster than moe.cu's grouped kernel (BENCHMARKS.md §8). cuBLAS takes each problem's shape on the host, so the
//! routing's choices come back to the host (one synchronisation a layer), the pairs are sorted
//! by expert there, the tokens' rows gathered into that order on the device, and each touched
//! expert is one problem of its own shape: `[c_e, h] · W_eᵀ`. An expert whose product fills the
//! GPU on its own ([`super::CudaOptions::moe_gemm_own_tiles`]: Mixtral's prefill) gets a plain
//! cuBLAS GEMM instead of a group; FP8 experts (taken here only then) go through cuBLASLt's FP8
//! GEMM an expert, or — where cuBLASLt has no algorithm for a shape — are dequantized an expert
//! at a time into one bf16 buffer for cuBLAS. Never inside a graph capture (the
//! caller keeps moe.cu's kernel there): the host must see the routing first.

use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use super::gemm::fp8_padded_rows;
use super::tensor::WeightRef;
use super::{op_err, CudaDevice, DEV};
use crate::config::Activation;
use crate::error::DeviceError;

/// Every pair's expert, sorted: `order[j]` the pair at sorted row j, `pos[p]` pair p's sorted
/// row, `runs` each touched expert with its first sorted row and its pair count (expert order).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ExpertRuns {
    pub order: Vec<u32>,
    pub pos: Vec<u32>,
    pub runs: Vec<(usize, usize, usize)>,
}

/// 128 × 128 output tiles of an expert's `rows` × `m` product: from
/// [`super::CudaOptions::moe_gemm_own_tiles`] of them it gets a GEMM of its own.
pub(super) fn own_gemm_tiles(m: usize, rows: usize) -> usize {
    m.div_ceil(128) * rows.div_ceil(128)
}

/// A routing pair whose expert is not one of the layer's.
#[derive(Debug, thiserror::Error)]
#[error("pair {pair} routed to expert {expert} of {experts}")]
pub(crate) struct BadRoute {
    pair: usize,
    expert: i32,
    experts: usize,
}

/// A stable counting sort of the pairs by expert (`ids[p] < e`, checked).
pub(crate) fn expert_runs(ids: &[i32], e: usize) -> Result<ExpertRuns, BadRoute> {
    let mut count = vec![0usize; e];
    for (p, &x) in ids.iter().enumerate() {
        let x = usize::try_from(x).ok().filter(|&x| x < e).ok_or(BadRoute {
            pair: p,
            expert: x,
            experts: e,
        })?;
        count[x] += 1;
    }
    let mut next = vec![0usize; e];
    let mut runs = Vec::new();
    let mut start = 0;
    for (x, &c) in count.iter().enumerate() {
        next[x] = start;
        if c > 0 {
            runs.push((x, start, c));
        }
        start += c;
    }
    let (mut order, mut pos) = (vec![0u32; ids.len()], vec![0u32; ids.len()]);
    for (p, &x) in ids.iter().enumerate() {
        let j = next[x as usize];
        next[x as usize] += 1;
        order[j] = p as u32;
        pos[p] = j as u32;
    }
    Ok(ExpertRuns { order, pos, runs })
}

impl CudaDevice {
    /// `y[n, h] = Σ_s weights[t·k + s] · down_e(silu(gate_e) · up_e)(x[t])` for the experts
    /// `ids` chose, every expert's rows one problem of a cuBLAS grouped GEMM or a GEMM of its
    /// own (gate|up, then down), weights `gu` [E·2i, h] and `dw` [E·h, i].
    pub(super) fn moe_grouped_cublas(
        &self,
        x: &CudaSlice<u16>,
        (gu, dw): (WeightRef<'_>, WeightRef<'_>),
        ids: &CudaSlice<i32>,
        weights: &CudaSlice<f32>,
        y: &mut CudaSlice<u16>,
        (n, k, e, h, i): (usize, usize, usize, usize, usize),
    ) -> Result<(), DeviceError> {
        let pairs = n * k;
        let mut ids_h = self.stream.clone_dtoh(ids).map_err(op_err("moe routing"))?;
        ids_h.truncate(pairs);
        let r = expert_runs(&ids_h, e).map_err(|e| DeviceError::Op {
            device: DEV,
            op: "moe",
            msg: e.to_string(),
        })?;
        let token_rows: Vec<u32> = r.order.iter().map(|&p| p / k as u32).collect();
        let token_rows = self.htod_u32(&token_rows)?;
        let mut xs = self.alloc_bf16(pairs * h, "moe sorted rows")?;
        self.launch_gather_rows(&token_rows, x, &mut xs, pairs, h)?;
        let mut gate_up = self.alloc_bf16(pairs * 2 * i, "moe gate_up")?;
        self.timed("↳ moe: cuBLAS grouped GEMMs", || {
            self.grouped_gemm((gu, 2 * i), (&xs, h), &mut gate_up, &r.runs)
        })?;
        drop(xs);
        let mut act = self.alloc_bf16(pairs * i, "moe activations")?;
        self.launch_glu(Activation::Silu, &gate_up, &mut act, pairs, i)?;
        drop(gate_up);
        let mut down = self.alloc_bf16(pairs * h, "moe down")?;
        self.timed("↳ moe: cuBLAS grouped GEMMs", || {
            self.grouped_gemm((dw, h), (&act, i), &mut down, &r.runs)
        })?;
        // Back to pair order for the weighted sum.
        let pos = self.htod_u32(&r.pos)?;
        let mut down_pairs = self.alloc_bf16(pairs * h, "moe down")?;
        self.launch_gather_rows(&pos, &down, &mut down_pairs, pairs, h)?;
        self.launch_moe_combine(&down_pairs, weights, y, (n, k, h))
    }

    /// For each run (expert x, first sorted row s, c rows): `out[s.., m] = a[s.., kk] · W_xᵀ`
    /// with `W_x` the m × kk block of rows x·m.. of `w` — a run whose product has
    /// [`super::CudaOptions::moe_gemm_own_tiles`] 128 × 128 tiles or more (every run of FP8
    /// experts: cuBLASLt's FP8 GEMMs, else each dequantized first) as a GEMM of its own, the
    /// others one grouped GEMM, a group a run.
    fn grouped_gemm(
        &self,
        (w, m): (WeightRef<'_>, usize),
        (a, kk): (&CudaSlice<u16>, usize),
        out: &mut CudaSlice<u16>,
        runs: &[(usize, usize, usize)],
    ) -> Result<(), DeviceError> {
        if let WeightRef::E4m3 { codes, scales } = w {
            if self.moe_fp8_cublaslt((codes, scales, m), (a, kk), out, runs)? {
                return Ok(());
            }
        }
        let (ap, _ga) = a.device_ptr(&self.stream);
        let (op, _go) = out.device_ptr_mut(&self.stream);
        // Row-major out[c, m] = a[c, kk] · W[m, kk]ᵀ is column-major outᵀ = Wᵀ(as kk×m, T) · aᵀ
        // (kk×c): cuBLAS's A is W, its B the rows, as in `gemm`.
        // Byte addresses of bf16 element offsets.
        let at = |base: u64, elems: usize| base + 2 * elems as u64;
        let own_tiles = self.options.moe_gemm_own_tiles;
        let (own, runs): (Vec<_>, Vec<_>) = runs.iter().partition(|&&(_, _, c)| {
            matches!(w, WeightRef::E4m3 { .. }) || own_gemm_tiles(m, c) >= own_tiles
        });
        // out[s.., m] = a[s.., kk] · Wᵀ for c rows from s, W at device address wp.
        let gemm_at = |wp: u64, s: usize, c: usize| {
            let addr = (wp, at(ap, s * kk), at(op, s * m));
            // SAFETY: the caller's wp addresses an m × kk bf16 block of a live allocation held
            // across the call; sorted rows s..s + c of `a` (kk wide) and of `out` (m wide) lie
            // inside their live allocations (guards above) on the handle's stream.
            unsafe { self.gemm_bf16_at(addr, (m, c, kk), blas_sys::cudaDataType_t::CUDA_R_16BF) }
        };
        let w = match w {
            WeightRef::Bf16(w) => w,
            WeightRef::E4m3 { codes, scales } => {
                // One expert at a time, dequantized into one buffer for its GEMM (stream order
                // keeps each fill behind the GEMM reading the last).
                if own.is_empty() {
                    return Ok(());
                }
                let mut buf = self.alloc_bf16(m * kk, "moe dequantized expert")?;
                for &(x, s, c) in &own {
                    self.timed("↳ moe: dequantize an expert", || {
                        let block = codes.slice(x * m * kk..(x + 1) * m * kk);
                        let rows = scales.slice(x * m..(x + 1) * m);
                        self.launch_dequantize_rows_e4m3(&block, &rows, &mut buf, (m, kk))
                    })?;
                    let (wp, _gw) = buf.device_ptr(&self.stream);
                    gemm_at(wp, s, c)?;
                }
                return Ok(());
            }
        };
        let (wp, _gw) = w.device_ptr(&self.stream);
        for &(x, s, c) in &own {
            gemm_at(at(wp, x * m * kk), s, c)?;
        }
        let g = runs.len();
        if g == 0 {
            return Ok(());
        }
        let a_ptrs: Vec<u64> = runs.iter().map(|&(x, _, _)| at(wp, x * m * kk)).collect();
        let b_ptrs: Vec<u64> = runs.iter().map(|&(_, s, _)| at(ap, s * kk)).collect();
        let c_ptrs: Vec<u64> = runs.iter().map(|&(_, s, _)| at(op, s * m)).collect();
        // cuBLAS reads the pointer arrays from device memory; the shapes from the host.
        let up = |v: Vec<u64>| {
            self.stream
                .clone_htod(&v)
                .map_err(op_err("moe grouped gemm"))
        };
        let (a_dev, b_dev, c_dev) = (up(a_ptrs)?, up(b_ptrs)?, up(c_ptrs)?);
        let (apa, _g1) = a_dev.device_ptr(&self.stream);
        let (bpa, _g2) = b_dev.device_ptr(&self.stream);
        let (cpa, _g3) = c_dev.device_ptr(&self.stream);
        let ta = vec![blas_sys::cublasOperation_t::CUBLAS_OP_T; g];
        let tb = vec![blas_sys::cublasOperation_t::CUBLAS_OP_N; g];
        let ms = vec![m as i32; g];
        let ns: Vec<i32> = runs.iter().map(|&(_, _, c)| c as i32).collect();
        let ks = vec![kk as i32; g];
        let (alpha, beta) = (vec![1.0f32; g], vec![0.0f32; g]);
        let (lda, ldb, ldc) = (vec![kk as i32; g], vec![kk as i32; g], vec![m as i32; g]);
        let sizes = vec![1i32; g];
        // SAFETY: every pointer addresses a live allocation on the handle's stream within its
        // bounds (run s..s + c of the sorted rows, expert x's block of the weights); the host
        // arrays hold g entries each and outlive the call; the pointer arrays are device
        // copies kept (with their guards) until after it is enqueued, freed in stream order.
        let status = unsafe {
            blas_sys::cublasGemmGroupedBatchedEx(
                *self.blas.handle.handle(),
                ta.as_ptr(),
                tb.as_ptr(),
                ms.as_ptr(),
                ns.as_ptr(),
                ks.as_ptr(),
                alpha.as_ptr().cast(),
                apa as *const *const std::ffi::c_void,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                lda.as_ptr(),
                bpa as *const *const std::ffi::c_void,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                ldb.as_ptr(),
                beta.as_ptr().cast(),
                cpa as *const *mut std::ffi::c_void,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                ldc.as_ptr(),
                g as i32,
                sizes.as_ptr(),
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            )
        };
        if status != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(DeviceError::Op {
                device: DEV,
                op: "cublasGemmGroupedBatchedEx",
                msg: format!("{status:?}"),
            });
        }
        Ok(())
    }

    /// FP8 experts' runs through cuBLASLt's FP8 GEMM: the sorted rows quantized per token (as
    /// the dense FP8 GEMMs quantize theirs), each run's codes times its expert's codes on a
    /// padded row count (a few dozen plans per weight shape), all into one bf16 product, then
    /// every row scaled by its expert's weight scales and its own in one launch. `Ok(false)`
    /// (nothing done) where this does not apply: no cuBLASLt, shapes not multiples of 16, or no
    /// algorithm for a run's shape.
    fn moe_fp8_cublaslt(
        &self,
        (codes, w_scale, m): (&CudaSlice<u8>, &CudaSlice<f32>, usize),
        (a, kk): (&CudaSlice<u16>, usize),
        out: &mut CudaSlice<u16>,
        runs: &[(usize, usize, usize)],
    ) -> Result<bool, DeviceError> {
        let Some(Some(lt)) = self.fp8_gemm.get() else {
            return Ok(false);
        };
        let rows: usize = runs.iter().map(|&(_, _, c)| c).sum();
        if rows == 0 || rows > 65535 || !m.is_multiple_of(16) || !kk.is_multiple_of(16) {
            return Ok(false);
        }
        for &(_, _, c) in runs {
            if !lt.supports((m, fp8_padded_rows(c), kk, true))? {
                return Ok(false);
            }
        }
        // Runs lie in order over the sorted rows; the last one's padded product reaches
        // furthest, so both buffers end there.
        let end = runs
            .iter()
            .map(|&(_, s, c)| s + fp8_padded_rows(c))
            .max()
            .unwrap_or(rows);
        let mut x_codes = self.alloc_out::<u8>(end * kk, "moe FP8 activations")?;
        let mut x_scale = self.alloc_f32(rows, "moe FP8 activation scales")?;
        self.timed("↳ fp8: quantize activations", || {
            self.launch_quantize_rows_e4m3(false, a, &mut x_codes, &mut x_scale, (rows, kk))
        })?;
        let mut raw = self.alloc_bf16(end * m, "moe FP8 product")?;
        self.timed("↳ fp8: cuBLASLt product", || {
            let (wp, _g1) = codes.device_ptr(&self.stream);
            let (xp, _g2) = x_codes.device_ptr(&self.stream);
            let (dp, _g3) = raw.device_ptr_mut(&self.stream);
            for &(x, s, c) in runs {
                let addr = (
                    wp + (x * m * kk) as u64,
                    xp + (s * kk) as u64,
                    dp + 2 * (s * m) as u64,
                );
                // SAFETY: expert x's m × kk codes lie in `codes` (x < E, the weight's E·m rows);
                // rows s..s + pad(c) of the activation codes and of the product lie inside
                // `end` rows (the buffers' size); kk and m are multiples of 16, so every address
                // is 16-byte aligned; the guards keep all three live until the launches are
                // enqueued on this stream. A run's padding rows land on the next run's first
                // rows, which that run's product (issued after it on the stream) rewrites.
                let done =
                    unsafe { lt.matmul_at(&self.stream, addr, (m, fp8_padded_rows(c), kk, true)) }?;
                if !done {
                    return Err(DeviceError::Op {
                        device: DEV,
                        op: "moe FP8 GEMM",
                        msg: format!("cuBLASLt lost its plan for {c} rows of {m} × {kk}"),
                    });
                }
            }
            Ok(())
        })?;
        let w_first: Vec<u32> = runs
            .iter()
            .flat_map(|&(x, _, c)| std::iter::repeat_n((x * m) as u32, c))
            .collect();
        self.timed("↳ fp8: scales", || {
            self.launch_fp8_scale_rows(&raw, (w_scale, &w_first, &x_scale), out, (rows, m))
        })?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_sort_by_expert_stably_with_each_run_and_its_inverse() {
        // Pairs 0..6 routed to experts 2, 0, 2, 3, 0, 2 of 5 (expert 1 and 4 untouched).
        let r = expert_runs(&[2, 0, 2, 3, 0, 2], 5).unwrap();
        assert_eq!(r.order, vec![1, 4, 0, 2, 5, 3]);
        assert_eq!(r.runs, vec![(0, 0, 2), (2, 2, 3), (3, 5, 1)]);
        for (j, &p) in r.order.iter().enumerate() {
            assert_eq!(r.pos[p as usize] as usize, j);
        }
        assert!(expert_runs(&[0, 5], 5)
            .unwrap_err()
            .to_string()
            .contains("expert 5 of 5"));
        assert!(expert_runs(&[-1], 5).is_err());
        assert_eq!(expert_runs(&[], 3).unwrap().runs, vec![]);
    }
}
