//! Model hyper-parameters, read from an HF `config.json` or a GGUF header.
//!
//! The dense decoder families in [`Arch`] are supported (Llama 2/3, SmolLM, Mistral, Qwen2 /
//! Qwen2.5, Qwen3); anything else is refused with [`LoadError::UnknownArchitecture`], and a
//! supported family's unsupported variant (a MoE config, an unknown `rope_scaling`, …) with the
//! field named.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::LoadError;

mod hf;

/// RoPE frequency scaling, as in HF's `rope_scaling` / `rope_parameters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Plain RoPE with `theta`.
    Default,
    /// Llama 3.1's wavelength-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// Positions divided by `factor` (HF's `linear`).
    Linear { factor: f64 },
    /// YaRN: frequencies between interpolation and extrapolation by a ramp over the rotation
    /// counts `beta_slow..beta_fast`, cos/sin scaled by `attention_factor` (resolved at load from
    /// `factor`, `mscale`, `mscale_all_dim` as transformers does).
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
}

/// A decoder family: what its layers hold besides the Llama core (RMSNorm, RoPE, GQA, SwiGLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Llama 2/3, SmolLM and their kin.
    Llama,
    /// Mistral / Ministral: the Llama layer, optionally with a sliding attention window.
    Mistral,
    /// Qwen2 / Qwen2.5: biases on the q, k and v projections.
    Qwen2,
    /// Qwen3 (dense): RMSNorm over each q and k head before RoPE, no biases, a `head_dim` of its
    /// own.
    Qwen3,
    /// Gemma 3 (text): local (sliding-window) and global layers with their own RoPE bases,
    /// GeGLU-tanh, norms before and after each sub-layer with (1 + w) weights, q/k head norm,
    /// embeddings scaled by √hidden, queries by `query_pre_attn_scalar`^-½.
    Gemma3,
    /// Qwen3-MoE: the Qwen3 attention, a mixture-of-experts MLP in every layer (softmax router,
    /// top-k, the k probabilities renormalised when `norm_topk_prob`).
    Qwen3Moe,
    /// Mixtral: the Mistral attention, a mixture of experts (softmax router, top-2 renormalised).
    Mixtral,
}

/// The MLP's gate activation. The discriminants index the CUDA device's kernel tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SwiGLU: silu(gate) · up.
    #[default]
    Silu = 0,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`).
    GeluTanh = 1,
}

impl Arch {
    /// Every supported family, as `cachet model list` shows them.
    pub const ALL: [Arch; 7] = [
        Arch::Llama,
        Arch::Mistral,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
        Arch::Qwen3Moe,
        Arch::Mixtral,
    ];

    /// HF's `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3_text",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Mixtral => "mixtral",
        }
    }
    /// The GGUF `general.architecture` name (llama.cpp writes Mixtral as `llama` with experts;
    /// [`crate::loader::gguf_config`] tells them apart by `llama.expert_count`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Mixtral => "llama",
            a => a.model_type(),
        }
    }
    /// HF's `architectures` entry of the causal-LM class.
    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Gemma3 => "Gemma3ForCausalLM",
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
            Arch::Mixtral => "MixtralForCausalLM",
        }
    }
    /// The family of an HF `model_type`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.model_type() == name)
    }
    /// The family of a GGUF `general.architecture`.
    pub fn from_gguf_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.gguf_name() == name)
    }
    fn from_hf_class(class: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.hf_class() == class)
    }
    /// Whether llama.cpp's converter permuted the q/k rows of this family for its interleaved
    /// RoPE (it does for Llama and Mistral; Qwen is stored in HF's half-split order).
    pub fn gguf_permutes_qk(self) -> bool {
        matches!(self, Arch::Llama | Arch::Mistral | Arch::Mixtral)
    }
    /// Whether the family's MLP is a mixture of experts.
    pub fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Mixtral)
    }
    /// What the family's layers add to the Llama layer, for `cachet model list`.
    pub fn description(self) -> &'static str {
        match self {
            Arch::Llama => "Llama 2/3, SmolLM2: RMSNorm, RoPE (default or llama3 scaling), GQA, SwiGLU",
            Arch::Mistral => "Mistral / Ministral: the Llama layer with a sliding attention window",
            Arch::Qwen2 => "Qwen2 / Qwen2.5 (Coder, Instruct): q/k/v biases",
            Arch::Qwen3 => "Qwen3 dense: per-head q/k RMSNorm, head_dim of its own",
            Arch::Gemma3 => "Gemma 3 text: local sliding-window + global layers, GeGLU-tanh, sandwich (1+w) norms, q/k norm, head_dim 256",
            Arch::Qwen3Moe => "Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3 attention, top-k of many small SwiGLU experts",
            Arch::Mixtral => "Mixtral (8x7B, 8x22B): Mistral attention, top-2 of 8 SwiGLU experts",
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

/// The shape of a decoder model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Biases on the q, k and v projections (Qwen2).
    pub attention_bias: bool,
    /// RMSNorm over each q and k head before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Keys a token attends to at most in a sliding-window layer, itself included (Mistral's
    /// `sliding_window`, Qwen's with `use_sliding_window`, Gemma 3's local layers); `None`: the
    /// whole context everywhere.
    pub sliding_window: Option<usize>,
    /// Which layers slide (HF's `layer_types`); `None`: every layer, when there is a window.
    #[serde(default)]
    pub sliding_layers: Option<Vec<bool>>,
    #[serde(default)]
    pub hidden_act: Activation,
    /// Embeddings multiplied by √hidden_size (Gemma).
    #[serde(default)]
    pub embed_scale: bool,
    /// An RMSNorm on each sub-layer's output before it joins the residual stream (Gemma's
    /// post-attention and post-feed-forward norms).
    #[serde(default)]
    pub post_norms: bool,
    /// The attention's score scale when it is not head_dim^-½ (Gemma: query_pre_attn_scalar^-½).
    #[serde(default)]
    pub attention_scale: Option<f64>,
    /// RoPE base of the sliding-window layers when it differs from the global one (Gemma 3's
    /// `rope_local_base_freq`; unscaled).
    #[serde(default)]
    pub rope_local_theta: Option<f64>,
    /// The checkpoint's weights are FP8 (e4m3) with scales of this granularity (dequantized at
    /// load; `--quantization` decides what the device keeps).
    #[serde(default)]
    pub checkpoint_fp8: Option<Fp8Scales>,
    /// The mixture of experts every layer's MLP is (Qwen3-MoE, Mixtral); `None`: a dense MLP of
    /// `intermediate_size`.
    #[serde(default)]
    pub moe: Option<MoeConfig>,
}

