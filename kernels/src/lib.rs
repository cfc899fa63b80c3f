//! Cachet's CUDA C++ kernels, embedded as source and compiled at run time with NVRTC.
//!
//! The `.cu`/`.cuh` files beside this file are compiled for the GPU at hand (sm_90 on H200), so
//! building the workspace needs no CUDA toolkit. Kernel symbols are named `{op}_{dtype}`; every
//! pointer argument is documented in the source as device memory with its shape. bf16 values are
//! carried as raw `u16` bits (no CUDA headers are needed to compile).

pub mod compile;

use std::borrow::Cow;
use std::path::Path;

/// One translation unit.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name, e.g. `rms_norm.cu`.
    pub name: &'static str,
    pub code: &'static str,
    /// `extern "C"` symbols it defines.
    pub symbols: &'static [&'static str],
}

/// The shared header, inlined where a unit says `#include "common.cuh"`.
pub const COMMON: &str = include_str!("common.cuh");

/// Every kernel translation unit.
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "rms_norm.cu",
        code: include_str!("rms_norm.cu"),
        symbols: &["rms_norm_bf16", "add_rms_norm_bf16"],
    },
    KernelSource {
        name: "elementwise.cu",
        code: include_str!("elementwise.cu"),
        symbols: &[
            "embed_bf16",
            "silu_mul_bf16",
            "silu_mul_bf16x8",
            "gather_rows_bf16",
            "fill_normal_bf16",
            "add_bias_bf16",
            "gelu_tanh_mul_bf16",
            "gelu_tanh_mul_bf16x8",
        ],
    },
    KernelSource {
        name: "rope_kv.cu",
        code: include_str!("rope_kv.cu"),
        symbols: &["rope_kv_bf16", "rope_kv_fp8", "rope_kv_int8"],
    },
    KernelSource {
        name: "attention.cu",
        code: include_str!("attention.cu"),
        symbols: &[
            "paged_attention_bf16",
            "paged_attention_fp8",
            "paged_attention_int8",
            "paged_attention_d256_bf16",
            "paged_attention_d256_fp8",
            "paged_attention_d256_int8",
            "attention_combine_bf16",
        ],
    },
    KernelSource {
        name: "attention_mma.cu",
        code: include_str!("attention_mma.cu"),
        symbols: &[
            "paged_attention_mma_d128_bf16",
            "paged_attention_mma_d64_bf16",
            "paged_attention_mma_d128_fp8",
            "paged_attention_mma_d64_fp8",
            "paged_attention_mma_d128_int8",
            "paged_attention_mma_d64_int8",
            "paged_attention_mma_d128_fp8_dec",
            "paged_attention_mma_d64_fp8_dec",
            "paged_attention_mma_d128_bf16_dec",
            "paged_attention_mma_d64_bf16_dec",
            "paged_attention_mma_d256_bf16",
        ],
    },
    KernelSource {
        name: "gemv.cu",
        code: include_str!("gemv.cu"),
        symbols: &[
            "gemv_bf16_r1",
            "gemv_bf16_r2",
            "gemv_bf16_r4",
            "gemv_f32out_bf16_r1",
            "gemv_f32out_bf16_r2",
            "gemv_f32out_bf16_r4",
            "gemv_norm_f32out_bf16_r1",
            "gemv_norm_f32out_bf16_r2",
            "gemv_norm_f32out_bf16_r4",
            "gemv_norm_bf16_r1",
            "gemv_norm_bf16_r2",
            "gemv_norm_bf16_r4",
            "gemv_norm_swiglu_bf16_r1",
            "gemv_norm_swiglu_bf16_r2",
            "gemv_norm_swiglu_bf16_r4",
            "gemv_norm_geglu_bf16_r1",
            "gemv_norm_geglu_bf16_r2",
            "gemv_norm_geglu_bf16_r4",
            "gemv_e4m3_r1",
            "gemv_e4m3_r2",
            "gemv_e4m3_r4",
            "gemv_norm_e4m3_r1",
            "gemv_norm_e4m3_r2",
            "gemv_norm_e4m3_r4",
            "gemv_norm_swiglu_e4m3_r1",
            "gemv_norm_swiglu_e4m3_r2",
            "gemv_norm_swiglu_e4m3_r4",
            "gemv_norm_geglu_e4m3_r1",
            "gemv_norm_geglu_e4m3_r2",
            "gemv_norm_geglu_e4m3_r4",
            "quantize_rows_e4m3",
            "quantize_act_rows_e4m3",
            "rms_norm_e4m3",
            "dequantize_rows_e4m3",
            "fp8_scale_out_bf16",
            "fp8_scale_out_f32",
            "fp8_scale_bf16_bf16",
            "fp8_scale_bf16_bf16_rows",
            "fp8_scale_silu_bf16",
            "fp8_scale_gelu_tanh_bf16",
        ],
    },
    KernelSource {
        name: "moe.cu",
        code: include_str!("moe.cu"),
        symbols: &[
            "moe_route_f32",
            "moe_gate_up_bf16",
            "moe_gate_up_e4m3",
            "moe_down_bf16",
            "moe_down_e4m3",
            "moe_sort",
            "moe_gemm_bm16_bf16",
            "moe_gemm_bm64_bf16",
            "moe_gemm_bm128_bf16",
            "moe_gemm_bm16_e4m3",
            "moe_gemm_bm64_e4m3",
            "moe_gemm_bm128_e4m3",
            "moe_gemm_bm16_f8f8",
            "moe_gemm_bm64_f8f8",
            "moe_combine_bf16",
        ],
    },
    KernelSource {
        name: "sampling.cu",
        code: include_str!("sampling.cu"),
        symbols: &[
            "sample_f32",
            "edit_logits_f32",
            "mask_logits_f32",
            "logprobs_f32",
        ],
    },
];

