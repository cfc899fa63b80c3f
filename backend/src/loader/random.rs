//! Random weights for any supported config: tiny models for tests (saved as real HF directories that
//! transformers loads) and real shapes for performance work (`--load-format dummy`).

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use super::{HostTensor, HostWeights};
use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::rng::Rng;

fn normal(rng: &mut Rng, shape: Vec<usize>, std: f64) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::new(shape, (0..n).map(|_| (rng.normal() * std) as f32).collect())
}

fn norm_weight(rng: &mut Rng, n: usize) -> HostTensor {
    HostTensor::new(
        vec![n],
        (0..n)
            .map(|_| (1.0 + 0.2 * (rng.uniform() - 0.5)) as f32)
            .collect(),
    )
}

/// A norm weight as the family stores it: Gemma's are offsets from 1.
fn family_norm(rng: &mut Rng, n: usize, cfg: &ModelConfig) -> HostTensor {
    let mut t = norm_weight(rng, n);
    if cfg.arch == crate::config::Arch::Gemma3 {
        t.data.iter_mut().for_each(|w| *w -= 1.0);
    }
    t
}

/// Deterministic random weights for `cfg`, in HF's (unfused) order of tensors.
pub fn random_hf_tensors(cfg: &ModelConfig, seed: u64) -> Vec<(String, HostTensor)> {
    let mut rng = Rng::new(seed);
    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    // Scale like a trained model's: unit-variance activations into each matmul.
    let s_in = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        normal(&mut rng, vec![v, h], 1.0),
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}.weight");
        out.push((p("input_layernorm"), family_norm(&mut rng, h, cfg)));
        out.push((
            p("self_attn.q_proj"),
            normal(&mut rng, vec![cfg.q_dim(), h], s_in(h)),
        ));
        out.push((
            p("self_attn.k_proj"),
            normal(&mut rng, vec![cfg.kv_dim(), h], s_in(h)),
        ));
        out.push((
            p("self_attn.v_proj"),
            normal(&mut rng, vec![cfg.kv_dim(), h], s_in(h)),
        ));
        out.push((
            p("self_attn.o_proj"),
            normal(&mut rng, vec![h, cfg.q_dim()], s_in(cfg.q_dim())),
        ));
        if cfg.attention_bias {
            let b = |s: &str| format!("model.layers.{l}.self_attn.{s}.bias");
            out.push((b("q_proj"), normal(&mut rng, vec![cfg.q_dim()], 0.5)));
            out.push((b("k_proj"), normal(&mut rng, vec![cfg.kv_dim()], 0.5)));
            out.push((b("v_proj"), normal(&mut rng, vec![cfg.kv_dim()], 0.5)));
        }
        if cfg.qk_norm {
            out.push((
                p("self_attn.q_norm"),
                family_norm(&mut rng, cfg.head_dim, cfg),
            ));
            out.push((
                p("self_attn.k_norm"),
                family_norm(&mut rng, cfg.head_dim, cfg),
            ));
        }
        if cfg.post_norms {
            // Gemma's sandwich: the attention's output norm, then the MLP's input and output.
            out.push((p("post_attention_layernorm"), family_norm(&mut rng, h, cfg)));
            out.push((
                p("pre_feedforward_layernorm"),
                family_norm(&mut rng, h, cfg),
            ));
            out.push((
                p("post_feedforward_layernorm"),
                family_norm(&mut rng, h, cfg),
            ));
        } else {
            out.push((p("post_attention_layernorm"), family_norm(&mut rng, h, cfg)));
        }
        match &cfg.moe {
            None => {
                out.push((p("mlp.gate_proj"), normal(&mut rng, vec![i, h], s_in(h))));
                out.push((p("mlp.up_proj"), normal(&mut rng, vec![i, h], s_in(h))));
                out.push((p("mlp.down_proj"), normal(&mut rng, vec![h, i], s_in(i))));
            }
            Some(m) => {
                // HF's names of the family (Mixtral's w1 / w3 / w2 under block_sparse_moe).
                let mixtral = cfg.arch == crate::config::Arch::Mixtral;
                let (block, [gate, up, down]) = if mixtral {
                    ("block_sparse_moe", ["w1", "w3", "w2"])
                } else {
                    ("mlp", ["gate_proj", "up_proj", "down_proj"])
                };
                let ei = m.expert_intermediate_size;
                // A router of unit-scale logits: distinct top-k choices, no near ties.
                out.push((
                    p(&format!("{block}.gate")),
                    normal(&mut rng, vec![m.num_experts, h], s_in(h)),
                ));
                for e in 0..m.num_experts {
                    let x = |w: &str| p(&format!("{block}.experts.{e}.{w}"));
                    out.push((x(gate), normal(&mut rng, vec![ei, h], s_in(h))));
                    out.push((x(up), normal(&mut rng, vec![ei, h], s_in(h))));
                    out.push((x(down), normal(&mut rng, vec![h, ei], s_in(ei))));
                }
            }
        }
    }
    out.push(("model.norm.weight".into(), family_norm(&mut rng, h, cfg)));
    if !cfg.tie_word_embeddings {
        out.push((
            "lm_head.weight".into(),
            normal(&mut rng, vec![v, h], s_in(h)),
        ));
    }
    out
}

/// Random weights for `cfg`, fused the way devices consume them (through the loader's own
/// assembly, as if read from the HF directory [`save_random_hf_dir`] writes).
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> HostWeights {
    let src = super::MemorySource::new(random_hf_tensors(cfg, seed));
    super::WeightReader::new(Box::new(src), cfg, None)
        .read_all(false)
        .expect("random tensors have the config's shapes")
}

/// Writes `config.json` + `model.safetensors` (f32) for a random model.
pub fn save_random_hf_dir(dir: &Path, cfg: &ModelConfig, seed: u64) -> Result<(), LoadError> {
    std::fs::create_dir_all(dir).map_err(|e| LoadError::io(dir, e))?;
    let cfg_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&cfg.to_hf_json()).expect("json");
    std::fs::write(&cfg_path, text + "\n").map_err(|e| LoadError::io(&cfg_path, e))?;
    let tensors = random_hf_tensors(cfg, seed);
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .into_iter()
        .map(|(n, t)| {
            (
                n,
                t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                t.shape,
            )
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(n, b, s)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).expect("sizes match"),
            )
        })
        .collect();
    let st_path = dir.join("model.safetensors");
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &st_path)
        .map_err(|e| LoadError::format(&st_path, e.to_string()))?;
    Ok(())
}
