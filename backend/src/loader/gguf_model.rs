//! A GGUF file as a model: its config from the metadata (llama.cpp's key names), its tensors
//! under this crate's names (llama.cpp's q/k row permutation undone), its description.

use super::*;
use crate::config::{Activation, Arch, ModelConfig, RopeScaling};
use crate::device::Part as Slice;
use crate::error::LoadError;
pub use crate::tensor::HostTensor;
use std::path::Path;

pub(super) struct GgufSource {
    pub(super) file: gguf::GgufFile,
    pub(super) head_dim: usize,
    /// Whether the converter permuted q/k rows (Llama, Mistral).
    pub(super) permuted_qk: bool,
}

impl TensorSource for GgufSource {
    fn path(&self) -> &Path {
        self.file.path()
    }
    fn has(&self, name: &str) -> bool {
        self.file.tensors.iter().any(|t| t.name == name)
    }
    fn get(&self, name: &str) -> Result<HostTensor, LoadError> {
        let (shape, data) = self.file.tensor_f32(name)?;
        Ok(HostTensor { shape, data })
    }
    fn get_part(
        &self,
        name: &str,
        expected: &[usize],
        part: &Slice<'_>,
    ) -> Result<HostTensor, LoadError> {
        match self.file.tensor_f32_part(name, expected, part)? {
            Some(data) => Ok(HostTensor::new(part.shape(expected), data)),
            None => Ok(part.cut(&checked(self, name, expected)?)),
        }
    }
    fn names(&self, _cfg: &ModelConfig) -> WeightNames {
        WeightNames {
            embed: "token_embd.weight",
            final_norm: "output_norm.weight",
            lm_head: "output.weight",
            layer: Box::new(|l, p| {
                let s = match p {
                    Part::AttnNorm => "attn_norm",
                    Part::Q => "attn_q",
                    Part::K => "attn_k",
                    Part::V => "attn_v",
                    Part::O => "attn_output",
                    Part::MlpNorm => "ffn_norm",
                    Part::Gate => "ffn_gate",
                    Part::Up => "ffn_up",
                    Part::Down => "ffn_down",
                    Part::QBias => return format!("blk.{l}.attn_q.bias"),
                    Part::KBias => return format!("blk.{l}.attn_k.bias"),
                    Part::VBias => return format!("blk.{l}.attn_v.bias"),
                    Part::QNorm => "attn_q_norm",
                    Part::KNorm => "attn_k_norm",
                    Part::PostAttnNorm => "post_attention_norm",
                    Part::PostMlpNorm => "post_ffw_norm",
                    Part::Router => "ffn_gate_inp",
                    Part::ExpertsGate => "ffn_gate_exps",
                    Part::ExpertsUp => "ffn_up_exps",
                    Part::ExpertsDown => "ffn_down_exps",
                    Part::ExpertsGateUp => "ffn_gate_up_exps",
                    Part::ExpertGate(e) => return format!("blk.{l}.ffn_gate.{e}.weight"),
                    Part::ExpertUp(e) => return format!("blk.{l}.ffn_up.{e}.weight"),
                    Part::ExpertDown(e) => return format!("blk.{l}.ffn_down.{e}.weight"),
                };
                format!("blk.{l}.{s}.weight")
            }),
        }
    }
    fn gemma_norm_offsets(&self) -> bool {
        false
    }
    fn fix_qk(&self, t: HostTensor, n_heads: usize) -> HostTensor {
        if self.permuted_qk {
            unpermute_qk(&t, n_heads, self.head_dim)
        } else {
            t
        }
    }
}

/// Undoes the row permutation llama.cpp's converter applies to q/k projections: within each
/// head, GGUF row `2b + a` holds HF row `a·(head_dim/2) + b`.
pub fn unpermute_qk(t: &HostTensor, n_heads: usize, head_dim: usize) -> HostTensor {
    let cols = t.shape[1];
    let half = head_dim / 2;
    let mut out = vec![0.0f32; t.data.len()];
    for h in 0..n_heads {
        for a in 0..2 {
            for b in 0..half {
                let src = h * head_dim + 2 * b + a;
                let dst = h * head_dim + a * half + b;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&t.data[src * cols..(src + 1) * cols]);
            }
        }
    }
    HostTensor {
        shape: t.shape.clone(),
        data: out,
    }
}

