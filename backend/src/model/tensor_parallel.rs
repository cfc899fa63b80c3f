//! Tensor parallelism (`--tensor-parallel-size N`): one model split over N ranks as Megatron-LM
//! splits it. A rank is a model with `heads / N` attention heads, `kv_heads / N` KV heads (each
//! rank keeps the one it needs where there are fewer KV heads than ranks) and an MLP `N` times
//! narrower — so the decoder runs on a rank unchanged — plus the collectives its device provides:
//!
//! - q|k|v and gate|up are split by output rows (column-parallel): a rank computes its heads and
//!   its share of the MLP's hidden units with no communication;
//! - o_proj and down are split by input columns (row-parallel): each rank's product is a partial
//!   sum, added over the ranks by one all-reduce before it enters the residual stream;
//! - the embedding table and the LM head are split by vocabulary rows: a rank looks up the ids
//!   it holds (zeros for the others) and the ranks' rows are summed; the logits' column blocks
//!   are gathered in rank order.
//!
//! The scheduler and the KV manager stay single: every rank runs the same batch over the same
//! block tables, each holding its own heads' K and V.
//!
//! [`TpRunner`] drives N [`ModelRunner`]s, rank 0 on the caller's thread and the others on one
//! thread each (on CUDA, one GPU and its context each: rank r on GPU r). On the CPU device the
//! collectives go through [`CpuComm`] (shared memory); on CUDA through NCCL
//! ([`crate::device::cuda::nccl`]), enqueued on each rank's stream and captured into its decode
//! graphs. Every rank begins every step (rank 0 validates the batch first, so a refused batch
//! reaches none); rank 0 alone edits, masks and samples the gathered logits.
//!
//! Weights: a loaded model is cut per rank ([`shard_weights`]); `--load-format dummy` makes each
//! rank's part on its device ([`ShardPlan`], [`Shard`]), with the values the unsplit dummy model
//! has there, so TP=N and TP=1 can be compared on the same weights.

use std::ops::Range;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::config::ModelConfig;
use crate::device::cpu::{CpuComm, CpuDevice};
use crate::device::cuda::nccl::{NcclGroup, NcclRank};
use crate::device::cuda::{CudaDevice, CudaOptions};
use crate::device::{ForwardBatch, GraphReport, Instruments, KvLayout, Part, StepPlan};
use crate::error::EngineError;
use crate::loader::{HostLayer, HostWeights};
use crate::shard::{check, rank_config, vocab_widths, Shard, ShardPlan};
use crate::tensor::HostTensor;

use super::decoder::Logits;
use super::runner::{ModelRunner, Runner, RunnerOptions, StepOutput, WeightSource};

/// The rows `ranges` of a `[rows, cols]` (or 1-D) tensor, in order.
fn take_rows(t: &HostTensor, ranges: &[Range<usize>]) -> HostTensor {
    let cols = if t.shape.len() == 2 { t.shape[1] } else { 0 };
    Part {
        rows: ranges,
        cols: 0..cols.max(1),
    }
    .cut(t)
}

/// The columns `range` of a `[rows, cols]` tensor.
fn take_cols(t: &HostTensor, range: Range<usize>) -> HostTensor {
    Part {
        rows: std::slice::from_ref(&(0..t.shape[0])),
        cols: range,
    }
    .cut(t)
}

/// Rank `r`'s slices of `w` (the unsplit model of `config`) over `n` ranks.
pub fn shard_weights(
    w: &HostWeights<&HostTensor>,
    config: &ModelConfig,
    r: usize,
    n: usize,
) -> HostWeights {
    let plan = ShardPlan::new(config, r, n);
    let layers = w
        .layers
        .iter()
        .map(|l| HostLayer {
            attn_norm: l.attn_norm.clone(),
            qkv: take_rows(l.qkv, &plan.qkv_rows),
            qkv_bias: l.qkv_bias.map(|b| take_rows(b, &plan.qkv_rows)),
            q_norm: l.q_norm.cloned(),
            k_norm: l.k_norm.cloned(),
            post_attn_norm: l.post_attn_norm.cloned(),
            post_mlp_norm: l.post_mlp_norm.cloned(),
            o_proj: take_cols(l.o_proj, plan.q_rows.clone()),
            mlp_norm: l.mlp_norm.clone(),
            gate_up: take_rows(l.gate_up, &plan.gate_up_rows),
            down: take_cols(l.down, plan.mlp.clone()),
            router: l.router.cloned(),
        })
        .collect();
    // A rank's embedding rows and LM head rows are its block of the vocabulary (tied, the one
    // serves as the other).
    let vocab = std::slice::from_ref(&plan.vocab_rows);
    HostWeights {
        embed: take_rows(w.embed, vocab),
        layers,
        final_norm: w.final_norm.clone(),
        lm_head: w.lm_head.map(|t| take_rows(t, vocab)),
    }
}

