//! Devices the model runs on, behind one trait.
//!
//! The forward pass ([`crate::model::Decoder`]) is written once against [`Device`]; a device owns
//! its tensor and KV-cache types and implements a handful of fused operations. `cpu` is the f32
//! reference that every other device is held against; `cuda` (bf16, NVRTC kernels + cuBLAS)
//! implements the same operations.
//!
//! The batch is *varlen*: the new tokens of several sequences flattened into one list, each
//! sequence with some tokens already in the paged KV cache. Chunked prefill, decode and mixed
//! batches are all this one shape.

pub mod cpu;
pub mod cuda;
pub mod fp8;
pub mod kv_int8;
pub mod moe;
mod step;

pub use step::{DeviceSample, LogitEdits, RowMasks, RowSampling, StepPlan};

use crate::config::Activation;
use crate::error::{DeviceError, EngineError};
use crate::tensor::HostTensor;
pub use moe::{MoeParams, MoeWeights};

/// How the KV cache stores keys and values (vLLM's `--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtype {
    /// The device's activation type: f32 on the CPU, bf16 on CUDA.
    #[default]
    Auto,
    /// FP8 e4m3 with an f32 scale per token and KV head ([`fp8`]): about half the bytes of bf16.
    Fp8E4m3,
    /// INT8 with static per-channel scales calibrated at load and each head's largest channels
    /// in bf16 ([`kv_int8`]): FP8's bytes, closer to the unquantized cache.
    Int8,
}

impl std::str::FromStr for KvCacheDtype {
    type Err = crate::error::BadValue;
    fn from_str(s: &str) -> Result<Self, crate::error::BadValue> {
        match s {
            "auto" | "bf16" => Ok(KvCacheDtype::Auto),
            "fp8" | "fp8_e4m3" => Ok(KvCacheDtype::Fp8E4m3),
            "int8" => Ok(KvCacheDtype::Int8),
            "fp8_e5m2" => Err(crate::error::BadValue::Unsupported {
                what: "KV cache dtype",
                got: s.to_string(),
                instead: "use fp8 (e4m3 with per-token scales)",
            }),
            other => Err(crate::error::BadValue::unknown(
                "KV cache dtype",
                other,
                "auto, fp8, int8",
            )),
        }
    }
}

impl std::fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fp8E4m3 => "fp8",
            KvCacheDtype::Int8 => "int8",
        })
    }
}

/// How the projections' weights are stored (vLLM's `--quantization`): as loaded (bf16 on CUDA,
/// f32 on the CPU) or FP8 — e4m3fn with one f32 scale per output row, quantized at load
/// ([`Device::quantize_fp8`]). The embedding table, the LM head and the norms stay as loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightQuantization {
    #[default]
    None,
    Fp8,
}

impl std::str::FromStr for WeightQuantization {
    type Err = crate::error::BadValue;
    fn from_str(s: &str) -> Result<Self, crate::error::BadValue> {
        match s {
            "none" => Ok(WeightQuantization::None),
            "fp8" => Ok(WeightQuantization::Fp8),
            other => Err(crate::error::BadValue::unknown(
                "quantization",
                other,
                "none, fp8: FP8 weights, quantized at load",
            )),
        }
    }
}

impl WeightQuantization {
    /// What to keep on the device: the flag's choice, or without one FP8 for a checkpoint whose
    /// weights are FP8 with a scale per output row — the device's own FP8 format, so the codes
    /// come back unchanged (half the memory of keeping the dequantized values). Checkpoints
    /// scaled per tensor or per block stay dequantized unless asked: quantizing them again per
    /// row would round every weight a second time.
    pub fn for_checkpoint(flag: Option<Self>, config: &crate::config::ModelConfig) -> Self {
        flag.unwrap_or(match config.checkpoint_fp8 {
            Some(crate::config::Fp8Scales::PerChannel) => WeightQuantization::Fp8,
            _ => WeightQuantization::None,
        })
    }
}

