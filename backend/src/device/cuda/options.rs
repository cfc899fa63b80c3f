//! [`CudaOptions`]: every option of the CUDA device, parsed once before the device opens.
//!
//! Each is a real choice, read from the environment by [`CudaOptions::from_env`] only (a bad
//! value is refused at start-up with the form it should take):
//!
//! | variable | what | why it is an option |
//! |---|---|---|
//! | `CACHET_CACHE_DIR` (set by the CLI) | where compiled kernels are kept | a fresh machine compiles ~40 s |
//! | `CACHET_KERNEL_DIR` | kernel sources replacing the built-in ones, by file name | kernel work without a rebuild |
//! | `CACHET_NCCL_LIBRARY` | the NCCL library tensor-parallel ranks load | NCCL lives elsewhere on some hosts |
//! | `CACHET_ATTENTION_SPLIT` | how long key ranges are split over blocks | measured thresholds ([`SplitOptions`]) |
//! | `CACHET_GEMV`, `CACHET_GEMV_FP8` | most rows of a projection through gemv.cu | measured thresholds |
//! | `CACHET_MOE_GEMM`, `CACHET_MOE_GEMM_FP8` | rows from which MoE experts run as grouped GEMMs | measured thresholds |
//! | `CACHET_MOE_OWN_GEMM` | output tiles from which an expert gets a cuBLAS GEMM of its own | measured threshold |
//!
//! The thresholds' defaults are the H200 measurements' (BENCHMARKS.md §1, §8); another card
//! may measure others. Everything else the device does is decided: the A/B switches of earlier
//! studies lost their losing sides (BENCHMARKS-HISTORY.md).

use std::path::PathBuf;

use super::kernels::{ATT_TK, GEMV_DEFAULT_ROWS, GEMV_FP8_DEFAULT_ROWS, GEMV_ROWS};
use crate::error::DeviceError;

/// Shortest key range an attention split is given.
pub const MIN_SPLIT: usize = 64;
/// Rows from which a mixture-of-experts step is served by grouped GEMMs over the pairs sorted
/// by expert rather than by per-pair expert GEMVs: from 8 tokens the GEMVs read many experts
/// more than once (Qwen3-30B-A3B's batch 16 touches ~82 of 128 experts with 128 pairs).
pub const MOE_GEMM_DEFAULT_ROWS: usize = 8;
/// The same for FP8 experts: on the H200 their GEMVs took decode batch 16 faster than moe.cu's
/// FP8 grouped kernel (Qwen3-30B-A3B 13.9 vs 17.1 ms, Mixtral 31.6 vs 35.6) and batch 24 slower
/// (24.1 vs 21.3, 62.0 vs 37.2; BENCHMARKS.md §8).
pub const MOE_GEMM_FP8_DEFAULT_ROWS: usize = 24;
/// Output tiles (128 × 128) from which an expert's product on cuBLAS's MoE path gets a GEMM of
/// its own rather than a group of the grouped GEMM: half a wave of the H200's 132 SMs. Measured
/// against 132, 264 and none (BENCHMARKS.md §8): Mixtral-8x7B's prefill 512 / 4096 took 42 /
/// 203 ms against 65 / 421 with none, Qwen3-30B-A3B's 23 / 120 against 24 / 134.
pub const MOE_OWN_GEMM_DEFAULT_TILES: usize = 66;
/// Most blocks a key range is split over.
pub const MAX_SPLITS: usize = 64;
/// Waves of attention blocks the splits may fill. Measured on the H200 (8B shape, ctx 4096,
/// graphs), two waves against one: batch 1 4.59 vs 4.64 ms, batch 2 4.94 vs 5.10, batch 4 5.58 vs
/// 5.80, batch 16 7.52 vs 9.01, batch 64 17.77 vs 17.71 — with the one-round-trip combine, more
/// and shorter splits pay even as a partial second wave. Decode and verification steps only: a
/// 512-token prefill split three ways took 23 ms against 14 unsplit.
pub const SPLIT_WAVES: usize = 2;
/// [`SplitOptions::fill_percent`]'s default: half a wave.
pub const SPLIT_FILL_PERCENT: usize = 50;

