//! The kernel table: every function of `kernels/` loaded from one NVRTC-compiled CUBIN, its
//! shared-memory attributes set, and the launch constants that must match the `.cu` sources.

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute::{
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
};
use cudarc::driver::{CudaContext, CudaFunction};

use super::{op_err, DEV};
use crate::error::DeviceError;

// Must match attention.cu.
pub const ATT_THREADS: u32 = 128;
/// Tokens of one attention query tile.
pub const ATT_TQ: usize = 32;
/// Keys of one K/V tile.
pub const ATT_TK: usize = 64;
pub const ATT_MAXD: usize = 128;
/// Most head_dim of the wide CUDA-core kernels (`paged_attention_d256_*`, ATT_MAXD_WIDE).
pub const ATT_MAXD_WIDE: usize = 256;
/// Query rows (tokens × GQA group) per block of the tensor-core kernel (MMA_TQ in attention_mma.cu).
pub const MMA_ROWS: usize = 64;
/// Threads per block of the tensor-core kernel (four warps of 16 rows).
pub const MMA_THREADS: u32 = 128;

/// Threads per block of the tensor-core kernel for head_dim `d` (MMA_KGROUPS in attention_mma.cu):
/// head_dim 256 runs two key groups of four warps over the same 64 rows.
pub fn mma_threads(d: usize) -> u32 {
    if d > 128 {
        2 * MMA_THREADS
    } else {
        MMA_THREADS
    }
}
/// Blocks of the tensor-core kernel resident per SM (its __launch_bounds__ minimum).
pub const MMA_BLOCKS_PER_SM: usize = 3;
/// Blocks of the CUDA-core attention kernel resident per SM.
pub const SIMT_BLOCKS_PER_SM: usize = 2;
/// Threads of a combine block (COMBINE_THREADS in attention.cu): four per output element.
pub const COMBINE_THREADS: u32 = 512;
/// Output elements a combine block merges (COMBINE_ELEMS).
pub const COMBINE_ELEMS: usize = 128;

/// Rows of input each GEMV instantiation takes (gemv.cu's `_r{R}` kernels), smallest first.
pub const GEMV_ROWS: [usize; 3] = [1, 2, 4];
/// Rows served by gemv.cu unless CACHET_GEMV says otherwise: up to two. Measured on the H200
/// (8B shape, CUDA graphs): 1 row 4.46 vs 4.87 ms a step with cuBLAS, 2 rows 4.66 vs 4.93 ms,
/// but 4 rows 5.33 vs 5.04 ms (cuBLAS hardly slows from 1 to 4 rows; the GEMV's arithmetic
/// per weight grows with the rows).
pub const GEMV_DEFAULT_ROWS: usize = 2;
/// The same for FP8 weights (`CACHET_GEMV_FP8`): up to two as well. Measured on the H200 (8B
/// shape, FP8 weights + FP8 KV, ctx 1280, CUDA graphs, BENCHMARKS.md §1): 3 and 4 rows take
/// 5.01–5.05 ms a step on the GEMV against 3.74–3.77 on cuBLASLt's FP8 product; 2 rows 3.45
/// either way.
pub const GEMV_FP8_DEFAULT_ROWS: usize = 2;
/// Threads of a GEMV block (GEMV_THREADS in gemv.cu); one block per SM.
pub const GEMV_THREADS: u32 = 512;
/// Most experts the routing and sorting kernels take (MOE_MAX_EXPERTS in moe.cu).
pub const MOE_MAX_EXPERTS: usize = 512;
/// Most experts a token goes to on the few-row path (MOE_MAX_K).
pub const MOE_MAX_K: usize = 8;
/// Threads of an expert GEMV block (a warp per output row).
pub const MOE_THREADS: u32 = 256;
/// Rows of a grouped-GEMM tile (its three instantiations), its columns and k step (MOE_BN,
/// MOE_BK in moe.cu).
pub const MOE_BMS: [usize; 3] = [16, 64, 128];
pub const MOE_BN: usize = 128;
pub const MOE_BK: usize = 32;
/// The FP8 × FP8 grouped GEMM's k step (MOE_BK8): 64 codes, the same 64 bytes a row.
pub const MOE_BK8: usize = 64;

