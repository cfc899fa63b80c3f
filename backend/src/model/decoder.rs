//! The decoder forward pass of every supported family ([`crate::config::Arch`]), written once
//! against [`Device`]: RMSNorm, RoPE, grouped-query attention over the paged KV cache, SwiGLU MLP,
//! (tied) LM head — plus what a family adds to its layers (Qwen2's q/k/v biases, Qwen3's and
//! Gemma's per-head q/k norm, Gemma's output norms, GeGLU, scaled embeddings, and sliding-window
//! layers with their own RoPE base), each present or absent in a layer's weights and config.

use std::borrow::Cow;
use std::ops::Range;

use super::rope;
use crate::config::{ModelConfig, RopeScaling};
use crate::device::{
    AttnLayer, AttnParams, Delta, Device, ForwardBatch, GraphReport, GraphShapes, HeadNorm,
    Instruments, MoeParams, MoeWeights, Part, WeightQuantization,
};
use crate::error::{DeviceError, EngineError};
use crate::loader::{HostLayer, HostTensor, HostWeights, WeightReader};
use crate::shard::{Shard, ShardPlan};

/// A model's tensors on a device: embedding, layers, final norm, LM head (none: tied).
type DeviceTensors<D> = (
    <D as Device>::Tensor,
    Vec<Layer<<D as Device>::Tensor>>,
    <D as Device>::Tensor,
    Option<<D as Device>::Tensor>,
);

struct Layer<T> {
    attn_norm: T,
    qkv: T,
    qkv_bias: Option<T>,
    /// (q, k) head-norm weights.
    qk_norm: Option<(T, T)>,
    o_proj: T,
    mlp_norm: T,
    /// A dense MLP's gate|up and down, or every expert's stacked ([`crate::loader::HostLayer`]).
    gate_up: T,
    down: T,
    /// A mixture of experts' router.
    router: Option<T>,
    /// Norms of the attention's and the MLP's outputs (Gemma).
    post_norms: Option<(T, T)>,
}

/// Every layer's attention: its window, and the score scale of the family.
fn attn_params_all(config: &ModelConfig) -> Vec<AttnParams> {
    (0..config.num_hidden_layers)
        .map(|l| attn_params(config, l))
        .collect()
}

/// Layer `l`'s attention: its window, and the score scale of the family.
fn attn_params(config: &ModelConfig, l: usize) -> AttnParams {
    AttnParams {
        num_heads: config.num_attention_heads,
        num_kv_heads: config.num_key_value_heads,
        head_dim: config.head_dim,
        scale: config
            .attention_scale
            .map_or(1.0 / (config.head_dim as f32).sqrt(), |s| s as f32),
        window: config.layer_window(l),
    }
}

/// The config of a sliding layer's RoPE where its base differs (Gemma 3: unscaled, its own
/// base); `None`: every layer uses the global table.
fn local_rope_config(config: &ModelConfig) -> Option<ModelConfig> {
    config.rope_local_theta.map(|theta| ModelConfig {
        rope_theta: theta,
        rope_scaling: RopeScaling::Default,
        ..config.clone()
    })
}

/// RoPE tables on `dev`: the global one, and the sliding layers' where it differs.
fn rope_tables<D: Device>(
    dev: &D,
    config: &ModelConfig,
    max_positions: usize,
) -> Result<(D::Tensor, Option<D::Tensor>), EngineError> {
    let global = dev.upload_table(&rope::table(config, max_positions))?;
    let local = local_rope_config(config)
        .map(|c| dev.upload_table(&rope::table(&c, max_positions)))
        .transpose()?;
    Ok((global, local))
}

/// Model weights resident on a device.
pub struct Decoder<D: Device> {
    pub config: ModelConfig,
    embed: D::Tensor,
    layers: Vec<Layer<D::Tensor>>,
    final_norm: D::Tensor,
    lm_head: Option<D::Tensor>,
    rope: D::Tensor,
    /// The sliding layers' RoPE table, where their base differs.
    rope_local: Option<D::Tensor>,
    /// Per layer.
    attn: Vec<AttnParams>,
    max_positions: usize,
}

/// Logits of the batch's `logit_rows`: `rows × vocab`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.vocab..(r + 1) * self.vocab]
    }
}

