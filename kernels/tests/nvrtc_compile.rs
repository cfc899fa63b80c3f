//! Every kernel compiles for sm_90 (H200) with NVRTC from PyPI (`nvidia-cuda-nvrtc==13.0.*`, the
//! version of the GPU machine's driver), with no spills to local memory. Needs no GPU.

use std::path::PathBuf;
use std::process::Command;

use cachet_kernels::compile;

const TEST: &str = "every_kernel_compiles_for_sm90_without_spills";

/// The lib directory of NVRTC from PyPI, installed under the target dir on first use.
fn pip_nvrtc_lib() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvrtc-pip");
    let lib = root.join("nvidia/cu13/lib");
    if !lib.join("libnvrtc.so.13").exists() {
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&root)
            .arg("nvidia-cuda-nvrtc==13.0.*")
            .status()
            .expect("running python3 -m pip");
        assert!(
            status.success(),
            "pip install nvidia-cuda-nvrtc==13.0.* failed"
        );
    }
    lib
}

#[test]
fn every_kernel_compiles_for_sm90_without_spills() {
    if !compile::nvrtc_available() {
        // The loader reads LD_LIBRARY_PATH at start-up: run this test again in a child process.
        assert!(
            std::env::var_os("CACHET_NVRTC_REEXEC").is_none(),
            "NVRTC still not loadable after installing it"
        );
        let lib = pip_nvrtc_lib();
        let path = match std::env::var("LD_LIBRARY_PATH") {
            Ok(p) if !p.is_empty() => format!("{}:{p}", lib.display()),
            _ => lib.display().to_string(),
        };
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env("LD_LIBRARY_PATH", path)
            .env("CACHET_NVRTC_REEXEC", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the child ran the test: {text}");
        println!("{text}");
        return;
    }
    let (major, minor) = compile::nvrtc_version().unwrap();
    let c = compile::compile_uncached("sm_90").unwrap_or_else(|e| panic!("{e}"));
    println!(
        "NVRTC {major}.{minor}, {} bytes of sm_90 CUBIN\n{}",
        c.cubin.len(),
        c.log
    );
    assert!(c.cubin.len() > 1000);
    // For reading the machine code without a GPU: `cuobjdump -sass` (PyPI: nvidia-cuda-cuobjdump).
    if let Some(path) = std::env::var_os("CACHET_CUBIN_OUT") {
        std::fs::write(&path, &c.cubin).unwrap();
    }
    for sym in cachet_kernels::symbols() {
        assert!(
            c.log.contains(sym),
            "ptxas reported nothing for `{sym}`: was it compiled?"
        );
    }
}