/// What rank 0 asks the other ranks to run.
enum Command {
    /// A step's forward pass begun (each rank keeps its logits; rank 0's are the ones used).
    Begin(Box<ForwardBatch>),
    /// Decode graphs on or off, as on rank 0 (every rank replays or runs eagerly alike).
    SetGraphs(bool),
    /// The all-reduces rank 0 times (elements, count): every rank runs them.
    TimeAllReduce(usize, usize),
}

/// What a rank answers: the command's result (for `SetGraphs`, whether it has graphs).
type Answer = Result<bool, EngineError>;

struct Rank {
    commands: mpsc::Sender<Command>,
    done: mpsc::Receiver<Answer>,
    thread: JoinHandle<()>,
}

/// A group's collectives, as the runner ends them when a rank fails.
#[derive(Clone)]
enum Group {
    Cpu(Arc<CpuComm>),
    Cuda(Arc<NcclGroup>),
}

impl Group {
    /// Ends the collectives in flight with an error on every rank.
    fn abort(&self) {
        match self {
            Group::Cpu(c) => c.abort(),
            Group::Cuda(g) => g.abort(),
        }
    }

    /// After a failed step every rank has returned from: the CPU group is usable again; an
    /// aborted NCCL group is not (its steps fail, saying so, until the worker restarts).
    fn recover(&self) {
        if let Group::Cpu(c) = self {
            c.reset();
        }
    }
}

/// A model over N ranks behind the [`Runner`] interface: rank 0 answers, the others follow on
/// one thread each.
pub struct TpRunner<D: Instruments> {
    /// The whole model's config (each rank's has its share of the heads and the MLP).
    config: ModelConfig,
    rank0: ModelRunner<D>,
    others: Vec<Rank>,
    group: Group,
}

/// Where rank `r` of `n` gets its weights from `weights` (the whole model of `config`).
fn rank_source<'a>(
    weights: &'a WeightSource<'a>,
    config: &'a ModelConfig,
    r: usize,
    n: usize,
) -> Result<WeightSource<'a>, EngineError> {
    Ok(match weights {
        WeightSource::Host(w) => WeightSource::Owned(shard_weights(&w.as_refs(), config, r, n)),
        WeightSource::Owned(w) => WeightSource::Owned(shard_weights(&w.as_refs(), config, r, n)),
        // Each rank reads its slices and uploads them as they come.
        WeightSource::Files(spec) => WeightSource::FilesShard {
            spec,
            rank: r,
            ranks: n,
        },
        WeightSource::Dummy { seed } => WeightSource::DummyShard {
            seed: *seed,
            shard: Shard {
                full: config,
                plan: ShardPlan::new(config, r, n),
            },
        },
        WeightSource::DummyShard { .. } | WeightSource::FilesShard { .. } => {
            return Err(EngineError::InvalidRequest(
                "a rank's shard cannot be split again".into(),
            ))
        }
    })
}

impl TpRunner<CpuDevice> {
    /// `config`'s model from `weights` over `opts.tensor_parallel_size` CPU ranks, whose
    /// collectives go through shared memory.
    pub fn new(
        config: &ModelConfig,
        weights: WeightSource<'_>,
        opts: &RunnerOptions,
    ) -> Result<Self, EngineError> {
        let n = opts.tensor_parallel_size;
        check(config, n).map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let comm = CpuComm::new(n);
        let widths = vocab_widths(config.vocab_size, n);
        let devices = (0..n)
            .map(|r| CpuDevice::rank(comm.clone(), r, widths.clone()))
            .collect();
        let runner = Self::start(config, &weights, opts, devices, Group::Cpu(comm))?;
        tracing::info!(ranks = n, "tensor parallel: one model over {n} CPU ranks");
        Ok(runner)
    }
}