/// What loading a model's weights from its files took: their bytes at bf16 (two a weight,
/// whatever the file stores) and the seconds from the first read to the last upload's end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WeightsLoad {
    pub bytes: u64,
    pub secs: f64,
}

/// `w` as [`WeightQuantization`] stores projections.
fn quantized<D: Device>(
    dev: &D,
    w: D::Tensor,
    quantization: WeightQuantization,
) -> Result<D::Tensor, DeviceError> {
    match quantization {
        WeightQuantization::None => Ok(w),
        WeightQuantization::Fp8 => dev.quantize_fp8(w),
    }
}

/// A host tensor on the device (an owned one's host memory goes as it is uploaded).
fn upload<D: Device>(dev: &D, t: Cow<'_, HostTensor>) -> Result<D::Tensor, DeviceError> {
    match t {
        Cow::Borrowed(t) => dev.upload(t),
        Cow::Owned(t) => dev.upload_owned(t),
    }
}

/// One layer's weights on the device, each projection quantized as it arrives (one unquantized
/// tensor on the device at a time).
fn upload_layer<D: Device>(
    dev: &D,
    l: HostLayer<Cow<'_, HostTensor>>,
    quantization: WeightQuantization,
) -> Result<Layer<D::Tensor>, EngineError> {
    let up = |t| upload(dev, t);
    let proj = |t| quantized(dev, upload(dev, t)?, quantization);
    Ok(Layer {
        attn_norm: up(l.attn_norm)?,
        qkv: proj(l.qkv)?,
        qkv_bias: l.qkv_bias.map(up).transpose()?,
        qk_norm: match (l.q_norm, l.k_norm) {
            (Some(q), Some(k)) => Some((up(q)?, up(k)?)),
            _ => None,
        },
        post_norms: match (l.post_attn_norm, l.post_mlp_norm) {
            (Some(a), Some(m)) => Some((up(a)?, up(m)?)),
            _ => None,
        },
        o_proj: proj(l.o_proj)?,
        mlp_norm: up(l.mlp_norm)?,
        gate_up: proj(l.gate_up)?,
        down: proj(l.down)?,
        router: l.router.map(up).transpose()?,
    })
}

impl<D: Instruments> Decoder<D> {
    /// Uploads `weights` — each owned tensor handed to the device as it goes, so the host holds
    /// at most one copy of the model; positions up to `max_positions` get RoPE tables.
    pub fn new(
        dev: &D,
        config: &ModelConfig,
        weights: HostWeights<Cow<'_, HostTensor>>,
        max_positions: usize,
        quantization: WeightQuantization,
    ) -> Result<Self, EngineError> {
        let layers = weights
            .layers
            .into_iter()
            .map(|l| upload_layer(dev, l, quantization))
            .collect::<Result<Vec<_>, EngineError>>()?;
        let embed = upload(dev, weights.embed)?;
        let final_norm = upload(dev, weights.final_norm)?;
        let lm_head = weights.lm_head.map(|t| upload(dev, t)).transpose()?;
        let tensors = (embed, layers, final_norm, lm_head);
        Self::with_tensors(dev, config, tensors, max_positions)
    }

    /// The model of `config` from its tensors on the device (embedding, layers, final norm, LM
    /// head), with RoPE tables for positions up to `max_positions`.
    fn with_tensors(
        dev: &D,
        config: &ModelConfig,
        (embed, layers, final_norm, lm_head): DeviceTensors<D>,
        max_positions: usize,
    ) -> Result<Self, EngineError> {
        let (rope, rope_local) = rope_tables(dev, config, max_positions)?;
        let attn = attn_params_all(config);
        Ok(Decoder {
            config: config.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
            rope_local,
            attn,
            max_positions,
        })
    }