/// The environment variable the CUDA device reads for a directory whose `.cu`/`.cuh` files replace
/// the embedded ones of the same name (kernel work on a GPU machine without rebuilding the binary;
/// the compile cache is keyed by the resulting source, so nothing stale is loaded). This crate
/// never reads it: callers pass the directory.
pub const SOURCE_DIR_ENV: &str = "CACHET_KERNEL_DIR";

/// `code`, or the file of the same name in `dir` when there is one.
fn unit_code(dir: Option<&Path>, name: &str, code: &'static str) -> Cow<'static, str> {
    let Some(dir) = dir else {
        return code.into();
    };
    match std::fs::read_to_string(dir.join(name)) {
        Ok(s) => s.into(),
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!(
                    "{SOURCE_DIR_ENV}: reading {}: {e}; using the built-in {name}",
                    dir.join(name).display()
                );
            }
            code.into()
        }
    }
}

/// All units as one translation unit (the header once, at the top), with the files of `dir` (a
/// [`SOURCE_DIR_ENV`] directory) in place of the embedded ones where it has them.
pub fn full_source_with(dir: Option<&Path>) -> String {
    let mut s = unit_code(dir, "common.cuh", COMMON).into_owned();
    for unit in SOURCES {
        s.push_str(&format!("\n// ---- {} ----\n", unit.name));
        for line in unit_code(dir, unit.name, unit.code).lines() {
            if line.trim() == "#include \"common.cuh\"" {
                continue;
            }
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}

/// Every kernel symbol.
pub fn symbols() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().flat_map(|s| s.symbols.iter().copied())
}

/// blake3 of a full source: part of the on-disk cache key for compiled modules.
pub fn source_hash(source: &str) -> String {
    blake3::hash(source.as_bytes()).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_dir_replaces_only_the_files_it_has() {
        let dir = std::env::temp_dir().join(format!("cachet-kernel-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("gemv.cu"), "// replaced gemv\n").unwrap();
        let s = full_source_with(Some(&dir));
        assert!(s.contains("// replaced gemv"));
        assert!(
            !s.contains("gemv_norm_swiglu_bf16_r1"),
            "the embedded gemv.cu is gone"
        );
        assert!(
            s.contains("void rms_norm_bf16("),
            "the other units are the embedded ones"
        );
        assert_eq!(
            full_source_with(None),
            full_source_with(Some(&dir.join("missing")))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_symbol_is_defined_in_its_source() {
        for s in SOURCES {
            for sym in s.symbols {
                // Written out, or through a unit's kernel-defining macro (`MMA_KERNEL(name, ...)`,
                // `GEMV_PLAIN_KERNEL_OUT(name, ...)`).
                let defined = s.code.contains(&format!("void {sym}("))
                    || s.code.contains(&format!(") {sym}("))
                    || s.code.contains(&format!("_KERNEL({sym},"))
                    || s.code.contains(&format!("_KERNEL_OUT({sym},"));
                assert!(defined, "{} lacks {sym}", s.name);
            }
        }
    }

    /// Decode graphs launch kernels programmatically (graphs.rs): a kernel whose first
    /// statement is not `wait_for_prior_kernels()` could read what the kernel before it has not
    /// written yet. Every `__global__` body, written out or in a macro, starts with it.
    #[test]
    fn every_kernel_waits_for_the_kernels_before_it_first() {
        let mut kernels = 0;
        for s in SOURCES {
            let code = s.code;
            for (at, _) in code.match_indices("__global__") {
                let open = at + code[at..].find('{').expect("a kernel body");
                let body =
                    code[open + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
                let head = &code[at..open];
                assert!(
                    body.starts_with("wait_for_prior_kernels();"),
                    "{}: the kernel `{}` does not start with wait_for_prior_kernels()",
                    s.name,
                    head.split_whitespace().collect::<Vec<_>>().join(" ")
                );
                kernels += 1;
            }
        }
        let symbols: usize = SOURCES.iter().map(|s| s.symbols.len()).sum();
        assert!(
            kernels >= 30 && kernels <= symbols,
            "{kernels} kernel bodies for {symbols} symbols"
        );
    }
}