impl TpRunner<CudaDevice> {
    /// `config`'s model from `weights` over `opts.tensor_parallel_size` GPUs (rank r on GPU r),
    /// whose collectives go through NCCL.
    pub fn cuda(
        config: &ModelConfig,
        weights: WeightSource<'_>,
        opts: &RunnerOptions,
        cuda: &CudaOptions,
    ) -> Result<Self, EngineError> {
        let n = opts.tensor_parallel_size;
        check(config, n).map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let visible = crate::device::cuda::gpu_count()?;
        if visible < n {
            return Err(EngineError::InvalidRequest(format!(
                "--tensor-parallel-size {n} needs {n} GPUs and {visible} are visible                  (CUDA_VISIBLE_DEVICES picks which)"
            )));
        }
        let mut devices = (0..n)
            .map(|r| CudaDevice::new(r, opts.block_size, cuda.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let ordinals: Vec<usize> = (0..n).collect();
        let group = NcclGroup::new(&ordinals, cuda.nccl_library.as_deref())?;
        // NCCL's set-up switches this thread between the GPUs; rank 0 is built on it.
        devices[0].bind_to_thread()?;
        let gather_widths = vocab_widths(config.vocab_size, n);
        for (rank, d) in devices.iter_mut().enumerate() {
            d.join(NcclRank {
                group: group.clone(),
                rank,
                gather_widths: gather_widths.clone(),
            });
        }
        let version = group.version;
        let runner = Self::start(config, &weights, opts, devices, Group::Cuda(group))?;
        tracing::info!(
            ranks = n,
            nccl = version,
            "tensor parallel: one model over {n} GPUs"
        );
        Ok(runner)
    }
}

impl<D: Instruments + 'static> TpRunner<D> {
    /// Builds rank r's model on `devices[r]`, all at once (loading a model runs collectives —
    /// an INT8 cache's calibration pass, the CUDA graphs' capture — which need every rank in
    /// them), then starts the other ranks' threads. A rank that fails aborts the group, so the
    /// others leave their collectives with an error instead of waiting.
    fn start(
        config: &ModelConfig,
        weights: &WeightSource<'_>,
        opts: &RunnerOptions,
        devices: Vec<D>,
        group: Group,
    ) -> Result<Self, EngineError> {
        let n = devices.len();
        let local = rank_config(config, n);
        let build = |r: usize, dev: D| -> Result<ModelRunner<D>, EngineError> {
            let runner = rank_source(weights, config, r, n)
                .and_then(|source| ModelRunner::new(dev, &local, source, opts));
            if runner.is_err() {
                group.abort();
            }
            runner
        };
        let built: Vec<Result<ModelRunner<D>, EngineError>> = std::thread::scope(|s| {
            let build = &build;
            let mut devices = devices.into_iter();
            let dev0 = devices.next().expect("one rank at least");
            let handles: Vec<_> = devices
                .enumerate()
                .map(|(i, dev)| s.spawn(move || build(i + 1, dev)))
                .collect();
            let rank0 = build(0, dev0);
            std::iter::once(rank0)
                .chain(handles.into_iter().map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(EngineError::InvalidRequest(
                            "a tensor-parallel rank panicked while loading".into(),
                        ))
                    })
                }))
                .collect()
        });
        let (mut runners, mut errors) = (Vec::with_capacity(n), Vec::new());
        for r in built {
            match r {
                Ok(runner) => runners.push(runner),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            // The failing rank's own reason, not the others' "another rank failed".
            let own = errors
                .iter()
                .position(|e| {
                    let e = e.to_string();
                    !e.contains("another rank failed") && !e.contains("was aborted")
                })
                .unwrap_or(0);
            return Err(errors.swap_remove(own));
        }
        let mut runners = runners.into_iter();
        let rank0 = runners.next().expect("rank 0");
        let mut others = Vec::with_capacity(n - 1);
        for (i, mut runner) in runners.enumerate() {
            let r = i + 1;
            let (tx, commands) = mpsc::channel::<Command>();
            let (done_tx, done) = mpsc::channel::<Answer>();
            let group = group.clone();
            let thread = std::thread::Builder::new()
                .name(format!("cachet-tp-rank-{r}"))
                .spawn(move || {
                    for c in commands {
                        let result = match c {
                            Command::Begin(b) => runner.forward_begin(&b).map(|()| true),
                            Command::SetGraphs(on) => Ok(runner.set_cuda_graphs(on)),
                            Command::TimeAllReduce(elems, count) => {
                                runner.time_all_reduce(elems, count).map(|t| t.is_some())
                            }
                        };
                        if result.is_err() {
                            group.abort();
                        }
                        if done_tx.send(result).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| EngineError::InvalidRequest(format!("starting rank {r}: {e}")))?;
            others.push(Rank {
                commands: tx,
                done,
                thread,
            });
        }
        Ok(TpRunner {
            config: config.clone(),
            rank0,
            others,
            group,
        })
    }

    /// Sends `c` (made per rank) to every other rank.
    fn broadcast(&self, c: impl Fn() -> Command) -> Result<(), EngineError> {
        for (i, r) in self.others.iter().enumerate() {
            r.commands.send(c()).map_err(|_| {
                EngineError::InvalidRequest(format!("tensor-parallel rank {} has stopped", i + 1))
            })?;
        }
        Ok(())
    }

    /// Waits for every other rank's answer: each one's, or the first error.
    fn gather(&self) -> Result<Vec<bool>, EngineError> {
        let mut answers = Vec::with_capacity(self.others.len());
        let mut first = None;
        for (i, r) in self.others.iter().enumerate() {
            match r.done.recv() {
                Ok(Ok(a)) => answers.push(a),
                Ok(Err(e)) => {
                    first.get_or_insert(e);
                }
                Err(_) => {
                    first.get_or_insert(EngineError::InvalidRequest(format!(
                        "tensor-parallel rank {} has stopped",
                        i + 1
                    )));
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(answers),
        }
    }

    /// Runs `f` on rank 0 while the other ranks begin `batch`'s forward pass. A batch the
    /// model refuses is refused before any rank sees it.
    fn with_ranks<T>(
        &mut self,
        batch: &ForwardBatch,
        f: impl FnOnce(&mut ModelRunner<D>) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        self.rank0.check(batch)?;
        self.broadcast(|| Command::Begin(Box::new(batch.clone())))?;
        let out = f(&mut self.rank0);
        if out.is_err() {
            // Ranks waiting in a collective for rank 0 get an error instead of waiting forever.
            self.group.abort();
        }
        let others = self.gather();
        if out.is_err() || others.is_err() {
            // Every rank is back: the next step starts clean where the group allows it.
            self.group.recover();
        }
        let out = out?;
        others?;
        Ok(out)
    }
}

impl<D: Instruments> Drop for TpRunner<D> {
    fn drop(&mut self) {
        for Rank {
            commands, thread, ..
        } in self.others.drain(..)
        {
            drop(commands); // the rank's loop ends
            let _ = thread.join();
        }
    }
}

impl<D: Instruments + 'static> Runner for TpRunner<D> {
    fn device_name(&self) -> &'static str {
        self.rank0.device_name()
    }
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn kv_layout(&self) -> KvLayout {
        self.rank0.kv_layout()
    }
    fn max_model_len(&self) -> usize {
        self.rank0.max_model_len()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, EngineError> {
        self.with_ranks(batch, |r| r.forward(batch))
    }
    fn forward_begin(&mut self, batch: &ForwardBatch) -> Result<(), EngineError> {
        self.with_ranks(batch, |r| r.forward_begin(batch))
    }
    fn forward_finish(&mut self, plan: &StepPlan) -> Result<StepOutput, EngineError> {
        // Every rank has the gathered logits; rank 0 edits, masks and samples them.
        self.rank0.forward_finish(plan)
    }
    fn synchronize(&self) -> Result<(), EngineError> {
        self.rank0.synchronize()
    }
    fn calibrate(&self) -> Result<Option<crate::device::Calibration>, EngineError> {
        self.rank0.calibrate()
    }
    fn time_gemms(
        &self,
        _shapes: &[(usize, usize, usize)],
        _repeat: usize,
    ) -> Result<Option<f64>, EngineError> {
        // The shapes a caller gives are the whole model's; each rank runs a slice of them.
        Ok(None)
    }
    fn samples_on_device(&self) -> bool {
        self.rank0.samples_on_device()
    }
    fn set_cuda_graphs(&mut self, on: bool) -> bool {
        let ours = self.rank0.set_cuda_graphs(on);
        let theirs = self
            .broadcast(|| Command::SetGraphs(on))
            .and_then(|()| self.gather());
        ours && theirs.is_ok_and(|t| t.iter().all(|&g| g))
    }
    fn cuda_graphs(&self) -> Option<GraphReport> {
        self.rank0.cuda_graphs()
    }
    fn time_all_reduce(&mut self, elems: usize, count: usize) -> Result<Option<f64>, EngineError> {
        self.broadcast(|| Command::TimeAllReduce(elems, count))?;
        let ours = self.rank0.time_all_reduce(elems, count);
        if ours.is_err() {
            self.group.abort();
        }
        let theirs = self.gather();
        if ours.is_err() || theirs.is_err() {
            self.group.recover();
        }
        theirs?;
        ours
    }
    fn set_profiling(&self, on: bool) {
        // Rank 0's operations are timed (its collectives include waiting for the others).
        self.rank0.set_profiling(on);
    }
    fn take_profile(&self) -> Result<Vec<(String, f64, usize)>, EngineError> {
        self.rank0.take_profile()
    }
}