impl std::fmt::Display for WeightQuantization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightQuantization::None => "none",
            WeightQuantization::Fp8 => "fp8",
        })
    }
}

/// Shape of the paged KV cache: `num_blocks` blocks of `block_size` token slots, per layer, for
/// K and V. A token's slot is `block_id · block_size + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub dtype: KvCacheDtype,
}

impl KvLayout {
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }
    /// Bytes one block takes across all layers, K and V: `native_elem` bytes per value in the
    /// device's own type, or (FP8, INT8) a code per value plus 4 bytes per token-head.
    pub fn block_bytes(&self, native_elem: usize) -> usize {
        let head = match self.dtype {
            KvCacheDtype::Auto => self.head_dim * native_elem,
            KvCacheDtype::Fp8E4m3 => fp8::fp8_head_bytes(self.head_dim),
            KvCacheDtype::Int8 => kv_int8::int8_head_bytes(self.head_dim),
        };
        2 * self.num_layers * self.block_size * self.num_kv_heads * head
    }
}

/// One sequence's part of a [`ForwardBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqInBatch {
    /// Index of this sequence's first new token in the flattened batch.
    pub query_start: usize,
    /// Number of new tokens this step.
    pub query_len: usize,
    /// Tokens in the cache once this step's tokens are written (cached prefix + new).
    pub context_len: usize,
    /// Physical block ids, in order, covering at least `context_len` tokens.
    pub block_table: Vec<u32>,
}

/// A flattened varlen batch: what one forward pass computes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// New tokens of every sequence, sequence after sequence.
    pub token_ids: Vec<u32>,
    /// Absolute position of each new token in its sequence.
    pub positions: Vec<u32>,
    /// Cache slot each new token's K/V is written to.
    pub slot_mapping: Vec<u32>,
    pub seqs: Vec<SeqInBatch>,
    /// Rows of the batch whose logits are wanted (usually each sequence's last new token).
    pub logit_rows: Vec<u32>,
}

impl ForwardBatch {
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Adds one sequence's new tokens: `tokens` go at positions `cached..cached+len` and the
    /// block table must cover them. Logits are requested for the last new token when
    /// `want_logits`.
    pub fn push_seq(
        &mut self,
        tokens: &[u32],
        cached: usize,
        block_table: &[u32],
        block_size: usize,
        want_logits: bool,
    ) {
        let start = self.token_ids.len();
        for (i, &t) in tokens.iter().enumerate() {
            let pos = cached + i;
            self.token_ids.push(t);
            self.positions.push(pos as u32);
            self.slot_mapping.push(
                block_table[pos / block_size] * block_size as u32 + (pos % block_size) as u32,
            );
        }
        self.seqs.push(SeqInBatch {
            query_start: start,
            query_len: tokens.len(),
            context_len: cached + tokens.len(),
            block_table: block_table.to_vec(),
        });
        if want_logits && !tokens.is_empty() {
            self.logit_rows.push((start + tokens.len() - 1) as u32);
        }
    }

    /// Checks internal consistency against a KV layout; a bad batch never reaches a kernel.
    pub fn validate(&self, layout: &KvLayout, vocab: usize) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidBatch(m));
        let n = self.token_ids.len();
        if self.positions.len() != n || self.slot_mapping.len() != n {
            return bad(format!(
                "{n} tokens but {} positions / {} slots",
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        if let Some(&t) = self.token_ids.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!("token id {t} is outside the vocabulary of {vocab}"));
        }
        if let Some(&s) = self
            .slot_mapping
            .iter()
            .find(|&&s| s as usize >= layout.num_slots())
        {
            return bad(format!(
                "slot {s} is outside the cache of {} slots",
                layout.num_slots()
            ));
        }
        let mut next = 0;
        for (i, s) in self.seqs.iter().enumerate() {
            if s.query_start != next || s.query_len == 0 || s.query_len > s.context_len {
                return bad(format!("sequence {i} has a bad extent"));
            }
            next += s.query_len;
            if s.block_table.len() * layout.block_size < s.context_len {
                return bad(format!(
                    "sequence {i}: block table too short for {} tokens",
                    s.context_len
                ));
            }
            if s.block_table
                .iter()
                .any(|&b| b as usize >= layout.num_blocks)
            {
                return bad(format!("sequence {i}: block id outside the pool"));
            }
            for t in s.query_start..s.query_start + s.query_len {
                let want = s.context_len - s.query_len + (t - s.query_start);
                if self.positions[t] as usize != want {
                    return bad(format!(
                        "sequence {i}: token {t} has position {} not {want}",
                        self.positions[t]
                    ));
                }
            }
        }
        if next != n {
            return bad(format!("sequences cover {next} of {n} tokens"));
        }
        if self.logit_rows.iter().any(|&r| r as usize >= n) {
            return bad("logit row outside the batch".into());
        }
        Ok(())
    }
}

