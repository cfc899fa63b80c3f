//! Model hyper-parameters, read from an HF `config.json` or a GGUF header.
//!
//! Only the Llama family is supported (Llama 2/3, SmolLM, Mistral without sliding window, …);
//! anything else is refused with [`LoadError::UnknownArchitecture`].

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
}

/// The shape of a Llama-family model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
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
}

impl ModelConfig {
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
        let per_layer =
            h * self.qkv_dim() + self.q_dim() * h + 3 * h * self.intermediate_size + 2 * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + head + h + per_layer * self.num_hidden_layers
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
        Ok(())
    }

    /// Reads an HF `config.json`.
    pub fn from_hf_json(path: &Path) -> Result<Self, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))?;
        let raw: RawHfConfig = serde_json::from_str(&text).map_err(|source| LoadError::Json {
            path: path.into(),
            source,
        })?;
        let arch_ok = raw
            .model_type
            .as_deref()
            .is_some_and(|t| t == "llama" || t == "mistral")
            || raw
                .architectures
                .iter()
                .any(|a| a == "LlamaForCausalLM" || a == "MistralForCausalLM");
        if !arch_ok {
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
        }
        let need = |v: Option<usize>, name: &str| {
            v.ok_or_else(|| LoadError::format(path, format!("config.json lacks `{name}`")))
        };
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let num_attention_heads = need(raw.num_attention_heads, "num_attention_heads")?;
        // transformers 5 moved rope settings into `rope_parameters`; older files use
        // `rope_theta` + `rope_scaling`.
        let rope_obj = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref());
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
            Some(obj) => parse_rope_scaling(obj, path)?,
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
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            bos_token_id: raw.bos_token_id,
            eos_token_ids,
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Writes this config as an HF `config.json` that transformers loads as `LlamaForCausalLM`.
    pub fn to_hf_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
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
            "attention_bias": false,
            "mlp_bias": false,
            "torch_dtype": "float32",
        });
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

fn parse_rope_scaling(obj: &serde_json::Value, path: &Path) -> Result<RopeScaling, LoadError> {
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
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: f("factor")?,
            low_freq_factor: f("low_freq_factor")?,
            high_freq_factor: f("high_freq_factor")?,
            original_max_position_embeddings: f("original_max_position_embeddings")? as usize,
        }),
        other => Err(LoadError::format(
            path,
            format!("unsupported rope scaling `{other}` (supported: default, llama3)"),
        )),
    }
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
}
