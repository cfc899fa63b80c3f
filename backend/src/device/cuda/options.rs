//! [`CudaOptions`]: every switch of the CUDA device, parsed once before the device opens.
//!
//! The defaults are what the H200 measurements chose (BENCHMARKS.md §3); the switches exist for
//! side-by-side comparisons and are read from the environment by [`CudaOptions::from_env`] only,
//! so a bad value is refused at start-up with the form it should take.

use std::path::PathBuf;

use super::graph_pool::GraphMemory;
use super::kernels::{ATT_TK, GEMV_DEFAULT_ROWS, GEMV_FP8_DEFAULT_ROWS, GEMV_ROWS};
use super::programmatic::Pdl;
use crate::error::DeviceError;

/// Shortest key range an attention split is given.
pub const MIN_SPLIT: usize = 64;
/// Rows from which a mixture-of-experts step is served by grouped GEMMs over the pairs sorted
/// by expert rather than by per-pair expert GEMVs: from 8 tokens the GEMVs read many experts
/// more than once (Qwen3-30B-A3B's batch 16 touches ~82 of 128 experts with 128 pairs).
pub const MOE_GEMM_DEFAULT_ROWS: usize = 8;
/// The same for FP8 experts: on the H200 their GEMVs took decode batch 16 faster than moe.cu's
/// FP8 grouped kernel (Qwen3-30B-A3B 13.9 vs 17.1 ms, Mixtral 31.6 vs 35.6) and batch 24 slower
/// (24.1 vs 21.3, 62.0 vs 37.2; BENCHMARKS.md §13c).
pub const MOE_GEMM_FP8_DEFAULT_ROWS: usize = 24;
/// Output tiles (128 × 128) from which an expert's product on cuBLAS's MoE path gets a GEMM of
/// its own rather than a group of the grouped GEMM: half a wave of the H200's 132 SMs. Measured
/// against 132, 264 and none (BENCHMARKS.md §13c): Mixtral-8x7B's prefill 512 / 4096 took 42 /
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
    /// 8192 tokens were even (`benchmarks/results/families-h200/fused-norms/prompt-splits.txt`).
    pub prompt_waves: usize,
    /// A decode-like step on the tensor-core kernels (head_dim ≤ 128) whose unsplit blocks
    /// already fill this percent of one wave is not split at all (0: the waves rule alone).
    /// Measured on the H200 (8B shape, both caches, BENCHMARKS.md §12c): batch 32 split three ways took 5.11–5.15 ms (FP8) and 7.37–7.42
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
    type Err = String;
    fn from_str(v: &str) -> Result<Self, String> {
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
            return Err(format!(
                "`{v}`: expected `min_keys,max_splits[,waves[,step[,prompt_waves[,fill_percent]]]]` of positive numbers (fill_percent may be 0), e.g. `128,32` or `64,64,2`"
            ));
        }
        Ok(o)
    }
}

/// How a mixture-of-experts router runs on a decode step's few rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeRouter {
    /// The logits GEMV and the routing in one launch (moe.cu's `moe_router_route_r*`, its
    /// last block routes). Gives the two-launch outputs exactly (the CUDA MoE test) but is not
    /// faster: Qwen3-30B-A3B batch 1 3.12–3.13 vs 3.09 ms with graph pool + early PDL, 3.25–3.28
    /// vs 3.23–3.24 with allocation nodes (BENCHMARKS.md §13): one block routing every token
    /// after the GEMV costs what the saved launch did.
    Fused,
    /// The f32-output GEMV, then the routing kernel (the default, measured).
    Gemv,
    /// The f32-output GEMV, then, where the experts run as GEMVs (a decode step's few rows),
    /// the routing inside their gate|up launch: every block routes its token again
    /// (moe.cu's `moe_route_gate_up_*`: the routing kernel's choices bit for bit) and the
    /// routing's launch is saved; elsewhere the routing kernel. Off until measured.
    Experts,
    /// cuBLAS, then the routing kernel.
    Gemm,
}