/// Threads of a grouped-GEMM block of `bm` rows: four warps per 64 rows (16-row tiles: four
/// warps, each over the tile's rows).
pub fn moe_gemm_threads(bm: usize) -> u32 {
    ((bm / 64).max(1) * 128) as u32
}

/// Shared memory of a grouped-GEMM block of `bm` rows: three stages of A and B tiles, rows of
/// 40 bf16 (MOE_STAGES, MOE_SK); with FP8 weights (`fp8`) three stages of A, one widened B tile
/// and three stages of B's codes (MOE_BK bytes a row).
pub fn moe_gemm_smem_bytes(bm: usize, fp8: bool) -> u32 {
    let bytes = if fp8 {
        3 * bm * 40 * 2 + MOE_BN * 40 * 2 + 3 * MOE_BN * MOE_BK
    } else {
        3 * (bm + MOE_BN) * 40 * 2
    };
    bytes as u32
}
/// Most shared memory a fused-norm GEMV may take for its normalised inputs (R · k bf16).
pub const GEMV_SMEM_MAX: usize = 96 << 10;

/// Shared memory of the tensor-core kernel (attention_mma.cu): two stages of K and V tiles in
/// bf16 (Q is staged in the second before the loop; at d = 256 it keeps a region of its own).
pub fn mma_smem_bytes(d: usize) -> u32 {
    let q = if d > 128 { MMA_ROWS * (d + 8) * 2 } else { 0 };
    (4 * ATT_TK * (d + 8) * 2 + q) as u32
}

/// Shared memory of the FP8 tensor-core kernels: one bf16 K/V tile and two raw stages of K and V
/// codes (Q is staged in the raw stages before the loop).
pub fn mma_fp8_smem_bytes(d: usize) -> u32 {
    (2 * ATT_TK * (d + 8) * 2 + 4 * ATT_TK * d) as u32
}

/// Shared memory of the FP8 cache's transposed decode kernels (`paged_attention_mma_*_fp8_dec`):
/// three raw stages of K and V codes, which also hold Q before the loop and the warps' partial
/// outputs after it.
pub fn mma_fp8_dec_smem_bytes(d: usize) -> u32 {
    let stages = 3 * 2 * ATT_TK * d;
    let q = MMA_ROWS * (d + 8) * 2;
    let merge = 4 * (d / 16) * 4 * 32 * 4 + 4 * 4 * 32 * 4;
    stages.max(q).max(merge) as u32
}

/// Shared memory of the CUDA-core attention kernel (attention.cu).
pub fn attention_smem_bytes(d: usize) -> u32 {
    ((ATT_TQ * (d + 1) + 2 * ATT_TK * (d + 1) + ATT_TQ * ATT_TK) * 4) as u32
}

