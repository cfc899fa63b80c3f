//! Cachet's CUDA C++ kernels, embedded as source.
//!
//! The `.cu`/`.cuh` files beside this file are compiled at run time with NVRTC for the GPU at
//! hand (sm_90 on H200), so building the workspace needs no CUDA toolkit. Kernel symbols are
//! named `{op}_{dtype}`; every pointer argument is documented in the source as device memory
//! with its shape.

/// One translation unit.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name, e.g. `rms_norm.cu`.
    pub name: &'static str,
    pub code: &'static str,
    /// `extern "C"` symbols it defines.
    pub symbols: &'static [&'static str],
}

/// Headers every unit may `#include` (NVRTC gets them by name).
pub const HEADERS: &[(&str, &str)] = &[("common.cuh", include_str!("common.cuh"))];

/// Every kernel translation unit.
pub const SOURCES: &[KernelSource] = &[KernelSource {
    name: "rms_norm.cu",
    code: include_str!("rms_norm.cu"),
    symbols: &["rms_norm_bf16", "add_rms_norm_bf16"],
}];

/// blake3 of every source and header: part of the on-disk cache key for compiled modules.
pub fn source_hash() -> String {
    let mut h = blake3::Hasher::new();
    for (name, code) in HEADERS {
        h.update(name.as_bytes());
        h.update(code.as_bytes());
    }
    for s in SOURCES {
        h.update(s.name.as_bytes());
        h.update(s.code.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_symbol_is_defined_in_its_source() {
        for s in SOURCES {
            for sym in s.symbols {
                assert!(
                    s.code.contains(&format!("{sym}(")),
                    "{} lacks {sym}",
                    s.name
                );
            }
        }
    }
}