    /// Reads the weights from `reader` and uploads each tensor as it is read: the next layers
    /// are read (and converted, on rayon's threads) while one is uploaded, so the host holds at
    /// most three layers at a time (a tensor-parallel rank: its slices of them); `config` is the
    /// model's on this device (a rank's share). Says how long it took.
    pub fn from_reader(
        dev: &D,
        config: &ModelConfig,
        reader: &WeightReader,
        max_positions: usize,
        quantization: WeightQuantization,
        progress: bool,
    ) -> Result<(Self, WeightsLoad), EngineError> {
        let t0 = std::time::Instant::now();
        let n = config.num_hidden_layers;
        let bar = crate::loader::progress_bar(progress, n as u64 + 2, "loading weights");
        let mut elements = 0u64;
        let mut count = |t: &HostTensor| {
            elements += t.data.len() as u64;
        };
        let (embed, layers) = std::thread::scope(|s| -> Result<_, EngineError> {
            // The reader runs ahead: a layer queued while the one before it is uploaded.
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            s.spawn(move || {
                for l in 0..n {
                    let layer = reader.layer(l);
                    let failed = layer.is_err();
                    if tx.send(layer).is_err() || failed {
                        return;
                    }
                }
            });
            let e = reader.embed()?;
            count(&e);
            let embed = dev.upload_owned(e)?;
            bar.inc(1);
            let mut layers = Vec::with_capacity(n);
            for layer in rx.iter().take(n) {
                let layer = layer?.map(&mut |t: HostTensor| {
                    count(&t);
                    Cow::Owned(t)
                });
                layers.push(upload_layer(dev, layer, quantization)?);
                bar.inc(1);
            }
            Ok((embed, layers))
        })?;
        let f = reader.final_norm()?;
        count(&f);
        let final_norm = dev.upload_owned(f)?;
        let lm_head = match reader.lm_head()? {
            Some(t) => {
                count(&t);
                Some(dev.upload_owned(t)?)
            }
            None => None,
        };
        dev.synchronize()?;
        bar.inc(1);
        bar.finish_and_clear();
        let load = WeightsLoad {
            bytes: elements * 2,
            secs: t0.elapsed().as_secs_f64(),
        };
        tracing::info!(
            device = dev.name(),
            gib = format!("{:.2}", load.bytes as f64 / (1u64 << 30) as f64),
            secs = format!("{:.2}", load.secs),
            gib_per_s = format!("{:.2}", load.bytes as f64 / (1u64 << 30) as f64 / load.secs),
            "weights loaded (bf16 bytes)"
        );
        let model = Self::with_tensors(
            dev,
            config,
            (embed, layers, final_norm, lm_head),
            max_positions,
        )?;
        Ok((model, load))
    }

