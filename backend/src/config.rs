//! Model hyper-parameters, read from an HF `config.json` or a GGUF header.
//!
//! The dense decoder families in [`Arch`] are supported (Llama 2/3, SmolLM, Mistral, Qwen2 /
//! Qwen2.5, Qwen3); anything else is refused with [`LoadError::UnknownArchitecture`], and a
//! supported family's unsupported variant (a MoE config, an unknown `rope_scaling`, …) with the
//! field named.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::LoadError;

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

    /// Reads an HF `config.json`.
    pub fn from_hf_json(path: &Path) -> Result<Self, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))?;
        let raw: RawHfConfig = serde_json::from_str(&text).map_err(|source| LoadError::Json {
            path: path.into(),
            source,
        })?;
        let arch = raw
            .model_type
            .as_deref()
            .and_then(Arch::from_name)
            .or_else(|| {
                raw.architectures
                    .iter()
                    .find_map(|a| Arch::from_hf_class(a))
            });
        if raw.model_type.as_deref() == Some("gemma3") {
            return Err(LoadError::format(
                path,
                "`model_type` is `gemma3` (Gemma3ForConditionalGeneration, text + vision): only the text-only Gemma 3 checkpoints (`gemma3_text`, Gemma3ForCausalLM: 270M, 1B) are supported",
            ));
        }
        let Some(arch) = arch else {
            let arch = raw
                .architectures
                .first()
                .cloned()
                .or(raw.model_type.clone())
                .unwrap_or_else(|| "<none given>".into());
            return Err(LoadError::UnknownArchitecture {
                path: path.into(),
                arch,
            });
        };
        // Variants of a supported family that this engine does not run, refused by name.
        let dense = !arch.is_moe();
        for (field, present) in [
            (
                "num_experts",
                dense && raw.num_experts.is_some_and(|n| n > 0),
            ),
            (
                "num_local_experts",
                dense && raw.num_local_experts.is_some_and(|n| n > 0),
            ),
            (
                "shared_expert_intermediate_size",
                raw.shared_expert_intermediate_size.is_some_and(|n| n > 0),
            ),
            (
                "n_shared_experts",
                raw.n_shared_experts.is_some_and(|n| n > 0),
            ),
            ("n_group", raw.n_group.is_some_and(|n| n > 1)),
            ("topk_group", raw.topk_group.is_some_and(|n| n > 1)),
            (
                "decoder_sparse_step",
                raw.decoder_sparse_step.is_some_and(|n| n != 1),
            ),
            (
                "mlp_only_layers",
                raw.mlp_only_layers.as_ref().is_some_and(|l| !l.is_empty()),
            ),
            ("mlp_bias", raw.mlp_bias == Some(true)),
            (
                "final_logit_softcapping",
                raw.final_logit_softcapping.is_some_and(|c| c != 0.0),
            ),
            (
                "attn_logit_softcapping",
                raw.attn_logit_softcapping.is_some_and(|c| c != 0.0),
            ),
        ] {
            if present {
                return Err(LoadError::format(
                    path,
                    format!("`{field}` is set: {arch} models with it are not supported (experts in a dense family, shared experts, expert groups, dense layers among sparse ones, MLP biases and logit soft-capping are not implemented)"),
                ));
            }
        }
        let checkpoint_fp8 = check_quantization(path, raw.quantization_config.as_ref())?;
        // Gemma names it `hidden_activation`.
        let (act_field, act) = match (&raw.hidden_activation, &raw.hidden_act) {
            (Some(a), _) => ("hidden_activation", Some(a.as_str())),
            (None, a) => ("hidden_act", a.as_deref()),
        };
        let hidden_act = match (arch, act) {
            (Arch::Gemma3, None | Some("gelu_pytorch_tanh" | "gelu_tanh")) => Activation::GeluTanh,
            (Arch::Gemma3, Some(other)) => {
                return Err(LoadError::format(
                    path,
                    format!(
                        "`{act_field}` is `{other}`: Gemma 3 is supported with `gelu_pytorch_tanh`"
                    ),
                ))
            }
            (_, None | Some("silu")) => Activation::Silu,
            (_, Some(other)) => {
                return Err(LoadError::format(
                    path,
                    format!(
                        "`{act_field}` is `{other}`: only `silu` (SwiGLU) is supported for {arch}"
                    ),
                ))
            }
        };
        let need = |v: Option<usize>, name: &str| {
            v.ok_or_else(|| LoadError::format(path, format!("config.json lacks `{name}`")))
        };
        let moe = if arch.is_moe() {
            // transformers 5 writes Qwen3-MoE's expert count as `num_local_experts`; the
            // published checkpoints name it `num_experts`.
            let num_experts = need(
                raw.num_experts.or(raw.num_local_experts),
                if arch == Arch::Mixtral {
                    "num_local_experts"
                } else {
                    "num_experts"
                },
            )?;
            let top_k = need(raw.num_experts_per_tok, "num_experts_per_tok")?;
            if top_k == 0 || top_k > num_experts {
                return Err(LoadError::format(
                    path,
                    format!("`num_experts_per_tok` is {top_k}: it must be between 1 and the {num_experts} experts"),
                ));
            }
            Some(MoeConfig {
                num_experts,
                top_k,
                expert_intermediate_size: match arch {
                    Arch::Qwen3Moe => need(raw.moe_intermediate_size, "moe_intermediate_size")?,
                    _ => need(raw.intermediate_size, "intermediate_size")?,
                },
                // Mixtral always renormalises its top-2; Qwen3-MoE as its config says
                // (transformers' default: false).
                norm_topk_prob: arch == Arch::Mixtral || raw.norm_topk_prob.unwrap_or(false),
            })
        } else {
            None
        };
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let num_attention_heads = need(raw.num_attention_heads, "num_attention_heads")?;
        // transformers 5 moved rope settings into `rope_parameters` (per layer type where the
        // layers differ, as Gemma 3's); older files use `rope_theta` + `rope_scaling` (+ Gemma's
        // `rope_local_base_freq`).
        let per_type = raw
            .rope_parameters
            .as_ref()
            .filter(|r| r.get("full_attention").is_some());
        let rope_obj = match per_type {
            Some(r) => r.get("full_attention"),
            None => raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref()),
        };
        let rope_local_theta = match per_type.and_then(|r| r.get("sliding_attention")) {
            Some(local) => {
                if !matches!(
                    parse_rope_scaling(local, raw.max_position_embeddings, path)?,
                    RopeScaling::Default
                ) {
                    return Err(LoadError::format(
                        path,
                        "`rope_parameters.sliding_attention` is scaled: only unscaled RoPE is supported on sliding layers",
                    ));
                }
                local.get("rope_theta").and_then(|v| v.as_f64())
            }
            None => raw.rope_local_base_freq,
        };
        let rope_theta = raw
            .rope_theta
            .or_else(|| {
                rope_obj
                    .and_then(|r| r.get("rope_theta"))
                    .and_then(|v| v.as_f64())
            })
            .unwrap_or(10000.0);
        let rope_scaling = match rope_obj {
            None => RopeScaling::Default,
            Some(obj) => parse_rope_scaling(obj, raw.max_position_embeddings, path)?,
        };
        let eos_token_ids = match raw.eos_token_id {
            None => vec![],
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().map(|v| vec![v as u32]).unwrap_or_default()
            }
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_u64())
                .map(|v| v as u32)
                .collect(),
            Some(other) => {
                return Err(LoadError::format(
                    path,
                    format!("eos_token_id: unexpected {other}"),
                ))
            }
        };
        let cfg = ModelConfig {
            arch,
            hidden_size,
            intermediate_size: need(raw.intermediate_size, "intermediate_size")?,
            num_hidden_layers: need(raw.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim: raw
                .head_dim
                .unwrap_or(hidden_size / num_attention_heads.max(1)),
            vocab_size: need(raw.vocab_size, "vocab_size")?,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            // Gemma's configs tie by default.
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(arch == Arch::Gemma3),
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            bos_token_id: raw.bos_token_id,
            eos_token_ids,
            attention_bias: match arch {
                // Qwen2's projections always carry biases (its config has no flag for it).
                Arch::Qwen2 => true,
                _ => raw.attention_bias.unwrap_or(false),
            },
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe),
            sliding_window: match arch {
                Arch::Mistral | Arch::Gemma3 | Arch::Mixtral => raw.sliding_window,
                // Qwen's configs name a window but use it only with `use_sliding_window`.
                Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe
                    if raw.use_sliding_window == Some(true) =>
                {
                    raw.sliding_window
                }
                _ => None,
            },
            sliding_layers: match &raw.layer_types {
                Some(types) => Some(
                    types
                        .iter()
                        .map(|t| match t.as_str() {
                            "sliding_attention" => Ok(true),
                            "full_attention" => Ok(false),
                            other => Err(LoadError::format(
                                path,
                                format!("`layer_types` has `{other}`: supported are full_attention and sliding_attention"),
                            )),
                        })
                        .collect::<Result<Vec<bool>, LoadError>>()?,
                ),
                // Gemma 3 before `layer_types`: every sixth layer is global.
                None if arch == Arch::Gemma3 => Some(
                    (0..raw.num_hidden_layers.unwrap_or(0))
                        .map(|i| (i + 1) % raw.sliding_window_pattern.unwrap_or(6) != 0)
                        .collect(),
                ),
                None => None,
            },
            hidden_act,
            embed_scale: arch == Arch::Gemma3,
            post_norms: arch == Arch::Gemma3,
            attention_scale: match arch {
                Arch::Gemma3 => Some(raw.query_pre_attn_scalar.unwrap_or(256.0).powf(-0.5)),
                _ => None,
            },
            rope_local_theta: match arch {
                Arch::Gemma3 => Some(rope_local_theta.unwrap_or(10000.0)),
                _ => None,
            },
            checkpoint_fp8,
            moe,
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Writes this config as an HF `config.json` that transformers loads as the family's
    /// causal-LM class.
    pub fn to_hf_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "architectures": [self.arch.hf_class()],
            "model_type": self.arch.model_type(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": self.attention_bias,
            "mlp_bias": false,
            "torch_dtype": "float32",
        });
        if let Some(w) = self.sliding_window {
            v["sliding_window"] = w.into();
            if matches!(self.arch, Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe) {
                v["use_sliding_window"] = true.into();
            }
        }
        if let Some(layers) = &self.sliding_layers {
            v["layer_types"] = layers
                .iter()
                .map(|&s| {
                    if s {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect::<Vec<_>>()
                .into();
        }
        if self.arch == Arch::Gemma3 {
            let obj = v.as_object_mut().expect("an object");
            obj.remove("hidden_act");
            obj.insert("hidden_activation".into(), "gelu_pytorch_tanh".into());
            if let Some(s) = self.attention_scale {
                obj.insert("query_pre_attn_scalar".into(), s.powi(-2).round().into());
            }
            if let Some(t) = self.rope_local_theta {
                obj.insert("rope_local_base_freq".into(), t.into());
            }
        }
        if let Some(m) = &self.moe {
            let obj = v.as_object_mut().expect("an object");
            let experts = if self.arch == Arch::Mixtral {
                "num_local_experts"
            } else {
                "num_experts"
            };
            obj.insert(experts.into(), m.num_experts.into());
            obj.insert("num_experts_per_tok".into(), m.top_k.into());
            if self.arch == Arch::Qwen3Moe {
                obj.insert(
                    "moe_intermediate_size".into(),
                    m.expert_intermediate_size.into(),
                );
                obj.insert("norm_topk_prob".into(), m.norm_topk_prob.into());
                obj.insert("decoder_sparse_step".into(), 1.into());
                obj.insert("mlp_only_layers".into(), serde_json::json!([]));
            } else {
                obj.insert(
                    "intermediate_size".into(),
                    m.expert_intermediate_size.into(),
                );
            }
        }
        if let Some(b) = self.bos_token_id {
            v["bos_token_id"] = b.into();
        }
        if let Some(&e) = self.eos_token_ids.first() {
            v["eos_token_id"] = e.into();
        }
        if let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = self.rope_scaling
        {
            v["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            });
        }
        v
    }
}

fn parse_rope_scaling(
    obj: &serde_json::Value,
    max_position_embeddings: Option<usize>,
    path: &Path,
) -> Result<RopeScaling, LoadError> {
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let f = |k: &str| {
        obj.get(k)
            .and_then(|v| v.as_f64())
            .ok_or_else(|| LoadError::format(path, format!("rope scaling `{kind}` lacks `{k}`")))
    };
    match kind {
        "default" => Ok(RopeScaling::Default),
        "linear" => Ok(RopeScaling::Linear {
            factor: f("factor")?,
        }),
        "yarn" => {
            let opt = |k: &str| obj.get(k).and_then(|v| v.as_f64());
            let original = opt("original_max_position_embeddings")
                .map(|v| v as usize)
                .or(max_position_embeddings)
                .ok_or_else(|| {
                    LoadError::format(
                        path,
                        "rope scaling `yarn` lacks `original_max_position_embeddings`",
                    )
                })?;
            let factor = match opt("factor") {
                Some(f) => f,
                None => max_position_embeddings.ok_or_else(|| {
                    LoadError::format(path, "rope scaling `yarn` lacks `factor`")
                })? as f64
                    / original as f64,
            };
            let mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let attention_factor = match (opt("attention_factor"), opt("mscale"), opt("mscale_all_dim")) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    mscale(factor, m) / mscale(factor, all)
                }
                _ => mscale(factor, 1.0),
            };
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: opt("beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: opt("beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0),
                attention_factor,
                truncate: obj.get("truncate").and_then(|v| v.as_bool()).unwrap_or(true),
            })
        }
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: f("factor")?,
            low_freq_factor: f("low_freq_factor")?,
            high_freq_factor: f("high_freq_factor")?,
            original_max_position_embeddings: f("original_max_position_embeddings")? as usize,
        }),
        other => Err(LoadError::format(
            path,
            format!("unsupported `rope_scaling` type `{other}` (supported: default, linear, llama3, yarn)"),
        )),
    }
}