/// A mixture-of-experts MLP: a linear router over `num_experts` SwiGLU experts of width
/// `expert_intermediate_size`; each token goes to the `top_k` experts of highest router
/// probability (softmax over all experts), their outputs summed weighted by those probabilities
/// — renormalised to sum to 1 over the k when `norm_topk_prob`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    pub expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
}

/// How an FP8 checkpoint scales its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fp8Scales {
    /// One scale per tensor.
    PerTensor,
    /// One scale per output row (compressed-tensors' `channel` strategy) — what the device's FP8
    /// weights hold, so quantizing the loaded values again per row gives back the same codes.
    PerChannel,
    /// Scales per block of the weight (HF's `weight_block_size`, compressed-tensors' `block` /
    /// `group`).
    Block,
}

impl ModelConfig {
    /// The attention window of layer `l`: `None` attends over the whole context.
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        let slides = self
            .sliding_layers
            .as_ref()
            .is_none_or(|s| s.get(l).copied().unwrap_or(false));
        self.sliding_window.filter(|_| slides)
    }

    /// Width of the fused q|k|v projection output.
    pub fn qkv_dim(&self) -> usize {
        (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
    }
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Parameters in the model (embeddings counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let bias = if self.attention_bias {
            self.qkv_dim()
        } else {
            0
        };
        let qk_norm = if self.qk_norm { 2 * self.head_dim } else { 0 };
        let post_norms = if self.post_norms { 2 * h } else { 0 };
        let mlp = match &self.moe {
            Some(m) => m.num_experts * (3 * h * m.expert_intermediate_size + h),
            None => 3 * h * self.intermediate_size,
        };
        let per_layer =
            h * self.qkv_dim() + self.q_dim() * h + mlp + 2 * h + bias + qk_norm + post_norms;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + head + h + per_layer * self.num_hidden_layers
    }

    /// Parameters of one expert of a mixture of experts (gate, up and down); 0 for a dense MLP.
    pub fn expert_parameters(&self) -> usize {
        self.moe
            .map_or(0, |m| 3 * self.hidden_size * m.expert_intermediate_size)
    }

    /// Experts per layer a step of `tokens` tokens is expected to touch when the router spreads
    /// tokens evenly: E·(1 − (1 − k/E)^tokens) — k for one token, all E for many. 0 for a dense
    /// model.
    pub fn experts_touched(&self, tokens: usize) -> f64 {
        self.moe.map_or(0.0, |m| {
            let (e, k) = (m.num_experts as f64, m.top_k as f64);
            if tokens == 1 {
                k
            } else {
                e * (1.0 - (1.0 - k / e).powi(tokens.min(i32::MAX as usize) as i32))
            }
        })
    }

    /// Parameters a forward step over `tokens` tokens reads (every weight but the experts it is
    /// expected to leave untouched, [`ModelConfig::experts_touched`]).
    pub fn parameters_read(&self, tokens: usize) -> f64 {
        let untouched = self
            .moe
            .map_or(0.0, |m| m.num_experts as f64 - self.experts_touched(tokens));
        self.num_parameters() as f64
            - self.num_hidden_layers as f64 * untouched * self.expert_parameters() as f64
    }

    /// Parameters each token is multiplied by: all but the experts it is not routed to.
    pub fn active_parameters(&self) -> usize {
        let unused = self.moe.map_or(0, |m| m.num_experts - m.top_k);
        self.num_parameters() - self.num_hidden_layers * unused * self.expert_parameters()
    }

    /// Checks the shape is self-consistent; `path` names the source in the error.
    pub fn validate(&self, path: &Path) -> Result<(), LoadError> {
        let bad = |msg: String| Err(LoadError::format(path, msg));
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return bad("num_attention_heads and num_key_value_heads must be > 0".into());
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim must be even and > 0, got {}",
                self.head_dim
            ));
        }
        if self.hidden_size == 0 || self.vocab_size == 0 || self.num_hidden_layers == 0 {
            return bad("hidden_size, vocab_size and num_hidden_layers must be > 0".into());
        }
        if let Some(l) = &self.sliding_layers {
            if l.len() != self.num_hidden_layers {
                return bad(format!(
                    "`layer_types` names {} layers, the model has {}",
                    l.len(),
                    self.num_hidden_layers
                ));
            }
        }
        if self.sliding_window == Some(0) {
            return bad("`sliding_window` must be > 0".into());
        }
        if let Some(m) = &self.moe {
            if m.num_experts == 0 || m.expert_intermediate_size == 0 {
                return bad("a mixture of experts needs experts > 0 of width > 0".into());
            }
            if m.top_k == 0 || m.top_k > m.num_experts {
                return bad(format!(
                    "`num_experts_per_tok` is {}: it must be between 1 and the {} experts",
                    m.top_k, m.num_experts
                ));
            }
        }
        Ok(())
    }
}
