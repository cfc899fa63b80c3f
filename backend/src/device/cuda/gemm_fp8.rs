//! FP8 GEMMs through cuBLASLt for steps of more rows than the FP8 GEMV takes (batched decode,
//! prefill): the activations are quantized to e4m3 with one scale per token (a launch of
//! `quantize_act_rows_e4m3`; the weights were quantized at load by the exact
//! `quantize_rows_e4m3`), cuBLASLt multiplies the e4m3 codes on the
//! tensor cores with unit scales into bf16 (f32 where the result is f32), and `fp8_scale_out`
//! applies the weight row's and the token's scale
//! on the way to the result. No bf16 copy of the weights is ever made, so a step reads
//! each weight byte once. (cuBLASLt's own per-row scaling, `OUTER_VEC_32F`, is refused on the
//! H200's library — CUBLAS_STATUS_INVALID_VALUE from the heuristic for every shape — so the
//! scales are an epilogue launch of ours.)
//!
//! Each (weight rows, tokens, columns) gets a plan — descriptors, layouts and the algorithm
//! cuBLASLt's heuristic picked — made on first use and kept (host work only, so capturing a CUDA
//! graph never plans); the caller pads the token count to a few dozen sizes, so the plans stay
//! few. Where cuBLASLt offers no algorithm, the plan says so once in the log and
//! the caller falls back to dequantizing the weights for cuBLAS.
//!
//! The heuristic's first algorithm is used as it comes: timing up to a dozen candidates per
//! shape found the best within 0–8% of it (batch 256 unchanged, batch 64 −2 to −3% on the H200),
//! and accumulating in the tensor cores' fast mode made prefill 2–5% faster with no batched
//! decode gain; both were measured and dropped (BENCHMARKS-HISTORY.md).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublaslt::sys as lt;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::{op_err, DEV};
use crate::error::DeviceError;

/// cuBLASLt workspace (what NVIDIA recommends for Hopper).
const LT_WORKSPACE: usize = 32 << 20;

fn lt_err(op: &'static str, status: lt::cublasStatus_t) -> DeviceError {
    DeviceError::Op {
        device: DEV,
        op,
        msg: format!("{status:?}"),
    }
}

fn check(op: &'static str, status: lt::cublasStatus_t) -> Result<(), DeviceError> {
    match status {
        lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        s => Err(lt_err(op, s)),
    }
}

/// The shape of one product: weight rows (output features), tokens, columns, and whether it is
/// written in bf16 (else f32).
pub type Shape = (usize, usize, usize, bool);

struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    d: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each was created once by `Fp8Gemm::plan` (null: not created, a plan given up
        // half-made) and is destroyed once here.
        unsafe {
            for l in [self.a, self.b, self.d] {
                if !l.is_null() {
                    lt::cublasLtMatrixLayoutDestroy(l);
                }
            }
            if !self.desc.is_null() {
                lt::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

/// A cuBLASLt handle with its workspace and the plans made so far (`None`: no algorithm).
pub struct Fp8Gemm {
    handle: lt::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: RefCell<HashMap<Shape, Option<Plan>>>,
}

impl Drop for Fp8Gemm {
    fn drop(&mut self) {
        self.plans.borrow_mut().clear();
        // SAFETY: created in `new`, destroyed once, after every plan made with it.
        unsafe { lt::cublasLtDestroy(self.handle) };
    }
}

/// An output buffer of the FP8 product (after its scales).
pub enum Fp8Out<'a> {
    Bf16(&'a mut CudaSlice<u16>),
    F32(&'a mut CudaSlice<f32>),
}

/// cuBLASLt's product of the codes (unit scales), before the epilogue.
pub enum Fp8Product<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<u16>),
}

impl Fp8Gemm {
    /// `None` when libcublasLt cannot be loaded (the dequantizing path serves then).
    pub fn new(stream: &Arc<CudaStream>) -> Result<Option<Self>, DeviceError> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { lt::is_culib_present() } {
            tracing::warn!("libcublasLt not found: FP8 weights are dequantized for steps of more than a few rows");
            return Ok(None);
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer.
        check("cublasLtCreate", unsafe { lt::cublasLtCreate(&mut handle) })?;
        // SAFETY: u8 has no invalid bit patterns and cuBLASLt only writes its workspace.
        let workspace =
            unsafe { stream.alloc::<u8>(LT_WORKSPACE) }.map_err(op_err("cublasLt workspace"))?;
        Ok(Some(Fp8Gemm {
            handle,
            workspace,
            plans: RefCell::new(HashMap::new()),
        }))
    }

    /// Makes the plan of a shape; `Ok(None)` when cuBLASLt has no algorithm for it.
    fn plan(&self, (m, n, k, bf16): Shape) -> Result<Option<Plan>, DeviceError> {
        let f8 = lt::cudaDataType::CUDA_R_8F_E4M3;
        let out_type = if bf16 {
            lt::cudaDataType::CUDA_R_16BF
        } else {
            lt::cudaDataType::CUDA_R_32F
        };
        // Filled in below; whatever was made is destroyed with it if a step fails.
        let mut plan = Plan {
            desc: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: a plain C struct of integers; overwritten by the heuristic's pick below.
            algo: unsafe { std::mem::zeroed() },
        };
        // SAFETY: valid out-pointer; the enums are the library's own.
        check("cublasLtMatmulDescCreate", unsafe {
            lt::cublasLtMatmulDescCreate(
                &mut plan.desc,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt::cudaDataType::CUDA_R_32F,
            )
        })?;
        let desc = plan.desc;
        let layout = |l: &mut lt::cublasLtMatrixLayout_t, t, rows: usize, cols: usize| {
            // SAFETY: valid out-pointer; column-major, leading dimension = rows.
            check("cublasLtMatrixLayoutCreate", unsafe {
                lt::cublasLtMatrixLayoutCreate(l, t, rows as u64, cols as u64, rows as i64)
            })
        };
        // Row-major out[n, m] = x[n, k] · w[m, k]ᵀ is column-major outᵀ[m, n] = op(A)·B with A
        // the weights seen as k×m (transposed: FP8 takes only this "TN" form) and B = x as k×n.
        layout(&mut plan.a, f8, k, m)?;
        layout(&mut plan.b, f8, k, n)?;
        layout(&mut plan.d, out_type, m, n)?;
        let set = |attr, v: &i32| {
            // SAFETY: every attribute set here is an int32 of the library's enums.
            check("cublasLtMatmulDescSetAttribute", unsafe {
                lt::cublasLtMatmulDescSetAttribute(
                    desc,
                    attr,
                    (v as *const i32).cast(),
                    std::mem::size_of::<i32>(),
                )
            })
        };
        const OP_T: i32 = 1; // cublasOperation_t::CUBLAS_OP_T
        set(
            lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &OP_T,
        )?;
        let mut pref = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cublasLtMatmulPreferenceCreate", unsafe {
            lt::cublasLtMatmulPreferenceCreate(&mut pref)
        })?;
        let ws = LT_WORKSPACE as u64;
        // SAFETY: the attribute is a u64 byte count.
        let pref_status = unsafe {
            lt::cublasLtMatmulPreferenceSetAttribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        let wanted = 1;
        // SAFETY: an all-zero heuristic result is a valid value of this C struct.
        let mut found: Vec<lt::cublasLtMatmulHeuristicResult_t> =
            (0..wanted).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut count = 0i32;
        // SAFETY: live descriptors and layouts; `wanted` result slots.
        let status = unsafe {
            lt::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                desc,
                plan.a,
                plan.b,
                plan.d,
                plan.d,
                pref,
                wanted as i32,
                found.as_mut_ptr(),
                &mut count,
            )
        };
        // SAFETY: created above, destroyed once.
        unsafe { lt::cublasLtMatmulPreferenceDestroy(pref) };
        check("cublasLtMatmulPreferenceSetAttribute", pref_status)?;
        let returned = if status == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            (count.max(0) as usize).min(wanted)
        } else {
            0
        };
        let Some(first) = found[..returned]
            .iter()
            .find(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
        else {
            tracing::warn!(
                m, n, k, ?status, state = ?found[0].state,
                "cuBLASLt has no FP8 algorithm for this shape; its weights are dequantized for cuBLAS"
            );
            return Ok(None);
        };
        plan.algo = first;
        Ok(Some(plan))
    }

    /// The plan of `shape` in `plans`, made now if it was not (`None`: no algorithm).
    fn planned<'p>(
        &self,
        plans: &'p mut HashMap<Shape, Option<Plan>>,
        shape: Shape,
    ) -> Result<&'p mut Option<Plan>, DeviceError> {
        Ok(match plans.entry(shape) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(shape)?),
        })
    }

    /// Whether cuBLASLt has an algorithm for `shape` (planned now if it was not).
    pub fn supports(&self, shape: Shape) -> Result<bool, DeviceError> {
        Ok(self.planned(&mut self.plans.borrow_mut(), shape)?.is_some())
    }

    /// `raw = x · wᵀ` over the codes (unit scales), f32 or bf16 `[n, m]`; `Ok(false)` when
    /// cuBLASLt has no algorithm for the shape (nothing was launched).
    pub fn matmul(
        &self,
        stream: &Arc<CudaStream>,
        (w, x): (&CudaSlice<u8>, &CudaSlice<u8>),
        (m, n, k): (usize, usize, usize),
        raw: Fp8Out<'_>,
    ) -> Result<bool, DeviceError> {
        let (raw_len, bf16) = match &raw {
            Fp8Out::F32(r) => (r.len(), false),
            Fp8Out::Bf16(r) => (r.len(), true),
        };
        if w.len() < m * k || x.len() < n * k || raw_len < n * m {
            return Err(DeviceError::Op {
                device: DEV,
                op: "cublasLtMatmul",
                msg: format!("buffers too short for {n}×{k} · ({m}×{k})ᵀ"),
            });
        }
        let (wp, _g1) = w.device_ptr(stream);
        let (xp, _g2) = x.device_ptr(stream);
        let (dp, _g4) = match raw {
            Fp8Out::F32(r) => r.device_ptr_mut(stream),
            Fp8Out::Bf16(r) => r.device_ptr_mut(stream),
        };
        // SAFETY: the operands hold m·k and n·k codes and the output n·m values of the shape's
        // type (checked above), all on this stream, borrowed until the product is enqueued.
        unsafe { self.matmul_at(stream, (wp, xp, dp), (m, n, k, bf16)) }
    }

    /// [`Self::matmul`] on device addresses: `raw[n, m] = x[n, k] · w[m, k]ᵀ` over the codes,
    /// bf16 or f32 as `shape` says; `Ok(false)` when cuBLASLt has no algorithm for the shape.
    ///
    /// # Safety
    /// `wp`, `xp` and `dp` address m·k codes, n·k codes and n·m outputs of the shape's type in
    /// allocations that stay live on `stream` until the product has run.
    pub unsafe fn matmul_at(
        &self,
        stream: &Arc<CudaStream>,
        (wp, xp, dp): (u64, u64, u64),
        shape: Shape,
    ) -> Result<bool, DeviceError> {
        let mut plans = self.plans.borrow_mut();
        let Some(plan) = self.planned(&mut plans, shape)?.as_ref() else {
            return Ok(false);
        };
        let (wkp, _g3) = self.workspace.device_ptr(stream);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the operands hold m·k and n·k codes and the output n·m values of the plan's type
        // (the caller's contract), all on this stream; the workspace is LT_WORKSPACE bytes;
        // alpha/beta outlive the call; the algorithm is the heuristic's for this plan.
        let status = unsafe {
            lt::cublasLtMatmul(
                self.handle,
                plan.desc,
                (&alpha as *const f32).cast(),
                wp as *const _,
                plan.a,
                xp as *const _,
                plan.b,
                (&beta as *const f32).cast(),
                dp as *const _,
                plan.d,
                dp as *mut _,
                plan.d,
                &plan.algo,
                wkp as *mut _,
                LT_WORKSPACE,
                stream.cu_stream() as lt::cudaStream_t,
            )
        };
        check("cublasLtMatmul", status)?;
        Ok(true)
    }
}
