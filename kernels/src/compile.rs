//! NVRTC compilation of the kernels to a CUBIN for one GPU architecture, cached on disk by
//! (source hash, architecture, NVRTC version). The ptxas resource report is parsed so that any
//! spill to local memory is an error.

use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("NVRTC (libnvrtc) was not found; install the CUDA toolkit or `pip install nvidia-cuda-nvrtc==13.0.*` and put its lib directory on LD_LIBRARY_PATH")]
    NvrtcMissing,
    #[error("NVRTC failed ({stage}): {msg}\n{log}")]
    Nvrtc {
        stage: &'static str,
        msg: String,
        log: String,
    },
    #[error("kernel `{function}` spills to local memory ({report}); fix the kernel")]
    Spill { function: String, report: String },
    #[error("kernel cache {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A compiled module.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub arch: String,
    pub cubin: Vec<u8>,
    /// NVRTC's log (ptxas resource usage per kernel).
    pub log: String,
    pub from_cache: bool,
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32), CompileError> {
    if !nvrtc_available() {
        return Err(CompileError::NvrtcMissing);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers; the library is present (checked above).
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    r.result().map_err(|e| CompileError::Nvrtc {
        stage: "version",
        msg: format!("{e:?}"),
        log: String::new(),
    })?;
    Ok((major, minor))
}

/// Compiles every kernel for `arch` (e.g. `sm_90`), or loads the cached CUBIN from `cache_dir`;
/// `source_dir` substitutes kernel files by name (see [`crate::SOURCE_DIR_ENV`]).
pub fn compile(
    arch: &str,
    cache_dir: Option<&Path>,
    source_dir: Option<&Path>,
) -> Result<Compiled, CompileError> {
    let (major, minor) = nvrtc_version()?;
    let source = crate::full_source_with(source_dir);
    // `li`: built with line information (the options below).
    let key = format!(
        "{}-{arch}-nvrtc{major}.{minor}-li",
        &crate::source_hash(&source)[..16]
    );
    if let Some(dir) = cache_dir {
        let path = dir.join(format!("{key}.cubin"));
        if let Ok(cubin) = std::fs::read(&path) {
            return Ok(Compiled {
                arch: arch.into(),
                cubin,
                log: String::new(),
                from_cache: true,
            });
        }
    }
    let compiled = compile_source(arch, &source)?;
    if let Some(dir) = cache_dir {
        std::fs::create_dir_all(dir).map_err(|source| CompileError::Io {
            path: dir.into(),
            source,
        })?;
        let path = dir.join(format!("{key}.cubin"));
        let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, &compiled.cubin).map_err(|source| CompileError::Io {
            path: tmp.clone(),
            source,
        })?;
        std::fs::rename(&tmp, &path).map_err(|source| CompileError::Io { path, source })?;
    }
    Ok(compiled)
}

fn to_string(v: Vec<std::ffi::c_char>) -> String {
    let bytes: Vec<u8> = v
        .into_iter()
        .map(|c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles the embedded kernels without the disk cache and checks the resource report for spills.
pub fn compile_uncached(arch: &str) -> Result<Compiled, CompileError> {
    compile_source(arch, &crate::full_source_with(None))
}

/// Compiles `source` (a [`crate::full_source_with`]) and checks the report for spills.
fn compile_source(arch: &str, source: &str) -> Result<Compiled, CompileError> {
    if !nvrtc_available() {
        return Err(CompileError::NvrtcMissing);
    }
    let src = std::ffi::CString::new(source).expect("no NUL in kernel sources");
    let name = std::ffi::CString::new("cachet_kernels.cu").expect("static name");
    let err = |stage, e: result::NvrtcError, log: String| CompileError::Nvrtc {
        stage,
        msg: format!("{e:?}"),
        log,
    };
    let prog =
        result::create_program(&src, Some(&name)).map_err(|e| err("create", e, String::new()))?;
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
        "--use_fast_math".to_string(),
        "-default-device".to_string(),
        // Source lines in the CUBIN (no effect on the code): Nsight Compute's source page can then
        // attribute each SASS instruction's stalls to the kernel line it came from.
        "--generate-line-info".to_string(),
    ];
    // SAFETY: `prog` was just created and is destroyed once, below, on every path.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog) }
        .map(to_string)
        .unwrap_or_default();
    let cubin = compiled
        .map_err(|e| err("compile", e, log.clone()))
        .and_then(|()| {
            let mut size = 0usize;
            // SAFETY: valid program and out-pointer.
            unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| err("cubin size", e, log.clone()))?;
            let mut buf = vec![0u8; size];
            // SAFETY: `buf` holds `size` bytes, as NVRTC reported.
            unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) }
                .result()
                .map_err(|e| err("cubin", e, log.clone()))?;
            Ok(buf)
        });
    // SAFETY: created above, not yet destroyed.
    let _ = unsafe { result::destroy_program(prog) };
    let cubin = cubin?;
    check_spills(&log)?;
    Ok(Compiled {
        arch: arch.into(),
        cubin,
        log,
        from_cache: false,
    })
}

/// Fails on any `N bytes spill stores/loads` with N > 0 in a ptxas report: every kernel keeps
/// its values in registers.
pub fn check_spills(log: &str) -> Result<(), CompileError> {
    let mut function = String::from("?");
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            function = rest.trim().to_string();
        }
        for what in ["bytes spill stores", "bytes spill loads"] {
            if let Some(idx) = line.find(what) {
                let n: u64 = line[..idx]
                    .split_whitespace()
                    .last()
                    .and_then(|w| w.parse().ok())
                    .unwrap_or(0);
                if n > 0 {
                    return Err(CompileError::Spill {
                        function: function.clone(),
                        report: line.trim().to_string(),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spill_reports_are_parsed() {
        let ok = "ptxas info    : Function properties for rms_norm_bf16\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
        assert!(check_spills(ok).is_ok());
        let bad = "ptxas info    : Function properties for attn\n    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n";
        assert!(
            matches!(check_spills(bad), Err(CompileError::Spill { function, .. }) if function == "attn")
        );
    }
}