/// Which experts moe.cu's grouped kernel gives 16-row tiles in decode steps (experts averaging
/// 16 pairs or fewer). Measured on the H200 (BENCHMARKS.md §13c, two rounds): FP8 experts' steps
/// 8–13% faster at batch 64 and 3–4% at 256; bf16's within ±3% either way, so FP8 only by
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeSmallTiles {
    Fp8,
    All,
    Off,
}

impl MoeSmallTiles {
    /// Whether experts of this format (FP8 or bf16) take 16-row tiles.
    pub fn apply(self, fp8: bool) -> bool {
        match self {
            MoeSmallTiles::All => true,
            MoeSmallTiles::Fp8 => fp8,
            MoeSmallTiles::Off => false,
        }
    }
}

/// The CUDA device's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaOptions {
    /// The CUDA-core attention kernel everywhere (`CACHET_ATTENTION=simt`).
    pub simt_attention: bool,
    /// Let the tensor-core attention rotate q/k and write K/V itself where it can;
    /// `CACHET_ROPE=separate` keeps the rope_kv launch.
    pub fused_rope: bool,
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
    /// How a MoE router runs for the rows a GEMV takes (`CACHET_MOE_ROUTER=gemv|fused|gemm|experts`,
    /// for side-by-side measurements): see [`MoeRouter`].
    pub moe_router: MoeRouter,
    /// A MoE step's grouped expert products through cuBLAS's grouped GEMM
    /// (`cublasGemmGroupedBatchedEx`, the routing read back to the host a layer; inside a
    /// graph capture moe.cu's sorted grouped kernel runs either way) rather than moe.cu's
    /// kernel (`CACHET_MOE_GROUPED=cublas|ours`). cuBLAS: on the H200 prefill 512 / 4096 took
    /// 23.5–24.9 / 137.7–139.0 ms against 27.1–27.4 / 150.0–152.3 (Qwen3-30B-A3B) and 63.8–65.6
    /// / 425.7–429.0 against 89.7–90.4 / 523.2–525.7 (Mixtral-8x7B) (BENCHMARKS.md §13).
    pub moe_grouped_cublas: bool,
    /// On cuBLAS's path, an expert whose product has this many 128 × 128 output tiles or more
    /// gets a GEMM of its own (the others stay groups of the grouped GEMM); FP8 experts take
    /// cuBLAS's path (a GEMM an expert: [`Self::moe_fp8_cublaslt`]) where an expert's gate|up
    /// product averages that many tiles, else moe.cu's FP8 kernel (`CACHET_MOE_OWN_GEMM=off|
    /// tiles`).
    pub moe_gemm_own_tiles: usize,
    /// FP8 experts on cuBLAS's path multiply their codes through cuBLASLt's FP8 GEMM, the
    /// sorted rows quantized per token as in the dense FP8 GEMMs (`CACHET_MOE_FP8=cublaslt`),
    /// rather than being dequantized an expert at a time for cuBLAS (`dequant`).
    pub moe_fp8_cublaslt: bool,
    /// Where moe.cu's grouped kernel takes 16-row tiles, for experts averaging 16 pairs or
    /// fewer (decode steps), rather than 64 (`CACHET_MOE_SMALL_TILES=fp8|all|off`): see
    /// [`MoeSmallTiles`].
    pub moe_small_tiles: MoeSmallTiles,
    /// FP8 experts on moe.cu's grouped kernel multiply e4m3 codes by e4m3 codes on the FP8
    /// tensor cores (`moe_gemm_*_f8f8`: each product's input rows quantized per row first, as
    /// for cuBLASLt's FP8 GEMMs) rather than widening the weights' codes to bf16 in shared
    /// memory for bf16 MMAs (`CACHET_MOE_FP8_MMA=widen|fp8`; sm_89+). Off until measured on the
    /// H200: it would take Qwen3-30B-A3B's FP8 prefill, the one place FP8 experts lose to bf16
    /// (BENCHMARKS.md §13c), off bf16 MMAs at half the FP8 rate.
    pub moe_fp8_mma: bool,
    /// A MoE layer's norm (with its residual add) in its router's GEMV for the few rows the
    /// GEMV takes (`gemv_norm_f32out_*`: the norm's output, the new residual and the logits
    /// of the two launches bit for bit, the normalised rows written out for the experts)
    /// rather than a norm launch of its own (`CACHET_MOE_NORM=separate|fused`): one launch
    /// fewer a layer at batch 1, where the layer structure is what holds Qwen3-30B-A3B at 2.1×
    /// its floor (BENCHMARKS.md §13b). Off until measured on the H200.
    pub moe_norm_fused: bool,
    /// Programmatic dependent launch between the kernels of decode graphs (`CACHET_PDL=off|
    /// late|mixed|early`; Hopper and later only): see `programmatic.rs`.
    pub pdl: Pdl,
    /// Where decode graphs' activations come from (`CACHET_GRAPH_MEMORY=nodes|pool`; the pool
    /// is not used with FP8 weights): see `graph_pool.rs`.
    pub graph_memory: GraphMemory,
    /// Where compiled kernels are cached (none: compile at every start).
    pub kernel_cache: Option<PathBuf>,
    /// Kernel sources substituted by file name (`CACHET_KERNEL_DIR`), for kernel work without a
    /// rebuild.
    pub kernel_dir: Option<PathBuf>,
    /// FP8 GEMMs accumulate in the tensor cores' fast mode, without cuBLASLt's periodic
    /// promotion of partial sums to f32 (`CACHET_FP8_FAST_ACCUM=0|1`, as torch's
    /// `_scaled_mm(use_fast_accum=True)`). Off: on the H200 it made prefill 2–5% faster and
    /// batched decode no faster, with the same error (BENCHMARKS.md §9b).
    pub fp8_fast_accum: bool,
    /// FP8 GEMMs time up to a dozen of cuBLASLt's candidate algorithms per shape on first use and
    /// keep the fastest, instead of the heuristic's first pick (`CACHET_FP8_GEMM_TUNE=
    /// heuristic|timed`; decode graphs are then captured after an eager warm-up step of each
    /// size). Off until measured on the H200.
    pub fp8_gemm_tune: bool,
    /// A bf16 result's FP8 product is written by cuBLASLt in bf16 and scaled bf16 → bf16 (4 bytes
    /// an element through the epilogue) rather than in f32 (10 bytes: written, read back, bf16
    /// written) (`CACHET_FP8_PRODUCT=bf16|f32`). bf16: prefill 2.5–4% faster on the H200, the
    /// logits' error against transformers and bf16 the same (BENCHMARKS.md §9b). The dense
    /// projections only: FP8 experts' cuBLASLt products are always bf16 (their per-row epilogue
    /// has no f32 form).
    pub fp8_bf16_product: bool,
    /// An FP8 GEMM's input rows quantized by the weights' kernel (`quantize_rows_e4m3`: each
    /// row read twice, a division an element) rather than `quantize_act_rows_e4m3` (read once,
    /// vectorized, a multiplication) (`CACHET_FP8_ACTIVATIONS=fast|exact`).
    pub fp8_exact_activations: bool,
    /// An FP8 gate|up product's scales and the gated activation in one pass
    /// (`fp8_scale_{silu|gelu_tanh}_bf16`, bit for bit the two launches' result) rather than
    /// the scales' launch, then the activation's (`CACHET_FP8_GLU=fused|separate`).
    pub fp8_fused_glu: bool,
    /// A sub-layer's norm writes the FP8 GEMM's input codes and row scales directly
    /// (`rms_norm_e4m3`: the norm's and the quantization's launches' result bit for bit)
    /// rather than bf16 rows the quantization reads back (`CACHET_FP8_NORM=fused|separate`;
    /// batch-64 FP8 decode −1.7%, batch 256 −0.8% on the H200, BENCHMARKS.md §12c).
    pub fp8_fused_norm: bool,
    /// An FP8 o_proj's and down projection's scales applied by the next norm as it adds the
    /// product to the residual (`add_rms_norm_bf16` / `rms_norm_e4m3` read the unscaled product
    /// and both scale vectors: the scales' launch's values bit for bit) rather than by a launch
    /// of their own (`CACHET_FP8_OUT_SCALES=norm|separate`).
    pub fp8_scales_in_norm: bool,
    /// The tensor-core attention kernel's grid takes a sequence's kv heads as consecutive blocks
    /// (`CACHET_ATTENTION_ORDER=heads|units`), so they read the same keys' rows — adjacent in
    /// the cache — together, rather than one kv head of every sequence first.
    pub attention_heads_first: bool,
    /// Decode steps with the FP8 cache whose blocks hold at most 8 query rows (a GQA group of at
    /// most 8) run the transposed kernel — keys on the MMAs' 16 rows, queries on their 8 columns,
    /// four blocks an SM — rather than the 16-row one (`CACHET_DECODE_ATTENTION=transposed|rows`).
    pub attention_decode_transposed: bool,
    /// The same kernel shape for the bf16 cache (`CACHET_DECODE_ATTENTION_BF16=transposed|rows`;
    /// rows: the 16-row kernel, where a decode block's four warps share one warp's query rows).
    /// Batch-256 bf16 decode −7.4%, batch 64 −9.0% on the H200 (BENCHMARKS.md §12c).
    pub attention_decode_transposed_bf16: bool,
    /// A one-token decode step of a dense model runs every layer in one persistent launch
    /// (decode_layers.cu: the operations as phases of one block an SM, separated by grid
    /// barriers) rather than a launch per operation (`CACHET_DECODE_LAYERS=fused|separate`;
    /// slower so far on the H200, BENCHMARKS.md §13b).
    pub decode_layers_fused: bool,
    /// The NCCL library tensor-parallel ranks load (`CACHET_NCCL_LIBRARY`, a path; unset:
    /// `libnccl.so.2`, then `libnccl.so`).
    pub nccl_library: Option<PathBuf>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            simt_attention: false,
            fused_rope: true,
            split: SplitOptions::default(),
            gemv_max_rows: GEMV_DEFAULT_ROWS,
            gemv_max_rows_fp8: GEMV_FP8_DEFAULT_ROWS,
            moe_gemm_min_rows: MOE_GEMM_DEFAULT_ROWS,
            moe_gemm_min_rows_fp8: MOE_GEMM_FP8_DEFAULT_ROWS,
            moe_router: MoeRouter::Gemv,
            moe_grouped_cublas: true,
            moe_gemm_own_tiles: MOE_OWN_GEMM_DEFAULT_TILES,
            moe_fp8_cublaslt: true,
            moe_small_tiles: MoeSmallTiles::Fp8,
            moe_fp8_mma: false,
            moe_norm_fused: false,
            pdl: Pdl::Early,
            graph_memory: GraphMemory::Nodes,
            kernel_cache: None,
            kernel_dir: None,
            fp8_fast_accum: false,
            fp8_gemm_tune: false,
            fp8_bf16_product: true,
            fp8_exact_activations: false,
            fp8_fused_glu: true,
            fp8_fused_norm: true,
            fp8_scales_in_norm: true,
            attention_heads_first: true,
            attention_decode_transposed: true,
            attention_decode_transposed_bf16: true,
            decode_layers_fused: false,
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
    /// The options from the environment switches, over the defaults; `kernel_cache` as given.
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
        // A two-way switch: false unset or `default`, true at `other`, else refused by name.
        let switch = |name: &'static str, default: &str, other: &str| match var(name).as_deref() {
            None | Some("") => Ok(false),
            Some(v) if v == default => Ok(false),
            Some(v) if v == other => Ok(true),
            Some(v) => Err(bad(
                name,
                format!("`{v}`: expected `{default}` or `{other}`"),
            )),
        };
        match var("CACHET_ATTENTION").as_deref() {
            None | Some("") | Some("auto") => {}
            Some("simt") => o.simt_attention = true,
            Some(v) => {
                return Err(bad(
                    "CACHET_ATTENTION",
                    format!("`{v}`: expected `simt` (or unset)"),
                ))
            }
        }
        o.fused_rope = !switch("CACHET_ROPE", "fused", "separate")?;
        if let Some(v) = var("CACHET_ATTENTION_SPLIT") {
            o.split = v.parse().map_err(|m| bad("CACHET_ATTENTION_SPLIT", m))?;
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
        match var("CACHET_MOE_ROUTER").as_deref() {
            None | Some("") | Some("gemv") => {}
            Some("fused") => o.moe_router = MoeRouter::Fused,
            Some("gemm") => o.moe_router = MoeRouter::Gemm,
            Some("experts") => o.moe_router = MoeRouter::Experts,
            Some(v) => {
                return Err(bad(
                    "CACHET_MOE_ROUTER",
                    format!("`{v}`: expected `fused`, `gemv`, `gemm` or `experts`"),
                ))
            }
        }
        o.pdl = match var("CACHET_PDL").as_deref() {
            None | Some("") | Some("early") => Pdl::Early,
            Some("late") => Pdl::Late,
            Some("off") => Pdl::Off,
            Some("mixed") => Pdl::Mixed,
            Some(v) => {
                return Err(bad(
                    "CACHET_PDL",
                    format!("`{v}`: expected `early`, `mixed`, `late` or `off`"),
                ))
            }
        };
        if switch("CACHET_GRAPH_MEMORY", "nodes", "pool")? {
            o.graph_memory = GraphMemory::Pool;
        }
        o.kernel_dir = var("CACHET_KERNEL_DIR").map(PathBuf::from);
        o.nccl_library = var("CACHET_NCCL_LIBRARY")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        o.fp8_fast_accum = switch("CACHET_FP8_FAST_ACCUM", "0", "1")?;
        o.fp8_gemm_tune = switch("CACHET_FP8_GEMM_TUNE", "heuristic", "timed")?;
        o.moe_grouped_cublas = !switch("CACHET_MOE_GROUPED", "cublas", "ours")?;
        o.moe_fp8_cublaslt = !switch("CACHET_MOE_FP8", "cublaslt", "dequant")?;
        o.moe_small_tiles = match var("CACHET_MOE_SMALL_TILES").as_deref() {
            None | Some("") | Some("fp8") => MoeSmallTiles::Fp8,
            Some("all") => MoeSmallTiles::All,
            Some("off") => MoeSmallTiles::Off,
            Some(v) => {
                return Err(bad(
                    "CACHET_MOE_SMALL_TILES",
                    format!("`{v}`: expected `fp8`, `all` or `off`"),
                ))
            }
        };
        o.moe_fp8_mma = switch("CACHET_MOE_FP8_MMA", "widen", "fp8")?;
        o.moe_norm_fused = switch("CACHET_MOE_NORM", "separate", "fused")?;
        o.fp8_bf16_product = !switch("CACHET_FP8_PRODUCT", "bf16", "f32")?;
        o.fp8_exact_activations = switch("CACHET_FP8_ACTIVATIONS", "fast", "exact")?;
        o.attention_heads_first = !switch("CACHET_ATTENTION_ORDER", "heads", "units")?;
        o.fp8_fused_glu = !switch("CACHET_FP8_GLU", "fused", "separate")?;
        o.fp8_fused_norm = !switch("CACHET_FP8_NORM", "fused", "separate")?;
        o.fp8_scales_in_norm = !switch("CACHET_FP8_OUT_SCALES", "norm", "separate")?;
        o.attention_decode_transposed = !switch("CACHET_DECODE_ATTENTION", "transposed", "rows")?;
        o.attention_decode_transposed_bf16 =
            !switch("CACHET_DECODE_ATTENTION_BF16", "transposed", "rows")?;
        o.decode_layers_fused = switch("CACHET_DECODE_LAYERS", "separate", "fused")?;
        Ok(o)
    }
}

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
    fn no_switches_give_the_measured_defaults() {
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
        assert_eq!(o.gemv_max_rows, 2);
        assert!(o.fused_rope && !o.simt_attention);
    }

    #[test]
    fn switches_are_parsed_once_and_bad_values_name_the_form() {
        let o = parse(&[
            ("CACHET_ATTENTION", "simt"),
            ("CACHET_ROPE", "separate"),
            ("CACHET_ATTENTION_SPLIT", "32,128,2,16"),
            ("CACHET_GEMV", "off"),
        ])
        .unwrap();
        assert!(o.simt_attention && !o.fused_rope);
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
        // The fifth number: waves for prompts' causal triangles.
        assert_eq!(
            parse(&[("CACHET_ATTENTION_SPLIT", "64,64,2,64,2")])
                .unwrap()
                .split
                .prompt_waves,
            2
        );
        // The sixth: the fill from which a decode step is left unsplit; 0 turns that rule off.
        let split = parse(&[("CACHET_ATTENTION_SPLIT", "64,64,2,64,1,0")])
            .unwrap()
            .split;
        assert_eq!((split.prompt_waves, split.fill_percent), (1, 0));
        assert_eq!(o.gemv_max_rows, 0);
        assert_eq!(parse(&[("CACHET_GEMV", "9")]).unwrap().gemv_max_rows, 4);
        assert_eq!(
            parse(&[("CACHET_GEMV_FP8", "2")])
                .unwrap()
                .gemv_max_rows_fp8,
            2
        );
        assert_eq!(
            parse(&[("CACHET_GEMV_FP8", "off")])
                .unwrap()
                .gemv_max_rows_fp8,
            0
        );
        assert!(parse(&[("CACHET_GEMV_FP8", "two")]).is_err());
        assert_eq!(parse(&[]).unwrap().moe_gemm_min_rows, 8);
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
            parse(&[("CACHET_MOE_OWN_GEMM", "64")])
                .unwrap()
                .moe_gemm_own_tiles,
            64
        );
        assert_eq!(parse(&[]).unwrap().moe_router, MoeRouter::Gemv);
        assert_eq!(
            parse(&[("CACHET_MOE_ROUTER", "fused")]).unwrap().moe_router,
            MoeRouter::Fused
        );
        assert_eq!(
            parse(&[("CACHET_MOE_ROUTER", "gemm")]).unwrap().moe_router,
            MoeRouter::Gemm
        );
        assert!(parse(&[("CACHET_MOE_ROUTER", "cublas")]).is_err());
        assert_eq!(parse(&[]).unwrap().pdl, Pdl::Early);
        assert_eq!(parse(&[("CACHET_PDL", "late")]).unwrap().pdl, Pdl::Late);
        assert_eq!(parse(&[("CACHET_PDL", "off")]).unwrap().pdl, Pdl::Off);
        assert_eq!(parse(&[("CACHET_PDL", "mixed")]).unwrap().pdl, Pdl::Mixed);
        assert_eq!(parse(&[]).unwrap().graph_memory, GraphMemory::Nodes);
        let fp8 = |o: CudaOptions| {
            (
                o.fp8_fast_accum,
                o.fp8_bf16_product,
                o.fp8_exact_activations,
            )
        };
        assert_eq!(fp8(parse(&[]).unwrap()), (false, true, false));
        assert_eq!(
            fp8(parse(&[
                ("CACHET_FP8_FAST_ACCUM", "1"),
                ("CACHET_FP8_PRODUCT", "f32"),
                ("CACHET_FP8_ACTIVATIONS", "exact")
            ])
            .unwrap()),
            (true, false, true)
        );
        assert!(parse(&[("CACHET_FP8_ACTIVATIONS", "slow")]).is_err());
        assert!(!parse(&[]).unwrap().fp8_gemm_tune);
        assert!(parse(&[]).unwrap().moe_grouped_cublas);
        assert!(
            !parse(&[("CACHET_MOE_GROUPED", "ours")])
                .unwrap()
                .moe_grouped_cublas
        );
        assert!(parse(&[("CACHET_MOE_GROUPED", "cutlass")]).is_err());
        assert!(parse(&[]).unwrap().moe_fp8_cublaslt);
        assert_eq!(parse(&[]).unwrap().moe_small_tiles, MoeSmallTiles::Fp8);
        assert!(MoeSmallTiles::Fp8.apply(true) && !MoeSmallTiles::Fp8.apply(false));
        assert!(MoeSmallTiles::All.apply(false) && !MoeSmallTiles::Off.apply(true));
        assert_eq!(
            parse(&[("CACHET_MOE_SMALL_TILES", "all")])
                .unwrap()
                .moe_small_tiles,
            MoeSmallTiles::All
        );
        assert!(parse(&[("CACHET_MOE_SMALL_TILES", "on")]).is_err());
        assert!(!parse(&[]).unwrap().moe_fp8_mma);
        assert!(parse(&[("CACHET_MOE_FP8_MMA", "fp8")]).unwrap().moe_fp8_mma);
        assert!(parse(&[("CACHET_MOE_FP8_MMA", "on")]).is_err());
        assert_eq!(
            parse(&[("CACHET_MOE_ROUTER", "experts")])
                .unwrap()
                .moe_router,
            MoeRouter::Experts
        );
        assert!(!parse(&[]).unwrap().moe_norm_fused);
        assert!(
            parse(&[("CACHET_MOE_NORM", "fused")])
                .unwrap()
                .moe_norm_fused
        );
        assert!(parse(&[("CACHET_MOE_NORM", "router")]).is_err());
        assert!(
            !parse(&[("CACHET_MOE_FP8", "dequant")])
                .unwrap()
                .moe_fp8_cublaslt
        );
        assert!(
            parse(&[("CACHET_FP8_GEMM_TUNE", "timed")])
                .unwrap()
                .fp8_gemm_tune
        );
        assert!(parse(&[("CACHET_FP8_GEMM_TUNE", "on")]).is_err());
        assert!(parse(&[]).unwrap().attention_heads_first);
        assert!(
            !parse(&[("CACHET_ATTENTION_ORDER", "units")])
                .unwrap()
                .attention_heads_first
        );
        assert!(parse(&[("CACHET_ATTENTION_ORDER", "rows")]).is_err());
        assert!(parse(&[]).unwrap().attention_decode_transposed);
        assert!(
            !parse(&[("CACHET_DECODE_ATTENTION", "rows")])
                .unwrap()
                .attention_decode_transposed
        );
        assert!(parse(&[("CACHET_DECODE_ATTENTION", "units")]).is_err());
        assert!(parse(&[]).unwrap().attention_decode_transposed_bf16);
        assert!(
            !parse(&[("CACHET_DECODE_ATTENTION_BF16", "rows")])
                .unwrap()
                .attention_decode_transposed_bf16
        );
        assert!(!parse(&[]).unwrap().decode_layers_fused);
        assert!(
            parse(&[("CACHET_DECODE_LAYERS", "fused")])
                .unwrap()
                .decode_layers_fused
        );
        assert!(parse(&[("CACHET_DECODE_LAYERS", "prefetch")]).is_err());
        assert!(parse(&[]).unwrap().fp8_fused_glu);
        assert!(
            !parse(&[("CACHET_FP8_GLU", "separate")])
                .unwrap()
                .fp8_fused_glu
        );
        assert!(parse(&[("CACHET_FP8_GLU", "yes")]).is_err());
        assert!(parse(&[]).unwrap().fp8_fused_norm);
        assert!(
            !parse(&[("CACHET_FP8_NORM", "separate")])
                .unwrap()
                .fp8_fused_norm
        );
        assert!(parse(&[]).unwrap().fp8_scales_in_norm);
        assert!(
            !parse(&[("CACHET_FP8_OUT_SCALES", "separate")])
                .unwrap()
                .fp8_scales_in_norm
        );
        assert!(parse(&[("CACHET_FP8_OUT_SCALES", "later")]).is_err());
        assert!(parse(&[("CACHET_FP8_FAST_ACCUM", "yes")]).is_err());
        assert!(parse(&[("CACHET_FP8_PRODUCT", "fp16")]).is_err());
        assert_eq!(
            parse(&[("CACHET_GRAPH_MEMORY", "pool")])
                .unwrap()
                .graph_memory,
            GraphMemory::Pool
        );
        assert_eq!(
            parse(&[("CACHET_MOE_GEMM", "32")])
                .unwrap()
                .moe_gemm_min_rows,
            32
        );
        assert_eq!(
            parse(&[("CACHET_MOE_GEMM", "off")])
                .unwrap()
                .moe_gemm_min_rows,
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
            ("CACHET_ROPE", "sideways", "separate"),
            ("CACHET_ATTENTION", "fast", "simt"),
            ("CACHET_PDL", "on", "early"),
            ("CACHET_GRAPH_MEMORY", "arena", "pool"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(want), "{k}={v}: {e}");
        }
    }
}