    /// Random weights made on the device (`--load-format dummy`): real shapes for performance
    /// work, nothing materialised on the host. With `shard`, `config` is a tensor-parallel
    /// rank's and each weight is the rank's part of the unsplit model's (the same values, so
    /// the ranks together compute what one device does with `Decoder::random` of the whole).
    pub fn random(
        dev: &D,
        config: &ModelConfig,
        seed: u64,
        max_positions: usize,
        quantization: WeightQuantization,
        shard: Option<&Shard<'_>>,
    ) -> Result<Self, EngineError> {
        let full = shard.map_or(config, |s| s.full);
        let (h, v) = (full.hidden_size, full.vocab_size);
        // A dense MLP is one expert of the model's width.
        let (experts, i) = match &full.moe {
            Some(m) => (m.num_experts, m.expert_intermediate_size),
            None => (1, full.intermediate_size),
        };
        // The k-th weight drawn has its own seed (the same k on every rank).
        let mut k = 0u64;
        let mut draw = |shape: &[usize], part: Option<Part<'_>>, mean: f32, std: f32| {
            k += 1;
            let seed = seed.wrapping_mul(1_000_003).wrapping_add(k);
            match part {
                Some(p) => dev.random_part(shape, &p, seed, mean, std),
                None => dev.random(shape, seed, mean, std),
            }
        };
        // The rank's rows / columns of a projection (the whole where there is no shard).
        let rows = |r: fn(&ShardPlan) -> &[Range<usize>], cols: usize| {
            shard.map(|s| Part {
                rows: r(&s.plan),
                cols: 0..cols,
            })
        };
        let (all, down_rows) = (0..h, 0..experts * h);
        let cols = |c: fn(&ShardPlan) -> Range<usize>| {
            shard.map(|s| Part {
                rows: std::slice::from_ref(&all),
                cols: c(&s.plan),
            })
        };
        let s = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        let (qkv_dim, q_dim) = (full.qkv_dim(), full.q_dim());
        let mut layers = Vec::with_capacity(full.num_hidden_layers);
        for _ in 0..full.num_hidden_layers {
            layers.push(Layer {
                attn_norm: draw(&[h], None, 1.0, 0.05)?,
                qkv: quantized(
                    dev,
                    draw(&[qkv_dim, h], rows(|p| &p.qkv_rows, h), 0.0, s(h))?,
                    quantization,
                )?,
                qkv_bias: if full.attention_bias {
                    Some(draw(&[qkv_dim], rows(|p| &p.qkv_rows, 1), 0.0, 0.5)?)
                } else {
                    None
                },
                qk_norm: if full.qk_norm {
                    Some((
                        draw(&[full.head_dim], None, 1.0, 0.05)?,
                        draw(&[full.head_dim], None, 1.0, 0.05)?,
                    ))
                } else {
                    None
                },
                post_norms: if full.post_norms {
                    Some((draw(&[h], None, 1.0, 0.05)?, draw(&[h], None, 1.0, 0.05)?))
                } else {
                    None
                },
                o_proj: quantized(
                    dev,
                    draw(&[h, q_dim], cols(|p| p.q_rows.clone()), 0.0, s(q_dim))?,
                    quantization,
                )?,
                mlp_norm: draw(&[h], None, 1.0, 0.05)?,
                gate_up: quantized(
                    dev,
                    draw(
                        &[experts * 2 * i, h],
                        rows(|p| &p.gate_up_rows, h),
                        0.0,
                        s(h),
                    )?,
                    quantization,
                )?,
                down: quantized(
                    dev,
                    draw(
                        &[experts * h, i],
                        shard.map(|sh| Part {
                            rows: std::slice::from_ref(&down_rows),
                            cols: sh.plan.mlp.clone(),
                        }),
                        0.0,
                        s(i),
                    )?,
                    quantization,
                )?,
                router: match &full.moe {
                    Some(m) => Some(draw(&[m.num_experts, h], None, 0.0, s(h))?),
                    None => None,
                },
            });
        }
        // A rank's embedding rows and LM head rows are its block of the vocabulary (tied, the
        // one serves as the other).
        let vocab = || rows(|p| std::slice::from_ref(&p.vocab_rows), h);
        let embed = draw(&[v, h], vocab(), 0.0, 1.0)?;
        let final_norm = draw(&[h], None, 1.0, 0.05)?;
        let lm_head = match full.tie_word_embeddings {
            true => None,
            false => Some(draw(&[v, h], vocab(), 0.0, s(h))?),
        };
        Self::with_tensors(
            dev,
            config,
            (embed, layers, final_norm, lm_head),
            max_positions,
        )
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Lowers the longest sequence to `n` positions (where fewer fit in the KV cache than the
    /// tables were made for; the tables keep their rows past it).
    pub fn limit_positions(&mut self, n: usize) {
        self.max_positions = self.max_positions.min(n);
    }

    /// Runs one varlen batch: writes every new token's K/V into `kv` and returns the logits of
    /// the batch's `logit_rows`.
    pub fn forward(
        &self,
        dev: &D,
        kv: &mut D::Kv,
        batch: &ForwardBatch,
    ) -> Result<Logits, EngineError> {
        let logits = self.forward_logits(dev, kv, batch)?;
        Ok(Logits {
            rows: batch.logit_rows.len(),
            vocab: self.config.vocab_size,
            data: dev.to_host(&logits)?,
        })
    }

    /// Like [`Decoder::forward`], leaving the logits (`[logit_rows, vocab]`) on the device.
    pub fn forward_logits(
        &self,
        dev: &D,
        kv: &mut D::Kv,
        batch: &ForwardBatch,
    ) -> Result<D::Tensor, EngineError> {
        if let Some(t) = dev.forward_graphed(kv, batch, &mut |kv, b| self.forward_on(dev, kv, b))? {
            return Ok(t);
        }
        let b = dev.prepare_batch(batch)?;
        self.forward_on(dev, kv, &b)
    }

    /// Captures the device's decode graphs (where it has them) for the steps `shapes` names.
    pub fn capture_decode_graphs(
        &self,
        dev: &D,
        kv: &mut D::Kv,
        shapes: &GraphShapes,
    ) -> Result<Option<GraphReport>, EngineError> {
        dev.capture_decode_graphs(
            kv,
            shapes,
            self.max_positions,
            self.config.vocab_size,
            &mut |kv, b| self.forward_on(dev, kv, b),
        )
    }

    /// The forward pass on a batch already on the device.
    fn forward_on(&self, dev: &D, kv: &mut D::Kv, b: &D::Batch) -> Result<D::Tensor, EngineError> {
        let eps = self.config.rms_norm_eps as f32;
        let scale = if self.config.embed_scale {
            (self.config.hidden_size as f32).sqrt()
        } else {
            1.0
        };
        let mut residual = dev.embed(&self.embed, b, scale)?;
        // Each sub-layer's output is added into the residual stream by the next one's
        // normalisation (fused with its projection where the device can), after the output
        // norm of models that have one (Gemma's post-norms, fused into the same pass).
        let mut pending: Option<(D::Tensor, Option<&D::Tensor>)> = None;
        for (l, layer) in self.layers.iter().enumerate() {
            let mut qkv = dev.norm_linear(
                &mut residual,
                as_delta(&pending),
                &layer.attn_norm,
                eps,
                &layer.qkv,
            )?;
            if let Some(bias) = &layer.qkv_bias {
                dev.add_bias(&mut qkv, bias)?;
            }
            let p = &self.attn[l];
            let qk_norm = layer.qk_norm.as_ref().map(|(q, k)| HeadNorm { q, k, eps });
            let rope = match (&self.rope_local, p.window) {
                (Some(local), Some(_)) => local,
                _ => &self.rope,
            };
            let at = AttnLayer {
                qk_norm,
                rope,
                layer: l,
                p,
            };
            let attn = dev.attention(&mut qkv, kv, b, at)?;
            // Row-parallel under tensor parallelism: each rank's product is a partial sum.
            let mut o = dev.linear_delta(&attn, &layer.o_proj)?;
            dev.all_reduce_sum(&mut o)?;
            let (post_attn, post_mlp) = match &layer.post_norms {
                Some((a, m)) => (Some(a), Some(m)),
                None => (None, None),
            };
            let delta = Some(Delta {
                x: &o,
                norm: post_attn,
            });
            let mut down = match (&layer.router, &self.config.moe) {
                (Some(router), Some(m)) => {
                    let p = MoeParams {
                        num_experts: m.num_experts,
                        top_k: m.top_k,
                        // Under tensor parallelism a rank's config has its share of each
                        // expert's columns.
                        inter: m.expert_intermediate_size,
                        norm_topk_prob: m.norm_topk_prob,
                        act: self.config.hidden_act,
                    };
                    let w = MoeWeights {
                        router,
                        gate_up: &layer.gate_up,
                        down: &layer.down,
                    };
                    dev.norm_moe(&mut residual, delta, &layer.mlp_norm, eps, w, &p)?
                }
                _ => {
                    let act = dev.norm_glu(
                        &mut residual,
                        delta,
                        &layer.mlp_norm,
                        eps,
                        &layer.gate_up,
                        self.config.hidden_act,
                    )?;
                    dev.linear_delta(&act, &layer.down)?
                }
            };
            dev.all_reduce_sum(&mut down)?;
            pending = Some((down, post_mlp));
        }
        let x = dev.norm(&mut residual, as_delta(&pending), &self.final_norm, eps)?;
        let rows = dev.gather_logit_rows(&x, b)?;
        let logits = dev.lm_head(&rows, self.lm_head.as_ref().unwrap_or(&self.embed))?;
        // A vocabulary-parallel LM head gives each rank its columns of the logits.
        Ok(dev.all_gather_cols(logits)?)
    }
}

/// The pending sub-layer output (and its output norm) as the next add + norm's delta.
fn as_delta<'a, T>(pending: &'a Option<(T, Option<&'a T>)>) -> Option<Delta<'a, T>> {
    pending.as_ref().map(|(x, norm)| Delta { x, norm: *norm })
}