/// How long key ranges are split over blocks
/// (`CACHET_ATTENTION_SPLIT=keys,n[,waves[,step[,prompt_waves[,fill_percent]]]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitOptions {
    /// Shortest key range of a split.
    pub min_keys: usize,
    /// Most splits of one key range.
    pub max_splits: usize,
    /// Waves of blocks the splits of a decode-like step may fill (prompts: one).
    pub waves: usize,
    /// The multiple of keys a tensor-core split is rounded to (the CUDA-core kernel always
    /// takes whole ATT_TK tiles).
    pub step: usize,
    /// Waves of blocks the splits of a prompt's causal triangles may fill. More than one lost
    /// on the H200 at every head_dim measured: 512-token prefills of the Gemma-3-12B and
    /// Llama-3-8B shapes took 37 and 23 ms with two waves, 23 and 14 ms with one; 2048 and
    /// 8192 tokens were even (`git show 47b836f:benchmarks/results/families-h200/fused-norms/prompt-splits.txt`).
    pub prompt_waves: usize,
    /// A decode-like step on the tensor-core kernels (head_dim ≤ 128) whose unsplit blocks
    /// already fill this percent of one wave is not split at all (0: the waves rule alone).
    /// Measured on the H200 (8B shape, both caches, BENCHMARKS.md §1): batch 32 split three ways took 5.11–5.15 ms (FP8) and 7.37–7.42
    /// (bf16) at ctx 1280, 6.73–6.77 and 10.02–10.05 at ctx 4096; unsplit 4.50–4.53, 6.49–6.51,
    /// 6.15–6.19 and 9.40–9.43 — 256 blocks of two an SM already stream the cache, and the
    /// splits' partials and merge only add; batches of 16 and fewer still gain from splits at
    /// long contexts.
    pub fill_percent: usize,
}

impl Default for SplitOptions {
    fn default() -> Self {
        SplitOptions {
            min_keys: MIN_SPLIT,
            max_splits: MAX_SPLITS,
            waves: SPLIT_WAVES,
            step: ATT_TK,
            prompt_waves: 1,
            fill_percent: SPLIT_FILL_PERCENT,
        }
    }
}

impl std::str::FromStr for SplitOptions {
    type Err = crate::error::BadValue;
    fn from_str(v: &str) -> Result<Self, crate::error::BadValue> {
        // Numbers given replace the defaults from the left; anything not a number is an error.
        let n: Option<Vec<usize>> = v.split(',').map(|x| x.trim().parse().ok()).collect();
        let d = SplitOptions::default();
        let mut f = [
            d.min_keys,
            d.max_splits,
            d.waves,
            d.step,
            d.prompt_waves,
            d.fill_percent,
        ];
        let given = match n {
            Some(n) if (2..=f.len()).contains(&n.len()) => {
                f[..n.len()].copy_from_slice(&n);
                true
            }
            _ => false,
        };
        let [min_keys, max_splits, waves, step, prompt_waves, fill_percent] = f;
        let o = SplitOptions {
            min_keys,
            max_splits,
            waves,
            step,
            prompt_waves,
            fill_percent,
        };
        if !given
            || o.min_keys == 0
            || o.max_splits == 0
            || o.waves == 0
            || o.step == 0
            || o.prompt_waves == 0
        {
            return Err(crate::error::BadValue::unknown(
                "split setting",
                v,
                "expected `min_keys,max_splits[,waves[,step[,prompt_waves[,fill_percent]]]]` of positive numbers (fill_percent may be 0), e.g. `128,32` or `64,64,2`",
            ));
        }
        Ok(o)
    }
}

/// The CUDA device's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaOptions {
    pub split: SplitOptions,
    /// Projections of at most this many rows go through gemv.cu with norms and SwiGLU fused in
    /// (`CACHET_GEMV=off|1|2|4`).
    pub gemv_max_rows: usize,
    /// The same for FP8 weights, whose larger steps take cuBLASLt's FP8 GEMM
    /// (`CACHET_GEMV_FP8=off|1|2|4`; off or 0: cuBLASLt from one row).
    pub gemv_max_rows_fp8: usize,
    /// Rows from which a mixture-of-experts step takes the grouped GEMMs (pairs sorted by
    /// expert) instead of the expert GEMVs (`CACHET_MOE_GEMM=off|rows`; off: always the
    /// GEMVs).
    pub moe_gemm_min_rows: usize,
    /// The same for FP8 experts (`CACHET_MOE_GEMM_FP8=off|rows`): their GEMVs stream half the
    /// bytes, so they serve more rows before the grouped kernel pays.
    pub moe_gemm_min_rows_fp8: usize,
    /// On cuBLAS's path (uncaptured steps), an expert whose product has this many 128 × 128
    /// output tiles or more gets a GEMM of its own (the others stay groups of the grouped
    /// GEMM); FP8 experts take cuBLAS's path (a cuBLASLt GEMM an expert) where an expert's
    /// gate|up product averages that many tiles, else moe.cu's FP8 kernel
    /// (`CACHET_MOE_OWN_GEMM=off|tiles`).
    pub moe_gemm_own_tiles: usize,
    /// Where compiled kernels are cached (none: compile at every start).
    pub kernel_cache: Option<PathBuf>,
    /// Kernel sources substituted by file name (`CACHET_KERNEL_DIR`), for kernel work without a
    /// rebuild.
    pub kernel_dir: Option<PathBuf>,
    /// The NCCL library tensor-parallel ranks load (`CACHET_NCCL_LIBRARY`, a path; unset:
    /// `libnccl.so.2`, then `libnccl.so`).
    pub nccl_library: Option<PathBuf>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            split: SplitOptions::default(),
            gemv_max_rows: GEMV_DEFAULT_ROWS,
            gemv_max_rows_fp8: GEMV_FP8_DEFAULT_ROWS,
            moe_gemm_min_rows: MOE_GEMM_DEFAULT_ROWS,
            moe_gemm_min_rows_fp8: MOE_GEMM_FP8_DEFAULT_ROWS,
            moe_gemm_own_tiles: MOE_OWN_GEMM_DEFAULT_TILES,
            kernel_cache: None,
            kernel_dir: None,
            nccl_library: None,
        }
    }
}

