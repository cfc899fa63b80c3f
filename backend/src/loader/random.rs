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

/// How a random tensor is drawn: normal with this standard deviation, or a norm weight near 1
/// (near 0 where the family stores offsets from 1).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Init {
    Normal(f64),
    Norm,
}

/// The tensors of `cfg` in HF's (unfused) order: name, shape and how each is drawn.
fn hf_tensor_specs(cfg: &ModelConfig) -> Vec<(String, (Vec<usize>, Init))> {
    let (h, i, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
    // Scale like a trained model's: unit-variance activations into each matmul.
    let s_in = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        (vec![v, h], Init::Normal(1.0)),
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}.weight");
        out.push((p("input_layernorm"), (vec![h], Init::Norm)));
        out.push((
            p("self_attn.q_proj"),
            (vec![cfg.q_dim(), h], Init::Normal(s_in(h))),
        ));
        out.push((
            p("self_attn.k_proj"),
            (vec![cfg.kv_dim(), h], Init::Normal(s_in(h))),
        ));
        out.push((
            p("self_attn.v_proj"),
            (vec![cfg.kv_dim(), h], Init::Normal(s_in(h))),
        ));
        out.push((
            p("self_attn.o_proj"),
            (vec![h, cfg.q_dim()], Init::Normal(s_in(cfg.q_dim()))),
        ));
        if cfg.attention_bias {
            let b = |s: &str| format!("model.layers.{l}.self_attn.{s}.bias");
            out.push((b("q_proj"), (vec![cfg.q_dim()], Init::Normal(0.5))));
            out.push((b("k_proj"), (vec![cfg.kv_dim()], Init::Normal(0.5))));
            out.push((b("v_proj"), (vec![cfg.kv_dim()], Init::Normal(0.5))));
        }
        if cfg.qk_norm {
            out.push((p("self_attn.q_norm"), (vec![cfg.head_dim], Init::Norm)));
            out.push((p("self_attn.k_norm"), (vec![cfg.head_dim], Init::Norm)));
        }
        if cfg.post_norms {
            // Gemma's sandwich: the attention's output norm, then the MLP's input and output.
            out.push((p("post_attention_layernorm"), (vec![h], Init::Norm)));
            out.push((p("pre_feedforward_layernorm"), (vec![h], Init::Norm)));
            out.push((p("post_feedforward_layernorm"), (vec![h], Init::Norm)));
        } else {
            out.push((p("post_attention_layernorm"), (vec![h], Init::Norm)));
        }
        match &cfg.moe {
            None => {
                out.push((p("mlp.gate_proj"), (vec![i, h], Init::Normal(s_in(h)))));
                out.push((p("mlp.up_proj"), (vec![i, h], Init::Normal(s_in(h)))));
                out.push((p("mlp.down_proj"), (vec![h, i], Init::Normal(s_in(i)))));
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
                    (vec![m.num_experts, h], Init::Normal(s_in(h))),
                ));
                for e in 0..m.num_experts {
                    let x = |w: &str| p(&format!("{block}.experts.{e}.{w}"));
                    out.push((x(gate), (vec![ei, h], Init::Normal(s_in(h)))));
                    out.push((x(up), (vec![ei, h], Init::Normal(s_in(h)))));
                    out.push((x(down), (vec![h, ei], Init::Normal(s_in(ei)))));
                }
            }
        }
    }
    out.push(("model.norm.weight".into(), (vec![h], Init::Norm)));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".into(), (vec![v, h], Init::Normal(s_in(h)))));
    }
    out
}

/// Deterministic random weights for `cfg`, in HF's (unfused) order of tensors.
pub fn random_hf_tensors(cfg: &ModelConfig, seed: u64) -> Vec<(String, HostTensor)> {
    let mut rng = Rng::new(seed);
    hf_tensor_specs(cfg)
        .into_iter()
        .map(|(name, (shape, init))| {
            let t = match init {
                Init::Normal(std) => normal(&mut rng, shape, std),
                Init::Norm => family_norm(&mut rng, shape[0], cfg),
            };
            (name, t)
        })
        .collect()
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
    write_config(dir, cfg)?;
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

fn write_config(dir: &Path, cfg: &ModelConfig) -> Result<(), LoadError> {
    std::fs::create_dir_all(dir).map_err(|e| LoadError::io(dir, e))?;
    let cfg_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&cfg.to_hf_json()).expect("json");
    std::fs::write(&cfg_path, text + "\n").map_err(|e| LoadError::io(&cfg_path, e))
}

/// Writes `config.json` + `model.safetensors` in bf16, as real checkpoints are stored, for a
/// random model of any size: each tensor drawn in chunks on every core (each chunk its own
/// seed, so other values than [`save_random_hf_dir`]'s) and streamed to the file, one tensor
/// in memory at a time.
pub fn save_random_hf_dir_bf16(dir: &Path, cfg: &ModelConfig, seed: u64) -> Result<(), LoadError> {
    use rayon::prelude::*;
    use std::io::Write;
    write_config(dir, cfg)?;
    let specs = hf_tensor_specs(cfg);
    // safetensors: an 8-byte header length, the JSON header (padded to 8 bytes), the data.
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut at = 0usize;
    for (name, (shape, _)) in &specs {
        let bytes = shape.iter().product::<usize>() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + bytes]}),
        );
        at += bytes;
    }
    let mut json = serde_json::to_vec(&header).expect("json");
    json.resize(json.len().next_multiple_of(8), b' ');
    let path = dir.join("model.safetensors");
    let io = |e| LoadError::io(&path, e);
    let mut f =
        std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(&path).map_err(io)?);
    f.write_all(&(json.len() as u64).to_le_bytes())
        .map_err(io)?;
    f.write_all(&json).map_err(io)?;
    const CHUNK: usize = 1 << 20;
    for (k, (_, (shape, init))) in specs.iter().enumerate() {
        let n: usize = shape.iter().product();
        let mut data = vec![0u8; n * 2];
        data.par_chunks_mut(CHUNK * 2)
            .enumerate()
            .for_each(|(c, out)| {
                let mut rng = Rng::new(seed ^ ((k as u64) << 32) ^ c as u64);
                let gemma = cfg.arch == crate::config::Arch::Gemma3;
                for o in out.chunks_exact_mut(2) {
                    let x = match init {
                        Init::Normal(std) => rng.normal() * std,
                        Init::Norm => 0.2 * (rng.uniform() - 0.5) + if gemma { 0.0 } else { 1.0 },
                    };
                    o.copy_from_slice(&half::bf16::from_f64(x).to_le_bytes());
                }
            });
        f.write_all(&data).map_err(io)?;
    }
    f.flush().map_err(io)
}