/// Reads a model's shape from GGUF metadata.
pub fn gguf_config(file: &gguf::GgufFile) -> Result<ModelConfig, LoadError> {
    let path = file.path();
    let arch = file.get_str("general.architecture")?.to_string();
    let Some(family) = Arch::from_gguf_name(&arch) else {
        return Err(LoadError::UnknownArchitecture {
            path: path.into(),
            arch,
        });
    };
    let k = |s: &str| format!("{arch}.{s}");
    let count = |s: &str| {
        file.get(&k(s))
            .and_then(|v| v.as_u64())
            .filter(|&n| n > 0)
            .map(|n| n as usize)
    };
    // llama.cpp writes Mixtral as `llama` with experts.
    let family = match (family, count("expert_count")) {
        (Arch::Llama, Some(_)) => Arch::Mixtral,
        (f, _) => f,
    };
    let moe = gguf_moe(file, &arch, family)?;
    if file.tensors.iter().any(|t| t.name == "rope_freqs.weight") {
        return Err(LoadError::format(
            path,
            "GGUF with `rope_freqs.weight` (baked llama3 rope scaling) is not supported; load the HF safetensors instead",
        ));
    }
    let hidden_size = file.get_u64(&k("embedding_length"))? as usize;
    let heads = file.get_u64(&k("attention.head_count"))? as usize;
    let vocab_size = match file.get(&k("vocab_size")).and_then(|v| v.as_u64()) {
        Some(v) => v as usize,
        None => file.get_array("tokenizer.ggml.tokens")?.len(),
    };
    let head_dim = file
        .get(&k("attention.key_length"))
        .and_then(|v| v.as_u64())
        .map(|v| v as usize);
    let eos = file
        .get("tokenizer.ggml.eos_token_id")
        .and_then(|v| v.as_u64());
    let num_hidden_layers = file.get_u64(&k("block_count"))? as usize;
    let head_dim = head_dim.unwrap_or(hidden_size / heads.max(1));
    let gemma = family == Arch::Gemma3;
    let cfg = ModelConfig {
        hidden_size,
        intermediate_size: match (&moe, count("feed_forward_length")) {
            (_, Some(n)) => n,
            (Some(m), None) => m.expert_intermediate_size,
            (None, None) => file.get_u64(&k("feed_forward_length"))? as usize,
        },
        num_hidden_layers,
        num_attention_heads: heads,
        num_key_value_heads: file
            .get(&k("attention.head_count_kv"))
            .and_then(|v| v.as_u64())
            .unwrap_or(heads as u64) as usize,
        head_dim,
        vocab_size,
        rms_norm_eps: file.get_f64(&k("attention.layer_norm_rms_epsilon"))?,
        rope_theta: file
            .get(&k("rope.freq_base"))
            .and_then(|v| v.as_f64())
            .unwrap_or(10000.0),
        rope_scaling: gguf_rope_scaling(file, &arch)?,
        tie_word_embeddings: !file.tensors.iter().any(|t| t.name == "output.weight"),
        max_position_embeddings: file
            .get(&k("context_length"))
            .and_then(|v| v.as_u64())
            .unwrap_or(4096) as usize,
        bos_token_id: file
            .get("tokenizer.ggml.bos_token_id")
            .and_then(|v| v.as_u64())
            .map(|v| v as u32),
        eos_token_ids: eos.map(|e| vec![e as u32]).unwrap_or_default(),
        attention_bias: file.tensors.iter().any(|t| t.name == "blk.0.attn_q.bias"),
        qk_norm: file
            .tensors
            .iter()
            .any(|t| t.name == "blk.0.attn_q_norm.weight"),
        sliding_window: file
            .get(&k("attention.sliding_window"))
            .and_then(|v| v.as_u64())
            .filter(|&w| w > 0)
            .map(|w| w as usize),
        // What llama.cpp fixes for Gemma 3 rather than storing: every sixth layer global, a
        // local RoPE base of 10000, queries scaled by head_dim^-½ (hidden/heads for the 27B).
        sliding_layers: gemma.then(|| (0..num_hidden_layers).map(|i| (i + 1) % 6 != 0).collect()),
        hidden_act: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        embed_scale: gemma,
        post_norms: gemma,
        attention_scale: gemma.then(|| {
            let scalar = if num_hidden_layers == 62 {
                hidden_size / heads.max(1)
            } else {
                head_dim
            };
            (scalar as f64).powf(-0.5)
        }),
        rope_local_theta: gemma.then_some(10000.0),
        checkpoint_fp8: None,
        moe,
        arch: family,
    };
    cfg.validate(path)?;
    Ok(cfg)
}

