//! An HF `config.json` read into a [`ModelConfig`] (and written back from one): the family from
//! `model_type` or the class, the variants this engine does not run refused by field, the
//! transformers 4 and 5 spellings of RoPE and experts both read.

use std::path::Path;

use serde::Deserialize;

use super::{Activation, Arch, Fp8Scales, ModelConfig, MoeConfig, RopeScaling};
use crate::error::LoadError;

/// A field the config must have.
fn need(path: &Path, v: Option<usize>, name: &str) -> Result<usize, LoadError> {
    v.ok_or_else(|| LoadError::format(path, format!("config.json lacks `{name}`")))
}

impl ModelConfig {
    /// Reads an HF `config.json`.
    pub fn from_hf_json(path: &Path) -> Result<Self, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))?;
        let raw: RawHfConfig = serde_json::from_str(&text).map_err(|source| LoadError::Json {
            path: path.into(),
            source,
        })?;
        let arch = raw.arch(path)?;
        raw.refuse_variants(arch, path)?;
        let checkpoint_fp8 = check_quantization(path, raw.quantization_config.as_ref())?;
        let hidden_act = raw.activation(arch, path)?;
        let moe = raw.moe(arch, path)?;
        let hidden_size = need(path, raw.hidden_size, "hidden_size")?;
        let num_attention_heads = need(path, raw.num_attention_heads, "num_attention_heads")?;
        let (rope_theta, rope_scaling, rope_local_theta) = raw.rope(path)?;
        let eos_token_ids = raw.eos_token_ids(path)?;
        let sliding_layers = raw.sliding_layers(arch, path)?;
        let cfg = ModelConfig {
            arch,
            hidden_size,
            intermediate_size: need(path, raw.intermediate_size, "intermediate_size")?,
            num_hidden_layers: need(path, raw.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim: raw
                .head_dim
                .unwrap_or(hidden_size / num_attention_heads.max(1)),
            vocab_size: need(path, raw.vocab_size, "vocab_size")?,
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
            sliding_layers,
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

impl RawHfConfig {
    /// The family, from `model_type` or else the first known class of `architectures`.
    fn arch(&self, path: &Path) -> Result<Arch, LoadError> {
        let arch = self
            .model_type
            .as_deref()
            .and_then(Arch::from_name)
            .or_else(|| {
                self.architectures
                    .iter()
                    .find_map(|a| Arch::from_hf_class(a))
            });
        if self.model_type.as_deref() == Some("gemma3") {
            return Err(LoadError::format(
                path,
                "`model_type` is `gemma3` (Gemma3ForConditionalGeneration, text + vision): only the text-only Gemma 3 checkpoints (`gemma3_text`, Gemma3ForCausalLM: 270M, 1B) are supported",
            ));
        }
        let Some(arch) = arch else {
            let arch = self
                .architectures
                .first()
                .cloned()
                .or(self.model_type.clone())
                .unwrap_or_else(|| "<none given>".into());
            return Err(LoadError::UnknownArchitecture {
                path: path.into(),
                arch,
            });
        };
        Ok(arch)
    }

    /// Variants of a supported family that this engine does not run, refused by name.
    fn refuse_variants(&self, arch: Arch, path: &Path) -> Result<(), LoadError> {
        let dense = !arch.is_moe();
        for (field, present) in [
            (
                "num_experts",
                dense && self.num_experts.is_some_and(|n| n > 0),
            ),
            (
                "num_local_experts",
                dense && self.num_local_experts.is_some_and(|n| n > 0),
            ),
            (
                "shared_expert_intermediate_size",
                self.shared_expert_intermediate_size.is_some_and(|n| n > 0),
            ),
            (
                "n_shared_experts",
                self.n_shared_experts.is_some_and(|n| n > 0),
            ),
            ("n_group", self.n_group.is_some_and(|n| n > 1)),
            ("topk_group", self.topk_group.is_some_and(|n| n > 1)),
            (
                "decoder_sparse_step",
                self.decoder_sparse_step.is_some_and(|n| n != 1),
            ),
            (
                "mlp_only_layers",
                self.mlp_only_layers.as_ref().is_some_and(|l| !l.is_empty()),
            ),
            ("mlp_bias", self.mlp_bias == Some(true)),
            (
                "final_logit_softcapping",
                self.final_logit_softcapping.is_some_and(|c| c != 0.0),
            ),
            (
                "attn_logit_softcapping",
                self.attn_logit_softcapping.is_some_and(|c| c != 0.0),
            ),
        ] {
            if present {
                return Err(LoadError::format(
                    path,
                    format!("`{field}` is set: {arch} models with it are not supported (experts in a dense family, shared experts, expert groups, dense layers among sparse ones, MLP biases and logit soft-capping are not implemented)"),
                ));
            }
        }
        Ok(())
    }

    /// The MLP's activation (`hidden_act`; Gemma's `hidden_activation`).
    fn activation(&self, arch: Arch, path: &Path) -> Result<Activation, LoadError> {
        let (act_field, act) = match (&self.hidden_activation, &self.hidden_act) {
            (Some(a), _) => ("hidden_activation", Some(a.as_str())),
            (None, a) => ("hidden_act", a.as_deref()),
        };
        Ok(match (arch, act) {
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
        })
    }

    /// The experts of a mixture-of-experts family (`None` for a dense one).
    fn moe(&self, arch: Arch, path: &Path) -> Result<Option<MoeConfig>, LoadError> {
        Ok(if arch.is_moe() {
            // transformers 5 writes Qwen3-MoE's expert count as `num_local_experts`; the
            // published checkpoints name it `num_experts`.
            let num_experts = need(
                path,
                self.num_experts.or(self.num_local_experts),
                if arch == Arch::Mixtral {
                    "num_local_experts"
                } else {
                    "num_experts"
                },
            )?;
            let top_k = need(path, self.num_experts_per_tok, "num_experts_per_tok")?;
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
                    Arch::Qwen3Moe => {
                        need(path, self.moe_intermediate_size, "moe_intermediate_size")?
                    }
                    _ => need(path, self.intermediate_size, "intermediate_size")?,
                },
                // Mixtral always renormalises its top-2; Qwen3-MoE as its config says
                // (transformers' default: false).
                norm_topk_prob: arch == Arch::Mixtral || self.norm_topk_prob.unwrap_or(false),
            })
        } else {
            None
        })
    }

    /// `rope_theta`, the scaling, and the sliding layers' own base (Gemma 3).
    fn rope(&self, path: &Path) -> Result<(f64, RopeScaling, Option<f64>), LoadError> {
        // transformers 5 moved rope settings into `rope_parameters` (per layer type where the
        // layers differ, as Gemma 3's); older files use `rope_theta` + `rope_scaling` (+ Gemma's
        // `rope_local_base_freq`).
        let per_type = self
            .rope_parameters
            .as_ref()
            .filter(|r| r.get("full_attention").is_some());
        let rope_obj = match per_type {
            Some(r) => r.get("full_attention"),
            None => self.rope_parameters.as_ref().or(self.rope_scaling.as_ref()),
        };
        let rope_local_theta = match per_type.and_then(|r| r.get("sliding_attention")) {
            Some(local) => {
                if !matches!(
                    parse_rope_scaling(local, self.max_position_embeddings, path)?,
                    RopeScaling::Default
                ) {
                    return Err(LoadError::format(
                        path,
                        "`rope_parameters.sliding_attention` is scaled: only unscaled RoPE is supported on sliding layers",
                    ));
                }
                local.get("rope_theta").and_then(|v| v.as_f64())
            }
            None => self.rope_local_base_freq,
        };
        let rope_theta = self
            .rope_theta
            .or_else(|| {
                rope_obj
                    .and_then(|r| r.get("rope_theta"))
                    .and_then(|v| v.as_f64())
            })
            .unwrap_or(10000.0);
        let rope_scaling = match rope_obj {
            None => RopeScaling::Default,
            Some(obj) => parse_rope_scaling(obj, self.max_position_embeddings, path)?,
        };
        Ok((rope_theta, rope_scaling, rope_local_theta))
    }

    /// `eos_token_id`: one id or a list.
    fn eos_token_ids(&self, path: &Path) -> Result<Vec<u32>, LoadError> {
        Ok(match &self.eos_token_id {
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
        })
    }

    /// Which layers attend through the sliding window (`layer_types`; Gemma 3's pattern).
    fn sliding_layers(&self, arch: Arch, path: &Path) -> Result<Option<Vec<bool>>, LoadError> {
        Ok(match &self.layer_types {
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
                (0..self.num_hidden_layers.unwrap_or(0))
                    .map(|i| (i + 1) % self.sliding_window_pattern.unwrap_or(6) != 0)
                    .collect(),
            ),
            None => None,
        })
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