/// The checkpoint quantizations the loader reads: FP8 (e4m3) weights with their scales — HF's
/// `quant_method: "fp8"` (per-tensor, or `weight_block_size` blocks: `weight_scale_inv`) and
/// compressed-tensors' float-quantized FP8 (`weight_scale` per tensor or per channel) — each
/// weight dequantized once at load; the granularity of its scales is returned. Anything else is
/// refused naming the method.
fn check_quantization(
    path: &Path,
    q: Option<&serde_json::Value>,
) -> Result<Option<Fp8Scales>, LoadError> {
    let Some(q) = q.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("");
    let fp8_e4m3 = |v: Option<&serde_json::Value>| {
        v.and_then(|w| w.get("type")).and_then(|t| t.as_str()) == Some("float")
            && v.and_then(|w| w.get("num_bits")).and_then(|n| n.as_u64()) == Some(8)
    };
    let ok = match method {
        "fp8" => q
            .get("fmt")
            .and_then(|f| f.as_str())
            .is_none_or(|f| f == "e4m3"),
        "compressed-tensors" => q
            .get("config_groups")
            .and_then(|g| g.as_object())
            .is_some_and(|groups| {
                !groups.is_empty() && groups.values().all(|g| fp8_e4m3(g.get("weights")))
            }),
        _ => false,
    };
    if ok {
        let scales = match method {
            "fp8" if q.get("weight_block_size").is_some_and(|b| !b.is_null()) => Fp8Scales::Block,
            "fp8" => Fp8Scales::PerTensor,
            _ => {
                let groups = q["config_groups"].as_object().expect("checked above");
                let all = |name: &str| {
                    groups
                        .values()
                        .all(|g| g["weights"]["strategy"].as_str() == Some(name))
                };
                if all("channel") {
                    Fp8Scales::PerChannel
                } else if all("tensor") {
                    Fp8Scales::PerTensor
                } else {
                    Fp8Scales::Block
                }
            }
        };
        return Ok(Some(scales));
    }
    Err(LoadError::format(
        path,
        format!(
            "`quantization_config` with quant_method `{method}` is not supported: FP8 (e4m3) checkpoints load (quant_method `fp8`, or compressed-tensors with 8-bit float weights); for others use the bf16 checkpoint or a GGUF"
        ),
    ))
}

#[derive(Deserialize)]
struct RawHfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<serde_json::Value>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    shared_expert_intermediate_size: Option<usize>,
    n_shared_experts: Option<usize>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    hidden_activation: Option<String>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    rope_local_base_freq: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    quantization_config: Option<serde_json::Value>,
}
