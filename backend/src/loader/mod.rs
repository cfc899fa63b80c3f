//! Finding and loading models: HF directories, GGUF files, and named models that
//! `cachet model fetch` puts in the local cache.
//!
//! Loading converts every weight to f32 host tensors once ([`HostWeights`]); a device then
//! uploads them in its own format (f32 on the CPU, bf16 on CUDA).

pub mod fetch;
pub mod gguf;
pub mod gguf_tokenizer;
pub mod hf;
pub mod random;

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::config::{Activation, Arch, ModelConfig, RopeScaling};
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
            "give an HF model directory, a .gguf file, or one of: {}",
            fetch::KNOWN
                .iter()
                .map(|k| k.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
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
trait TensorSource {
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
    layer: Box<dyn Fn(usize, Part) -> String>,
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

struct HfSource {
    dir: PathBuf,
    st: hf::SafetensorsDir,
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
fn hf_names(cfg: &ModelConfig) -> WeightNames {
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
fn hf_meta(dir: &Path) -> Result<ModelMeta, LoadError> {
    let config = ModelConfig::from_hf_json(&dir.join("config.json"))?;
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
    })
}

struct GgufSource {
    file: gguf::GgufFile,
    head_dim: usize,
    /// Whether the converter permuted q/k rows (Llama, Mistral).
    permuted_qk: bool,
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
    if let Some(n) = count("expert_shared_count") {
        return Err(LoadError::format(
            path,
            format!(
                "`{}` is {n}: shared experts are not supported",
                k("expert_shared_count")
            ),
        ));
    }
    let moe = match (family.is_moe(), count("expert_count")) {
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
    };
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
    })
}

/// What a model is without its weights: enough to tokenize and render prompts for it (a
/// gateway whose upstreams run the model loads only this).
#[derive(Clone)]
pub struct ModelMeta {
    pub name: String,
    pub source: PathBuf,
    pub config: ModelConfig,
    pub tokenizer: Option<TextTokenizer>,
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