/// `(rows, cols)` of a 1-D (`[n]` → one row) or 2-D tensor shape; other ranks are an error of `op`.
pub fn matrix_dims(
    shape: &[usize],
    device: &'static str,
    op: &'static str,
) -> Result<(usize, usize), DeviceError> {
    match shape {
        [n] => Ok((1, *n)),
        [r, c] => Ok((*r, *c)),
        s => Err(DeviceError::Op {
            device,
            op,
            msg: format!("shape {s:?} is not 1-D or 2-D"),
        }),
    }
}

/// A tensor-parallel rank's part of a weight: its row ranges of the whole tensor, in order, and
/// its columns (a 1-D tensor's elements are its rows). The part is `[Σ rows, cols]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part<'a> {
    pub rows: &'a [std::ops::Range<usize>],
    pub cols: std::ops::Range<usize>,
}

impl Part<'_> {
    /// The part's shape, of a whole tensor of `shape`.
    pub fn shape(&self, shape: &[usize]) -> Vec<usize> {
        let rows = self.rows.iter().map(|r| r.len()).sum();
        if shape.len() == 2 {
            vec![rows, self.cols.len()]
        } else {
            vec![rows]
        }
    }

    /// Whether the part lies inside a whole tensor of `shape`.
    pub fn fits(&self, shape: &[usize]) -> bool {
        let (rows, cols) = match shape {
            [r, c] => (*r, *c),
            [n] => (*n, 1),
            _ => return false,
        };
        self.cols.end <= cols && self.rows.iter().all(|r| r.start <= r.end && r.end <= rows)
    }

    /// The part of a whole host tensor `t`.
    pub fn cut(&self, t: &HostTensor) -> HostTensor {
        let cols = if t.shape.len() == 2 { t.shape[1] } else { 1 };
        let mut data = Vec::with_capacity(self.shape(&t.shape).iter().product());
        for r in self.rows {
            for row in t.data[r.start * cols..r.end * cols].chunks(cols) {
                data.extend_from_slice(&row[self.cols.clone()]);
            }
        }
        HostTensor::new(self.shape(&t.shape), data)
    }
}

/// Attention shape parameters.
#[derive(Debug, Clone, Copy)]
pub struct AttnParams {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Keys each query sees at most, itself included (a sliding-window layer); `None`: all.
    pub window: Option<usize>,
}

/// A sub-layer's output on its way into the residual stream: added as it is, or first
/// `rms_norm(x) · norm` where the model normalises its sub-layers' outputs (Gemma's
/// post-attention and post-feed-forward norms, fused into the next sub-layer's add + norm).
pub struct Delta<'a, T> {
    pub x: &'a T,
    pub norm: Option<&'a T>,
}

impl<T> Clone for Delta<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Delta<'_, T> {}

/// The RMSNorm of each q head (weight `q`, `[head_dim]`) and each k head (`k`) before RoPE
/// (Qwen3's and Gemma 3's q/k norm); v untouched.
pub struct HeadNorm<'a, T> {
    pub q: &'a T,
    pub k: &'a T,
    pub eps: f32,
}