/// The mixture-of-experts shape of a GGUF model of `family` (`None` for a dense one); refused
/// where the metadata and the family disagree or where experts are shared.
fn gguf_moe(
    file: &gguf::GgufFile,
    arch: &str,
    family: Arch,
) -> Result<Option<crate::config::MoeConfig>, LoadError> {
    let path = file.path();
    let k = |s: &str| format!("{arch}.{s}");
    let count = |s: &str| {
        file.get(&k(s))
            .and_then(|v| v.as_u64())
            .filter(|&n| n > 0)
            .map(|n| n as usize)
    };
    if let Some(n) = count("expert_shared_count") {
        return Err(LoadError::format(
            path,
            format!(
                "`{}` is {n}: shared experts are not supported",
                k("expert_shared_count")
            ),
        ));
    }
    Ok(match (family.is_moe(), count("expert_count")) {
        (false, Some(n)) => {
            return Err(LoadError::format(
                path,
                format!(
                    "`{}` is {n}: {family} has no mixture-of-experts variant here",
                    k("expert_count")
                ),
            ))
        }
        (false, None) => None,
        (true, None) => {
            return Err(LoadError::format(
                path,
                format!(
                    "`{}` is missing: {family} is a mixture of experts",
                    k("expert_count")
                ),
            ))
        }
        (true, Some(num_experts)) => Some(crate::config::MoeConfig {
            num_experts,
            top_k: count("expert_used_count").ok_or_else(|| {
                LoadError::format(path, format!("`{}` is missing", k("expert_used_count")))
            })?,
            expert_intermediate_size: match count("expert_feed_forward_length") {
                Some(n) => n,
                None => file.get_u64(&k("feed_forward_length"))? as usize,
            },
            // llama.cpp renormalises the top-k of both families unless told otherwise.
            norm_topk_prob: file
                .get(&k("expert_weights_norm"))
                .and_then(|v| v.as_bool())
                .unwrap_or(true),
        }),
    })
}

/// RoPE scaling from GGUF metadata (`{arch}.rope.scaling.*`, as llama.cpp's converter writes it).
fn gguf_rope_scaling(file: &gguf::GgufFile, arch: &str) -> Result<RopeScaling, LoadError> {
    let k = |s: &str| format!("{arch}.rope.scaling.{s}");
    let kind = file
        .get(&k("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("none");
    let factor = || {
        file.get(&k("factor"))
            .and_then(|v| v.as_f64())
            .ok_or_else(|| LoadError::format(file.path(), format!("`{}` is missing", k("factor"))))
    };
    match kind {
        "none" => Ok(RopeScaling::Default),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "yarn" => {
            let factor = factor()?;
            let original = file
                .get(&k("original_context_length"))
                .and_then(|v| v.as_u64())
                .ok_or_else(|| {
                    LoadError::format(
                        file.path(),
                        format!("`{}` is missing", k("original_context_length")),
                    )
                })? as usize;
            let attention_factor = file
                .get(&k("attn_factor"))
                .and_then(|v| v.as_f64())
                .unwrap_or(if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * factor.ln() + 1.0
                });
            Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor,
                truncate: true,
            })
        }
        other => Err(LoadError::format(
            file.path(),
            format!(
                "`{}` is `{other}`: supported are none, linear, yarn",
                k("type")
            ),
        )),
    }
}

/// Loads a GGUF file: weights (dequantised), shape and tokenizer from its metadata.
pub fn load_gguf(path: &Path, progress: bool) -> Result<LoadedModel, LoadError> {
    let file = gguf::GgufFile::open(path)?;
    let meta = gguf_meta(&file, path)?;
    let src = GgufSource {
        head_dim: meta.config.head_dim,
        permuted_qk: meta.config.arch.gguf_permutes_qk(),
        file,
    };
    let weights = WeightReader::new(Box::new(src), &meta.config, None).read_all(progress)?;
    Ok(meta.with_weights(weights))
}

/// A GGUF file's name, config and tokenizer, from its metadata alone.
pub fn gguf_meta(file: &gguf::GgufFile, path: &Path) -> Result<ModelMeta, LoadError> {
    let mut config = gguf_config(file)?;
    let tokenizer = gguf_tokenizer::from_gguf(file)?;
    // Chat models stop at their end-of-turn token too (Qwen's generation config also names its
    // end of text).
    let qwen_end: &[&str] = match config.arch {
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => &["<|endoftext|>"],
        _ => &[],
    };
    for special in ["<|im_end|>", "<|eot_id|>", "<|end_of_text|>"]
        .iter()
        .chain(qwen_end)
    {
        if let Some(id) = tokenizer.token_id(special) {
            if !config.eos_token_ids.contains(&id) {
                config.eos_token_ids.push(id);
            }
        }
    }
    let name = file
        .get("general.name")
        .and_then(|v| v.as_str())
        .map(String::from)
        .unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
    Ok(ModelMeta {
        name,
        source: path.into(),
        config,
        tokenizer: Some(tokenizer),
        generation: Default::default(),
    })
}