fn bad(var: &'static str, msg: String) -> DeviceError {
    DeviceError::Op {
        device: super::DEV,
        op: var,
        msg,
    }
}

impl CudaOptions {
    /// The options from the environment, over the defaults; `kernel_cache` as given.
    pub fn from_env(kernel_cache: Option<PathBuf>) -> Result<Self, DeviceError> {
        Self::from_vars(|k| std::env::var(k).ok(), kernel_cache)
    }

    /// The options from `var` (an environment lookup), for tests.
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        kernel_cache: Option<PathBuf>,
    ) -> Result<Self, DeviceError> {
        let mut o = CudaOptions {
            kernel_cache,
            ..Default::default()
        };
        if let Some(v) = var("CACHET_ATTENTION_SPLIT") {
            o.split = v.parse().map_err(|e: crate::error::BadValue| {
                bad("CACHET_ATTENTION_SPLIT", e.to_string())
            })?;
        }
        // The most rows a GEMV instantiation takes, or off (0), capped at the largest.
        let gemv_rows = |name: &'static str| -> Result<Option<usize>, DeviceError> {
            let Some(v) = var(name) else { return Ok(None) };
            let rows = match v.as_str() {
                "off" => 0,
                _ => v
                    .parse::<usize>()
                    .map_err(|_| bad(name, format!("`{v}`: expected off or a row count")))?,
            };
            Ok(Some(rows.min(GEMV_ROWS[GEMV_ROWS.len() - 1])))
        };
        if let Some(r) = gemv_rows("CACHET_GEMV")? {
            o.gemv_max_rows = r;
        }
        if let Some(r) = gemv_rows("CACHET_GEMV_FP8")? {
            o.gemv_max_rows_fp8 = r;
        }
        // A count (rows, tiles), or off (never).
        let count_or_off = |name: &'static str| -> Result<Option<usize>, DeviceError> {
            let Some(v) = var(name) else { return Ok(None) };
            match v.as_str() {
                "off" => Ok(Some(usize::MAX)),
                _ => v
                    .parse::<usize>()
                    .ok()
                    .filter(|&r| r > 0)
                    .map(Some)
                    .ok_or_else(|| bad(name, format!("`{v}`: expected off or a count ≥ 1"))),
            }
        };
        if let Some(r) = count_or_off("CACHET_MOE_GEMM")? {
            o.moe_gemm_min_rows = r;
        }
        if let Some(r) = count_or_off("CACHET_MOE_GEMM_FP8")? {
            o.moe_gemm_min_rows_fp8 = r;
        }
        if let Some(t) = count_or_off("CACHET_MOE_OWN_GEMM")? {
            o.moe_gemm_own_tiles = t;
        }
        o.kernel_dir = var("CACHET_KERNEL_DIR").map(PathBuf::from);
        o.nccl_library = var("CACHET_NCCL_LIBRARY")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        // Switches of finished studies, named so that a script still setting one learns it is
        // gone rather than silently measuring the default twice.
        for gone in RETIRED {
            if var(gone).is_some() {
                return Err(bad(
                    gone,
                    "this switch's study is decided and its losing side removed \
                     (BENCHMARKS-HISTORY.md): unset it"
                        .into(),
                ));
            }
        }
        Ok(o)
    }
}