impl<T> Clone for HeadNorm<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for HeadNorm<'_, T> {}

/// What one layer's attention takes besides its inputs and the cache: the q/k head norms (where
/// the model has them), the RoPE table, the layer's index and its shape.
pub struct AttnLayer<'a, T> {
    pub qk_norm: Option<HeadNorm<'a, T>>,
    pub rope: &'a T,
    pub layer: usize,
    pub p: &'a AttnParams,
}

impl<T> Clone for AttnLayer<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for AttnLayer<'_, T> {}

/// A model shape a device does not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("head_dim {got} is above the {max} the attention kernels take")]
    HeadDim { got: usize, max: usize },
}

/// A device: tensors, a paged KV cache, and the fused operations the decoder forward needs.
/// Activations are 2-D row-major `[tokens, features]`.
pub trait Device: Send {
    type Tensor: Send;
    type Kv: Send;
    /// Batch metadata in the device's memory.
    type Batch;

    fn name(&self) -> &'static str;
    /// Whether this device runs a model of `config`'s shape; the reason where it does not.
    fn supports(&self, _config: &crate::config::ModelConfig) -> Result<(), Unsupported> {
        Ok(())
    }
    /// Copies a host f32 tensor to the device, converting to the device's weight format.
    fn upload(&self, t: &HostTensor) -> Result<Self::Tensor, DeviceError>;
    /// [`Device::upload`] of a tensor the caller gives up: a device whose format is the host's
    /// (the CPU) keeps its memory instead of copying it.
    fn upload_owned(&self, t: HostTensor) -> Result<Self::Tensor, DeviceError> {
        self.upload(&t)
    }
    /// The paged KV cache of `layout`, zeroed; an INT8 one ([`KvCacheDtype::Int8`]) with its
    /// calibrated table, which only it takes ([`kv_int8::check_table`]).
    fn alloc_kv(
        &self,
        layout: &KvLayout,
        int8: Option<&kv_int8::KvInt8Table>,
    ) -> Result<Self::Kv, DeviceError>;
    /// K and V of `layer` at `slots` of an unquantized cache, as f32 `[slots, kv heads · d]`
    /// each: what the INT8 cache's calibration reads back.
    fn kv_rows(
        &self,
        kv: &Self::Kv,
        layer: usize,
        slots: std::ops::Range<usize>,
    ) -> Result<(Vec<f32>, Vec<f32>), DeviceError>;
    fn prepare_batch(&self, batch: &ForwardBatch) -> Result<Self::Batch, DeviceError>;
    /// Rows of `table` for each token id, times `scale` (1, or Gemma's √hidden).
    fn embed(
        &self,
        table: &Self::Tensor,
        batch: &Self::Batch,
        scale: f32,
    ) -> Result<Self::Tensor, DeviceError>;
    /// `rms_norm(x) · w`, row by row.
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor, DeviceError>;
    /// `residual += delta` (normalised first where it says so), then returns
    /// `rms_norm(residual) · w`.
    fn add_rms_norm(
        &self,
        residual: &mut Self::Tensor,
        delta: Delta<'_, Self::Tensor>,
        w: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor, DeviceError>;
    /// `x · wᵀ`: x `[n, k]`, w `[m, k]` → `[n, m]`.
    fn linear(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor, DeviceError>;
    /// [`Device::linear`] for a sub-layer's output (o_proj, a dense MLP's down projection), used
    /// only as the next norm's [`Delta`] — after [`Device::all_reduce_sum`] under tensor
    /// parallelism — so a device may leave part of the work to that norm (CUDA: an FP8
    /// product's scales).
    fn linear_delta(&self, x: &Self::Tensor, w: &Self::Tensor)
        -> Result<Self::Tensor, DeviceError>;
    /// Tensor parallelism: `t` summed over the ranks of this device's group, in place (the
    /// row-parallel projections' partial sums). A device that is no rank has nothing to add.
    fn all_reduce_sum(&self, _t: &mut Self::Tensor) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Tensor parallelism: the ranks' column blocks of `t` side by side in rank order (the
    /// vocabulary-parallel LM head's logits). A device that is no rank returns `t`.
    fn all_gather_cols(&self, t: Self::Tensor) -> Result<Self::Tensor, DeviceError> {
        Ok(t)
    }
    /// Projection weights `[m, k]` in FP8 for [`WeightQuantization::Fp8`]: each row's scale is
    /// its largest magnitude / 448 and its values, divided by it, are rounded to e4m3fn
    /// (nearest even, saturating) — [`fp8::quantize_row`]. The result
    /// serves [`Device::linear`], [`Device::norm_linear`] and [`Device::norm_glu`] as `w`.
    fn quantize_fp8(&self, w: Self::Tensor) -> Result<Self::Tensor, DeviceError>;
    /// The attention of a layer: rotates the q and k parts of `qkv` (`[n, (h + 2·kvh)·d]`) with
    /// the cos/sin `rope` table (`[max_pos, d/2]` cos then `[max_pos, d/2]` sin) — after the
    /// RMSNorm of each q and k head where the model has one (`qk_norm`) — writes k and v
    /// into the cache of `layer` at the batch's slot mapping, then returns the causal attention
    /// of each new token over its sequence's cached keys/values (which include this step's):
    /// `[n, h·d]`. One call, so a device may fuse the norm, the rotation and the cache write into
    /// the attention itself; `qkv` is scratch afterwards.
    fn attention(
        &self,
        qkv: &mut Self::Tensor,
        kv: &mut Self::Kv,
        batch: &Self::Batch,
        l: AttnLayer<'_, Self::Tensor>,
    ) -> Result<Self::Tensor, DeviceError>;
    /// `x[r, :] += bias` for every row (the q|k|v biases of Qwen2).
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Tensor) -> Result<(), DeviceError>;
    /// `act(gate) · up` of a fused `[n, 2·i]` gate|up tensor: SwiGLU (silu) or GeGLU
    /// (gelu_tanh, Gemma).
    fn glu(&self, gate_up: &Self::Tensor, act: Activation) -> Result<Self::Tensor, DeviceError>;
    /// The batch's `logit_rows`.
    fn gather_logit_rows(
        &self,
        x: &Self::Tensor,
        batch: &Self::Batch,
    ) -> Result<Self::Tensor, DeviceError>;
    /// Copies a tensor to host f32, row-major.
    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>, DeviceError>;

    /// A sub-layer's input: `residual += delta` when there is a delta, then
    /// `rms_norm(residual) · norm`.
    fn norm(
        &self,
        residual: &mut Self::Tensor,
        delta: Option<Delta<'_, Self::Tensor>>,
        norm: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor, DeviceError> {
        match delta {
            Some(d) => self.add_rms_norm(residual, d, norm, eps),
            None => self.rms_norm(residual, norm, eps),
        }
    }

    /// [`Device::norm`] then `· wᵀ`; one fused pass where the device has one (decode steps).
    fn norm_linear(
        &self,
        residual: &mut Self::Tensor,
        delta: Option<Delta<'_, Self::Tensor>>,
        norm: &Self::Tensor,
        eps: f32,
        w: &Self::Tensor,
    ) -> Result<Self::Tensor, DeviceError>;

    /// [`Device::norm`], the fused gate|up projection, then [`Device::glu`]; one fused pass
    /// where the device has one (decode steps).
    fn norm_glu(
        &self,
        residual: &mut Self::Tensor,
        delta: Option<Delta<'_, Self::Tensor>>,
        norm: &Self::Tensor,
        eps: f32,
        gate_up: &Self::Tensor,
        act: Activation,
    ) -> Result<Self::Tensor, DeviceError>;

    /// A mixture-of-experts MLP over normalised rows `x` (`[n, hidden]`): each row routed
    /// ([`moe::route`]) and its experts' SwiGLU outputs summed with their weights: `[n, hidden]`
    /// (under tensor parallelism a partial sum over this rank's columns of every expert).
    fn moe(
        &self,
        x: &Self::Tensor,
        w: MoeWeights<'_, Self::Tensor>,
        p: &MoeParams,
    ) -> Result<Self::Tensor, DeviceError>;

    /// [`Device::norm`], then [`Device::moe`] over the normalised rows; the norm fused into the
    /// router's pass where the device has one (decode steps).
    fn norm_moe(
        &self,
        residual: &mut Self::Tensor,
        delta: Option<Delta<'_, Self::Tensor>>,
        norm: &Self::Tensor,
        eps: f32,
        w: MoeWeights<'_, Self::Tensor>,
        p: &MoeParams,
    ) -> Result<Self::Tensor, DeviceError>;

    /// Uploads a table that must keep f32 precision (RoPE cos/sin).
    fn upload_table(&self, t: &HostTensor) -> Result<Self::Tensor, DeviceError>;
    /// The LM head: like [`Device::linear`], but the logits keep full precision.
    fn lm_head(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor, DeviceError>;
    /// A weight of `shape` drawn from N(mean, std²) by a counter-based generator (`--load-format
    /// dummy`): made where it lives, never on the host.
    fn random(
        &self,
        shape: &[usize],
        seed: u64,
        mean: f32,
        std: f32,
    ) -> Result<Self::Tensor, DeviceError>;
    /// `part` of the weight [`Device::random`] makes of `shape` with `seed`: the same values
    /// the whole tensor has there (a tensor-parallel rank's slice of a dummy model is the slice
    /// of the unsplit model's).
    fn random_part(
        &self,
        shape: &[usize],
        part: &Part<'_>,
        seed: u64,
        mean: f32,
        std: f32,
    ) -> Result<Self::Tensor, DeviceError>;
    /// (free, total) device memory in bytes, where the device has its own.
    fn memory_info(&self) -> Option<(usize, usize)> {
        None
    }
    /// Waits for queued work (for timing).
    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Sets the logits of tokens a grammar does not allow to -inf: mask `i` (`words` 32-bit words,
    /// token `t` allowed when bit `t % 32` of word `t / 32` is set) applies to row `rows[i]`.
    fn mask_logits(&self, logits: &mut Self::Tensor, masks: &RowMasks) -> Result<(), DeviceError>;
    /// Applies the processors' sparse edits to `[rows, vocab]` logits in place.
    fn edit_logits(&self, logits: &mut Self::Tensor, edits: &LogitEdits)
        -> Result<(), DeviceError>;
    /// Picks each logits row's token on the device, with the log-probabilities of the rows whose
    /// `logprobs` entry is ≥ 0 (that many alternatives); `None` if this device samples on the
    /// host.
    fn sample(
        &self,
        _logits: &Self::Tensor,
        _rows: &[RowSampling],
        _logprobs: &[i32],
    ) -> Result<Option<DeviceSample>, DeviceError>;
    /// Whether [`Device::sample`] picks tokens here (then the host sees no probabilities).
    fn samples_on_device(&self) -> bool;
}

/// What a device tells about its own work, and the replayable graphs of its decode steps:
/// per-operation profiles, timed collectives and GEMMs, measured ceilings, CUDA graphs. Kept off
/// [`Device`], whose methods are the model's arithmetic; a device without them (the CPU
/// reference: no graphs, nothing to calibrate) takes the defaults — none.
pub trait Instruments: Device {
    /// Turns per-operation timing (device events around each operation) on or off.
    fn set_profiling(&self, _on: bool) {}
    /// Time per operation since the last call: (operation, total ms, calls), largest first.
    fn take_profile(&self) -> Result<Vec<(String, f64, usize)>, DeviceError> {
        Ok(Vec::new())
    }
    /// The device's measured ceilings (copy bandwidth, matmul rate), where it can measure them.
    fn calibrate(&self) -> Result<Option<Calibration>, DeviceError> {
        Ok(None)
    }
    /// Tensor parallelism: seconds of `count` all-reduces of `elems` bf16 values back to back
    /// over this device's group, as one timed run (the row-parallel sums of a step on their
    /// own); every rank of the group must call it at once. `None` where the device is no rank.
    fn time_all_reduce(&self, _elems: usize, _count: usize) -> Result<Option<f64>, DeviceError> {
        Ok(None)
    }
    /// Seconds of `repeat` passes over the GEMMs `shapes` — (rows, out features, in features): a
    /// bf16 activation of rows × in times a weight of out × in, each shape with weights of its
    /// own — run back to back on random data, as one timed run (a model's matmuls on their own,
    /// the ceiling of a prefill); `None` where the device cannot time them.
    fn time_gemms(
        &self,
        _shapes: &[(usize, usize, usize)],
        _repeat: usize,
    ) -> Result<Option<f64>, DeviceError> {
        Ok(None)
    }

    /// Captures replayable decode-step graphs (CUDA graphs) for the padded batch sizes `sizes`
    /// and every context bucket up to `max_len`: `body` is the forward pass from a device batch
    /// to `[rows, vocab]` logits. `None` where the device has no graphs.
    fn capture_decode_graphs(
        &self,
        _kv: &mut Self::Kv,
        _shapes: &GraphShapes,
        _max_len: usize,
        _vocab: usize,
        _body: &mut ForwardBody<'_, Self>,
    ) -> Result<Option<GraphReport>, EngineError> {
        Ok(None)
    }
    /// Runs `batch` by replaying a captured graph when it is a decode step (one new token per
    /// sequence, logits for each) or a verification step (a few tokens per sequence, logits for
    /// every one) of a captured shape; `None`: run it eagerly.
    fn forward_graphed(
        &self,
        _kv: &mut Self::Kv,
        _batch: &ForwardBatch,
        _body: &mut ForwardBody<'_, Self>,
    ) -> Result<Option<Self::Tensor>, EngineError> {
        Ok(None)
    }
    /// Turns replaying captured graphs on or off (they stay captured); whether any exist.
    fn set_graphs_enabled(&self, _kv: &mut Self::Kv, _on: bool) -> bool {
        false
    }
}
/// The forward pass from a prepared batch to logits, as graphs capture it.
pub type ForwardBody<'a, D> = dyn FnMut(
        &mut <D as Device>::Kv,
        &<D as Device>::Batch,
    ) -> Result<<D as Device>::Tensor, EngineError>
    + 'a;

/// Which decode steps get CUDA graphs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphShapes {
    /// Batch sizes of plain decode steps (one new token per sequence): a step of `n` sequences
    /// replays the smallest size ≥ n.
    pub sizes: Vec<usize>,
    /// Speculative verification steps (the last known token and its drafts, logits for each):
    /// up to this many tokens per sequence, padded to it; 0 = none. Captured for the sizes of
    /// at most `verify_max_seqs` sequences (speculation stands down above them).
    pub verify_tokens: usize,
    pub verify_max_seqs: usize,
}

impl GraphShapes {
    /// Plain decode graphs for `sizes`, no verification graphs.
    pub fn decode(sizes: &[usize]) -> Self {
        GraphShapes {
            sizes: sizes.to_vec(),
            ..Default::default()
        }
    }
}

/// What capturing decode graphs took.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct GraphReport {
    pub graphs: usize,
    /// Device memory the graphs hold (their activations and static buffers).
    pub bytes: usize,
    pub capture_ms: f64,
    /// Kernel-to-kernel edges launched programmatically (Hopper and later), over all graphs.
    pub programmatic_edges: usize,
}

/// Ceilings measured on the device in the same run as a benchmark.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Calibration {
    /// Device-to-device copy, bytes read + written per second.
    pub copy_bytes_per_s: f64,
    /// bf16 GEMM at 8192³, FLOP/s.
    pub gemm_flops: f64,
}