/// Every kernel, by the symbol it is loaded from.
pub struct Kernels {
    pub rms_norm: CudaFunction,
    pub add_rms_norm: CudaFunction,
    pub add_bias: CudaFunction,
    pub embed: CudaFunction,
    /// The gated activations by [`crate::config::Activation`] (SwiGLU, GeGLU): any width, and
    /// 8 elements per thread (widths that are multiples of 8).
    pub glu: [CudaFunction; 2],
    pub glu_x8: [CudaFunction; 2],
    pub gather_rows: CudaFunction,
    pub rope_kv: CudaFunction,
    pub rope_kv_fp8: CudaFunction,
    pub rope_kv_int8: CudaFunction,
    pub attention: CudaFunction,
    pub attention_fp8: CudaFunction,
    pub attention_int8: CudaFunction,
    pub attention_d256: CudaFunction,
    pub attention_d256_fp8: CudaFunction,
    pub attention_d256_int8: CudaFunction,
    pub attention_mma_d64: CudaFunction,
    pub attention_mma_d128: CudaFunction,
    pub attention_mma_d256: CudaFunction,
    pub attention_mma_d64_fp8: CudaFunction,
    pub attention_mma_d128_fp8: CudaFunction,
    /// The FP8 cache's transposed decode (steps of at most 8 query rows a block), d = 64, 128.
    pub attention_mma_fp8_dec: [CudaFunction; 2],
    /// The same for the bf16 cache, d = 64, 128.
    pub attention_mma_bf16_dec: [CudaFunction; 2],
    pub attention_mma_d64_int8: CudaFunction,
    pub attention_mma_d128_int8: CudaFunction,
    pub combine: CudaFunction,
    pub fill_normal: CudaFunction,
    pub sample: CudaFunction,
    pub edit_logits: CudaFunction,
    pub mask_logits: CudaFunction,
    pub logprobs: CudaFunction,
    /// gemv.cu by weight format (bf16, then e4m3 with row scales), one per entry of GEMV_ROWS.
    pub gemv: [[CudaFunction; 3]; 2],
    /// gemv.cu's bf16-weight GEMV into f32 (a MoE router's logits), one per entry of GEMV_ROWS.
    pub gemv_f32out: [CudaFunction; 3],
    pub gemv_norm: [[CudaFunction; 3]; 2],
    /// The norm + GEMV into f32 that also writes the normalised rows out (a MoE router over the
    /// layer's input, bf16 weights), one per entry of GEMV_ROWS.
    pub gemv_norm_f32out: [CudaFunction; 3],
    /// The gated MLP variants by weight format, then [`crate::config::Activation`]: SwiGLU,
    /// then GeGLU.
    pub gemv_norm_glu: [[[CudaFunction; 3]; 2]; 2],
    /// FP8 weights: bf16 rows to e4m3 codes with row scales, and back to bf16.
    pub quantize_rows_e4m3: CudaFunction,
    /// A GEMM's input rows to e4m3 with row scales (each row read once, vectorized).
    pub quantize_act_rows_e4m3: CudaFunction,
    /// A sub-layer's norm (with its residual add) straight into e4m3 codes and row scales.
    pub rms_norm_e4m3: CudaFunction,
    pub dequantize_rows_e4m3: CudaFunction,
    /// The FP8 GEMM's epilogue: row and token scales applied, from an f32 product into bf16 or
    /// f32, and from a bf16 product into bf16.
    pub fp8_scale_out: [CudaFunction; 3],
    /// The bf16 product's epilogue where each row has weight scales of its own (a mixture's
    /// rows sorted by expert).
    pub fp8_scale_rows: CudaFunction,
    /// The FP8 gate|up product's epilogue with the gated activation, by
    /// [`crate::config::Activation`]: scaled and activated in one pass, bf16 → bf16.
    pub fp8_scale_glu: [CudaFunction; 2],
    /// Mixture of experts (moe.cu): routing; the few-row path's gate|up + SwiGLU and weighted
    /// down by weight format (bf16, e4m3); the many-row path's sort by expert, grouped GEMM and
    /// weighted combine.
    pub moe_route: CudaFunction,
    pub moe_gate_up: [CudaFunction; 2],
    pub moe_down: [CudaFunction; 2],
    pub moe_sort: CudaFunction,
    /// The grouped GEMM, `[weight format (bf16, e4m3)][tile rows (MOE_BMS)]`.
    pub moe_gemm: [[CudaFunction; 3]; 2],
    /// The grouped GEMM of e4m3 inputs and e4m3 weights on FP8 tensor cores (sm_89+), for the
    /// 16- and 64-row tiles (128-row tiles widen the weights: moe.rs says why).
    pub moe_gemm_f8f8: [CudaFunction; 2],
    pub moe_combine: CudaFunction,
}

/// What loading the kernels found.
pub struct Loaded {
    pub kernels: Kernels,
    /// Whether the CUBIN came from the disk cache.
    pub from_cache: bool,
}

/// gemv.cu's `{kind}_{fmt}_r{R}` for every R of GEMV_ROWS.
fn gemv_set(
    f: &impl Fn(&str) -> Result<CudaFunction, DeviceError>,
    kind: &str,
    fmt: &str,
) -> Result<[CudaFunction; 3], DeviceError> {
    Ok([
        f(&format!("{kind}_{fmt}_r1"))?,
        f(&format!("{kind}_{fmt}_r2"))?,
        f(&format!("{kind}_{fmt}_r4"))?,
    ])
}