/// Switches of decided studies (each in BENCHMARKS-HISTORY.md), refused if set.
pub const RETIRED: &[&str] = &[
    "CACHET_ATTENTION",
    "CACHET_ROPE",
    "CACHET_MOE_ROUTER",
    "CACHET_MOE_GROUPED",
    "CACHET_MOE_FP8",
    "CACHET_MOE_SMALL_TILES",
    "CACHET_MOE_FP8_MMA",
    "CACHET_MOE_NORM",
    "CACHET_PDL",
    "CACHET_GRAPH_MEMORY",
    "CACHET_FP8_FAST_ACCUM",
    "CACHET_FP8_GEMM_TUNE",
    "CACHET_FP8_PRODUCT",
    "CACHET_FP8_ACTIVATIONS",
    "CACHET_FP8_GLU",
    "CACHET_FP8_NORM",
    "CACHET_FP8_OUT_SCALES",
    "CACHET_ATTENTION_ORDER",
    "CACHET_DECODE_ATTENTION",
    "CACHET_DECODE_ATTENTION_BF16",
    "CACHET_DECODE_LAYERS",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<CudaOptions, DeviceError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CudaOptions::from_vars(
            |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            None,
        )
    }

    #[test]
    fn no_variables_give_the_measured_defaults() {
        let o = parse(&[]).unwrap();
        assert_eq!(o, CudaOptions::default());
        assert_eq!(
            (
                o.split.min_keys,
                o.split.max_splits,
                o.split.waves,
                o.split.step
            ),
            (64, 64, 2, 64)
        );
        assert_eq!((o.gemv_max_rows, o.moe_gemm_min_rows), (2, 8));
    }

    #[test]
    fn options_are_parsed_once_and_bad_values_name_the_form() {
        let o = parse(&[
            ("CACHET_ATTENTION_SPLIT", "32,128,2,16"),
            ("CACHET_GEMV", "off"),
        ])
        .unwrap();
        assert_eq!(
            o.split,
            SplitOptions {
                min_keys: 32,
                max_splits: 128,
                waves: 2,
                step: 16,
                prompt_waves: 1,
                fill_percent: 50,
            }
        );
        // The fifth number: waves for prompts' causal triangles; the sixth: the fill from which
        // a decode step is left unsplit (0 turns that rule off).
        let split = parse(&[("CACHET_ATTENTION_SPLIT", "64,64,2,64,2,0")])
            .unwrap()
            .split;
        assert_eq!((split.prompt_waves, split.fill_percent), (2, 0));
        assert_eq!(o.gemv_max_rows, 0);
        assert_eq!(parse(&[("CACHET_GEMV", "9")]).unwrap().gemv_max_rows, 4);
        assert_eq!(
            parse(&[("CACHET_GEMV_FP8", "off")])
                .unwrap()
                .gemv_max_rows_fp8,
            0
        );
        assert_eq!(
            parse(&[("CACHET_MOE_GEMM_FP8", "24")])
                .unwrap()
                .moe_gemm_min_rows_fp8,
            24
        );
        assert_eq!(
            parse(&[("CACHET_MOE_OWN_GEMM", "off")])
                .unwrap()
                .moe_gemm_own_tiles,
            usize::MAX
        );
        assert_eq!(
            parse(&[("CACHET_ATTENTION_SPLIT", "128,32")])
                .unwrap()
                .split,
            SplitOptions {
                min_keys: 128,
                max_splits: 32,
                ..Default::default()
            }
        );
        for (k, v, want) in [
            ("CACHET_ATTENTION_SPLIT", "64", "min_keys,max_splits"),
            ("CACHET_ATTENTION_SPLIT", "64,0", "min_keys,max_splits"),
            // Not a number where the fill percent goes: refused, not read as 0 (off).
            (
                "CACHET_ATTENTION_SPLIT",
                "64,64,2,64,1,half",
                "min_keys,max_splits",
            ),
            (
                "CACHET_ATTENTION_SPLIT",
                "64,64,2,64,1,50,7",
                "min_keys,max_splits",
            ),
            ("CACHET_GEMV", "two", "off or a row count"),
            ("CACHET_MOE_GEMM", "0", "off or a count"),
            ("CACHET_MOE_OWN_GEMM", "many", "off or a count"),
            // A decided study's switch is refused by name.
            ("CACHET_PDL", "late", "unset it"),
            ("CACHET_DECODE_LAYERS", "fused", "unset it"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(want), "{k}={v}: {e}");
        }
    }
}
