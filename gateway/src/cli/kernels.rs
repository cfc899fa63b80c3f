//! `cachet kernels build`: the CUDA kernels compiled ahead into the cache a start reads, so a
//! start (or an image built without a GPU) does not spend its first minute compiling them.

use std::time::Instant;

use anyhow::Context;
use cachet_backend::device::cuda;
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum KernelsCommand {
    /// Compile the kernels for each architecture into the kernel cache
    /// ($CACHET_CACHE_DIR/kernels, else ~/.cache/cachet/kernels), which every start reads: a
    /// start then loads them in milliseconds instead of compiling them (tens of seconds). Needs
    /// NVRTC (libnvrtc of CUDA 12 or 13, as a start does), not a GPU: run it where the image is
    /// built. Does nothing for an architecture already there.
    Build {
        /// GPU architectures, comma-separated: sm_90 (H100, H200), sm_89 (L4, L40S), sm_80
        /// (A100), sm_100 (B200) … Default: each visible GPU's.
        #[arg(long, value_delimiter = ',')]
        arch: Vec<String>,
    },
}

/// `sm_` and a compute capability of two or three digits, e.g. `sm_90`, `sm_90a`, `sm_100`.
fn check_arch(arch: &str) -> anyhow::Result<()> {
    let ok = arch.strip_prefix("sm_").is_some_and(|rest| {
        let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
        (2..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
    });
    anyhow::ensure!(
        ok,
        "--arch {arch}: an architecture is `sm_` and the compute capability, e.g. sm_90 (H100, H200), sm_89, sm_80"
    );
    Ok(())
}

pub fn run(cmd: KernelsCommand) -> anyhow::Result<()> {
    let KernelsCommand::Build { mut arch } = cmd;
    for a in &arch {
        check_arch(a)?;
    }
    if arch.is_empty() {
        arch = cuda::gpu_archs().context(
            "no GPU is usable here to take the architecture from: name it with --arch (sm_90 for H100 and H200)",
        )?;
        arch.sort();
        arch.dedup();
    }
    let dir = cachet_backend::loader::fetch::kernel_cache_dir();
    for a in &arch {
        let t0 = Instant::now();
        let cached = cuda::build_kernels(a, &dir).with_context(|| format!("compiling for {a}"))?;
        let secs = t0.elapsed().as_secs_f64();
        if cached {
            eprintln!("{a}: already in {}", dir.display());
        } else {
            eprintln!("{a}: compiled in {secs:.1} s into {}", dir.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn architectures_are_checked() {
        for ok in ["sm_90", "sm_90a", "sm_80", "sm_100", "sm_120a"] {
            super::check_arch(ok).unwrap();
        }
        for bad in ["90", "sm90", "sm_9", "sm_x0", "compute_90", "sm_1000"] {
            assert!(super::check_arch(bad).is_err(), "{bad}");
        }
    }
}
