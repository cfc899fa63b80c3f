//! A Hugging Face directory as a model: its config (`config.json`), its tensors under this
//! crate's names, its description.

use super::*;
use crate::config::{Arch, ModelConfig};
use crate::device::Part as Slice;
use crate::error::LoadError;
pub use crate::tensor::HostTensor;
use crate::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};

pub(super) struct HfSource {
    pub(super) dir: PathBuf,
    pub(super) st: hf::SafetensorsDir,
}

impl TensorSource for HfSource {
    fn path(&self) -> &Path {
        &self.dir
    }
    fn has(&self, name: &str) -> bool {
        self.st.contains(name)
    }
    fn get(&self, name: &str) -> Result<HostTensor, LoadError> {
        self.st.tensor(name)
    }
    fn names(&self, cfg: &ModelConfig) -> WeightNames {
        hf_names(cfg)
    }
    fn get_part(
        &self,
        name: &str,
        expected: &[usize],
        part: &Slice<'_>,
    ) -> Result<HostTensor, LoadError> {
        self.st.tensor_part(name, expected, part)
    }
}

/// HF transformers' tensor names (Gemma's sandwich norms name the MLP's input norm
/// `pre_feedforward_layernorm`, and `post_attention_layernorm` is the attention's output norm).
pub(super) fn hf_names(cfg: &ModelConfig) -> WeightNames {
    let sandwich = cfg.post_norms;
    let mixtral = cfg.arch == Arch::Mixtral;
    WeightNames {
        embed: "model.embed_tokens.weight",
        final_norm: "model.norm.weight",
        lm_head: "lm_head.weight",
        layer: Box::new(move |l, p| {
            let s = match p {
                Part::MlpNorm if sandwich => "pre_feedforward_layernorm",
                Part::PostAttnNorm => "post_attention_layernorm",
                Part::PostMlpNorm => "post_feedforward_layernorm",
                Part::AttnNorm => "input_layernorm",
                Part::Q => "self_attn.q_proj",
                Part::K => "self_attn.k_proj",
                Part::V => "self_attn.v_proj",
                Part::O => "self_attn.o_proj",
                Part::MlpNorm => "post_attention_layernorm",
                Part::Gate => "mlp.gate_proj",
                Part::Up => "mlp.up_proj",
                Part::Down => "mlp.down_proj",
                Part::QBias => return format!("model.layers.{l}.self_attn.q_proj.bias"),
                Part::KBias => return format!("model.layers.{l}.self_attn.k_proj.bias"),
                Part::VBias => return format!("model.layers.{l}.self_attn.v_proj.bias"),
                Part::QNorm => "self_attn.q_norm",
                Part::KNorm => "self_attn.k_norm",
                Part::Router if mixtral => "block_sparse_moe.gate",
                Part::Router => "mlp.gate",
                Part::ExpertGate(e) if mixtral => {
                    return format!("model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight")
                }
                Part::ExpertUp(e) if mixtral => {
                    return format!("model.layers.{l}.block_sparse_moe.experts.{e}.w3.weight")
                }
                Part::ExpertDown(e) if mixtral => {
                    return format!("model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight")
                }
                Part::ExpertGate(e) => {
                    return format!("model.layers.{l}.mlp.experts.{e}.gate_proj.weight")
                }
                Part::ExpertUp(e) => {
                    return format!("model.layers.{l}.mlp.experts.{e}.up_proj.weight")
                }
                Part::ExpertDown(e) => {
                    return format!("model.layers.{l}.mlp.experts.{e}.down_proj.weight")
                }
                // HF holds no separately stacked gate and up (the loader then reads the
                // experts one by one, or transformers 5's fused gate|up and down).
                Part::ExpertsGate | Part::ExpertsUp => {
                    return format!("model.layers.{l}.mlp.experts.stacked")
                }
                Part::ExpertsGateUp => return format!("model.layers.{l}.mlp.experts.gate_up_proj"),
                Part::ExpertsDown => return format!("model.layers.{l}.mlp.experts.down_proj"),
            };
            format!("model.layers.{l}.{s}.weight")
        }),
    }
}

/// Loads an HF model directory.
pub fn load_hf(dir: &Path, progress: bool) -> Result<LoadedModel, LoadError> {
    let meta = hf_meta(dir)?;
    let src = HfSource {
        dir: dir.into(),
        st: hf::SafetensorsDir::open(dir)?,
    };
    let weights = WeightReader::new(Box::new(src), &meta.config, None).read_all(progress)?;
    Ok(meta.with_weights(weights))
}

/// An HF directory's name, config and tokenizer.
pub(super) fn hf_meta(dir: &Path) -> Result<ModelMeta, LoadError> {
    let mut config = ModelConfig::from_hf_json(&dir.join("config.json"))?;
    let generation = super::generation::GenerationConfig::of_dir(dir)?;
    // Every id that ends a turn: config.json's first, then generation_config.json's others.
    for &id in &generation.eos_token_ids {
        if !config.eos_token_ids.contains(&id) {
            config.eos_token_ids.push(id);
        }
    }
    let tokenizer = if dir.join("tokenizer.json").exists() {
        Some(TextTokenizer::from_hf_dir(dir)?)
    } else {
        None
    };
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    Ok(ModelMeta {
        name,
        source: dir.into(),
        config,
        tokenizer,
        generation,
    })
}