fn smem(func: &CudaFunction, bytes: u32) -> Result<(), DeviceError> {
    func.set_attribute(
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(op_err("kernel shared memory"))
}

impl Kernels {
    /// Compiles (or loads from `cache`) the kernels for `arch` and loads every function.
    pub fn load(
        ctx: &Arc<CudaContext>,
        arch: &str,
        cache: Option<&Path>,
        source_dir: Option<&Path>,
    ) -> Result<Loaded, DeviceError> {
        let compiled = cachet_kernels::compile::compile(arch, cache, source_dir).map_err(|e| {
            DeviceError::Driver {
                device: DEV,
                op: "compile kernels",
                source: Box::new(e),
            }
        })?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin))
            .map_err(op_err("load kernels"))?;
        let f = |name: &str| module.load_function(name).map_err(op_err("load kernel"));
        let k = Kernels {
            rms_norm: f("rms_norm_bf16")?,
            add_rms_norm: f("add_rms_norm_bf16")?,
            add_bias: f("add_bias_bf16")?,
            embed: f("embed_bf16")?,
            glu: [f("silu_mul_bf16")?, f("gelu_tanh_mul_bf16")?],
            glu_x8: [f("silu_mul_bf16x8")?, f("gelu_tanh_mul_bf16x8")?],
            gather_rows: f("gather_rows_bf16")?,
            rope_kv: f("rope_kv_bf16")?,
            rope_kv_fp8: f("rope_kv_fp8")?,
            rope_kv_int8: f("rope_kv_int8")?,
            attention: f("paged_attention_bf16")?,
            attention_fp8: f("paged_attention_fp8")?,
            attention_int8: f("paged_attention_int8")?,
            attention_d256: f("paged_attention_d256_bf16")?,
            attention_d256_fp8: f("paged_attention_d256_fp8")?,
            attention_d256_int8: f("paged_attention_d256_int8")?,
            attention_mma_d64: f("paged_attention_mma_d64_bf16")?,
            attention_mma_d128: f("paged_attention_mma_d128_bf16")?,
            attention_mma_d256: f("paged_attention_mma_d256_bf16")?,
            attention_mma_d64_fp8: f("paged_attention_mma_d64_fp8")?,
            attention_mma_d128_fp8: f("paged_attention_mma_d128_fp8")?,
            attention_mma_fp8_dec: [
                f("paged_attention_mma_d64_fp8_dec")?,
                f("paged_attention_mma_d128_fp8_dec")?,
            ],
            attention_mma_bf16_dec: [
                f("paged_attention_mma_d64_bf16_dec")?,
                f("paged_attention_mma_d128_bf16_dec")?,
            ],
            attention_mma_d64_int8: f("paged_attention_mma_d64_int8")?,
            attention_mma_d128_int8: f("paged_attention_mma_d128_int8")?,
            combine: f("attention_combine_bf16")?,
            fill_normal: f("fill_normal_bf16")?,
            sample: f("sample_f32")?,
            edit_logits: f("edit_logits_f32")?,
            mask_logits: f("mask_logits_f32")?,
            logprobs: f("logprobs_f32")?,
            gemv: [gemv_set(&f, "gemv", "bf16")?, gemv_set(&f, "gemv", "e4m3")?],
            gemv_f32out: gemv_set(&f, "gemv_f32out", "bf16")?,
            gemv_norm_f32out: gemv_set(&f, "gemv_norm_f32out", "bf16")?,
            gemv_norm: [
                gemv_set(&f, "gemv_norm", "bf16")?,
                gemv_set(&f, "gemv_norm", "e4m3")?,
            ],
            gemv_norm_glu: [
                [
                    gemv_set(&f, "gemv_norm_swiglu", "bf16")?,
                    gemv_set(&f, "gemv_norm_geglu", "bf16")?,
                ],
                [
                    gemv_set(&f, "gemv_norm_swiglu", "e4m3")?,
                    gemv_set(&f, "gemv_norm_geglu", "e4m3")?,
                ],
            ],
            quantize_rows_e4m3: f("quantize_rows_e4m3")?,
            quantize_act_rows_e4m3: f("quantize_act_rows_e4m3")?,
            rms_norm_e4m3: f("rms_norm_e4m3")?,
            dequantize_rows_e4m3: f("dequantize_rows_e4m3")?,
            fp8_scale_out: [
                f("fp8_scale_out_bf16")?,
                f("fp8_scale_out_f32")?,
                f("fp8_scale_bf16_bf16")?,
            ],
            fp8_scale_rows: f("fp8_scale_bf16_bf16_rows")?,
            fp8_scale_glu: [f("fp8_scale_silu_bf16")?, f("fp8_scale_gelu_tanh_bf16")?],
            moe_route: f("moe_route_f32")?,
            moe_gate_up: [f("moe_gate_up_bf16")?, f("moe_gate_up_e4m3")?],
            moe_down: [f("moe_down_bf16")?, f("moe_down_e4m3")?],
            moe_sort: f("moe_sort")?,
            moe_gemm: [
                [
                    f("moe_gemm_bm16_bf16")?,
                    f("moe_gemm_bm64_bf16")?,
                    f("moe_gemm_bm128_bf16")?,
                ],
                [
                    f("moe_gemm_bm16_e4m3")?,
                    f("moe_gemm_bm64_e4m3")?,
                    f("moe_gemm_bm128_e4m3")?,
                ],
            ],
            moe_gemm_f8f8: [f("moe_gemm_bm16_f8f8")?, f("moe_gemm_bm64_f8f8")?],
            moe_combine: f("moe_combine_bf16")?,
        };
        for func in [&k.attention, &k.attention_fp8, &k.attention_int8] {
            smem(func, attention_smem_bytes(ATT_MAXD))?;
        }
        for func in [
            &k.attention_d256,
            &k.attention_d256_fp8,
            &k.attention_d256_int8,
        ] {
            smem(func, attention_smem_bytes(ATT_MAXD_WIDE))?;
        }
        smem(&k.attention_mma_d64, mma_smem_bytes(64))?;
        smem(&k.attention_mma_d128, mma_smem_bytes(128))?;
        smem(&k.attention_mma_d256, mma_smem_bytes(256))?;
        smem(&k.attention_mma_d64_fp8, mma_fp8_smem_bytes(64))?;
        smem(&k.attention_mma_d128_fp8, mma_fp8_smem_bytes(128))?;
        for (func, d) in k.attention_mma_bf16_dec.iter().zip([64, 128]) {
            smem(func, mma_smem_bytes(d))?;
        }
        for (func, d) in k.attention_mma_fp8_dec.iter().zip([64, 128]) {
            smem(func, mma_fp8_dec_smem_bytes(d))?;
            // Four blocks an SM: all the carveout to shared memory.
            func.set_attribute(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
                .map_err(op_err("kernel shared memory carveout"))?;
        }
        smem(&k.attention_mma_d64_int8, mma_fp8_smem_bytes(64))?;
        smem(&k.attention_mma_d128_int8, mma_fp8_smem_bytes(128))?;
        for (funcs, fp8) in k.moe_gemm.iter().zip([false, true]) {
            for (func, bm) in funcs.iter().zip(MOE_BMS) {
                smem(func, moe_gemm_smem_bytes(bm, fp8))?;
            }
        }
        // The FP8 × FP8 kernel's stages are bf16's, byte for byte.
        for (func, bm) in k.moe_gemm_f8f8.iter().zip(MOE_BMS) {
            smem(func, moe_gemm_smem_bytes(bm, false))?;
        }
        let norm_gemvs = k.gemv_norm.iter().flatten().chain(&k.gemv_norm_f32out);
        for func in norm_gemvs.chain(k.gemv_norm_glu.iter().flatten().flatten()) {
            smem(func, GEMV_SMEM_MAX as u32)?;
        }
        Ok(Loaded {
            kernels: k,
            from_cache: compiled.from_cache,
        })
    }
}
