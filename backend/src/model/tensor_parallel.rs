//! Tensor parallelism (`--tensor-parallel-size N`): one model split over N ranks as Megatron-LM
//! splits it. A rank is a model with `heads / N` attention heads, `kv_heads / N` KV heads (each
//! rank keeps the one it needs where there are fewer KV heads than ranks) and an MLP `N` times
//! narrower — so the decoder runs on a rank unchanged — plus the collectives its device provides:
//!
//! - q|k|v and gate|up are split by output rows (column-parallel): a rank computes its heads and
//!   its share of the MLP's hidden units with no communication;
//! - o_proj and down are split by input columns (row-parallel): each rank's product is a partial
//!   sum, added over the ranks by one all-reduce before it enters the residual stream;
//! - the LM head is split by vocabulary rows; the logits' column blocks are gathered in rank
//!   order (the embedding table is kept whole on every rank).
//!
//! The scheduler and the KV manager stay single: every rank runs the same batch over the same
//! block tables, each holding its own heads' K and V.
//!
//! [`TpRunner`] drives N [`ModelRunner`]s, rank 0 on the caller's thread and the others on one
//! thread each. On the CPU device the collectives go through [`CpuComm`] (shared memory); the
//! CUDA ranks (NCCL) are not built yet and a CUDA model asks for one rank.

use std::ops::Range;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::config::ModelConfig;
use crate::device::cpu::{CpuComm, CpuDevice};
use crate::device::{ForwardBatch, GraphReport, KvLayout, StepPlan};
use crate::error::EngineError;
use crate::loader::{HostLayer, HostWeights};
use crate::tensor::HostTensor;

use super::decoder::Logits;
use super::runner::{ModelRunner, Runner, RunnerOptions, StepOutput, WeightSource};

/// Whether `config` splits over `n` ranks; what does not divide where it does not.
pub fn check(config: &ModelConfig, n: usize) -> Result<(), String> {
    let (h, kvh, i) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
    );
    if n == 0 {
        return Err("--tensor-parallel-size must be at least 1".into());
    }
    if !h.is_multiple_of(n) {
        return Err(format!(
            "--tensor-parallel-size {n} does not divide the model's {h} attention heads"
        ));
    }
    // A mixture of experts splits every expert's columns.
    let i = config.moe.map_or(i, |m| m.expert_intermediate_size);
    if !i.is_multiple_of(n) {
        return Err(format!(
            "--tensor-parallel-size {n} does not divide the MLP's {i} hidden units"
        ));
    }
    if !kvh.is_multiple_of(n) && !n.is_multiple_of(kvh) {
        return Err(format!(
            "--tensor-parallel-size {n} neither divides the model's {kvh} KV heads nor is a \
             multiple of them"
        ));
    }
    Ok(())
}

/// A rank's view of the model: its heads, KV heads and MLP width (the vocabulary stays whole:
/// the gathered logits have every column).
pub fn rank_config(config: &ModelConfig, n: usize) -> ModelConfig {
    let mut c = config.clone();
    c.num_attention_heads /= n;
    c.num_key_value_heads = (config.num_key_value_heads / n).max(1);
    c.intermediate_size /= n;
    if let Some(m) = &mut c.moe {
        m.expert_intermediate_size /= n;
    }
    c
}

/// `[start, end)` of rank `r`'s share of `len` items over `n` ranks: the first `len % n` ranks
/// take one more.
pub fn split(len: usize, r: usize, n: usize) -> Range<usize> {
    let (base, extra) = (len / n, len % n);
    let start = r * base + r.min(extra);
    start..start + base + usize::from(r < extra)
}

/// The KV heads rank `r` of `n` holds.
fn kv_heads(kvh: usize, r: usize, n: usize) -> Range<usize> {
    if kvh >= n {
        split(kvh, r, n)
    } else {
        // Fewer KV heads than ranks: each is kept by the n / kvh ranks whose query heads use it.
        let k = r / (n / kvh);
        k..k + 1
    }
}

/// The rows `ranges` of a `[rows, cols]` (or 1-D) tensor, in order.
fn take_rows(t: &HostTensor, ranges: &[Range<usize>]) -> HostTensor {
    let cols = if t.shape.len() == 2 { t.shape[1] } else { 1 };
    let mut data = Vec::new();
    for r in ranges {
        data.extend_from_slice(&t.data[r.start * cols..r.end * cols]);
    }
    let rows = ranges.iter().map(|r| r.len()).sum();
    let shape = if t.shape.len() == 2 {
        vec![rows, cols]
    } else {
        vec![rows]
    };
    HostTensor::new(shape, data)
}

/// The columns `range` of a `[rows, cols]` tensor.
fn take_cols(t: &HostTensor, range: Range<usize>) -> HostTensor {
    let cols = t.shape[1];
    let data = t
        .data
        .chunks(cols)
        .flat_map(|row| row[range.clone()].iter().copied())
        .collect();
    HostTensor::new(vec![t.shape[0], range.len()], data)
}

/// Rank `r`'s slices of `w` (the unsplit model of `config`) over `n` ranks.
pub fn shard_weights(
    w: &HostWeights<&HostTensor>,
    config: &ModelConfig,
    r: usize,
    n: usize,
) -> HostWeights {
    let d = config.head_dim;
    let (h, kvh, i) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
    );
    let q = split(h, r, n);
    let kv = kv_heads(kvh, r, n);
    let qkv_rows = [
        q.start * d..q.end * d,
        (h + kv.start) * d..(h + kv.end) * d,
        (h + kvh + kv.start) * d..(h + kvh + kv.end) * d,
    ];
    // Column-parallel gate|up rows and row-parallel down columns of each expert (the router
    // is whole on every rank: each routes its tokens the same way).
    let (experts, i) = match &config.moe {
        Some(m) => (m.num_experts, m.expert_intermediate_size),
        None => (1, i),
    };
    let mlp = split(i, r, n);
    let gate_up_rows: Vec<Range<usize>> = (0..experts)
        .flat_map(|x| {
            let base = x * 2 * i;
            [
                base + mlp.start..base + mlp.end,
                base + i + mlp.start..base + i + mlp.end,
            ]
        })
        .collect();
    let layers = w
        .layers
        .iter()
        .map(|l| HostLayer {
            attn_norm: l.attn_norm.clone(),
            qkv: take_rows(l.qkv, &qkv_rows),
            qkv_bias: l.qkv_bias.map(|b| take_rows(b, &qkv_rows)),
            q_norm: l.q_norm.cloned(),
            k_norm: l.k_norm.cloned(),
            post_attn_norm: l.post_attn_norm.cloned(),
            post_mlp_norm: l.post_mlp_norm.cloned(),
            o_proj: take_cols(l.o_proj, q.start * d..q.end * d),
            mlp_norm: l.mlp_norm.clone(),
            gate_up: take_rows(l.gate_up, &gate_up_rows),
            down: take_cols(l.down, mlp.clone()),
            router: l.router.cloned(),
        })
        .collect();
    let vocab = split(config.vocab_size, r, n);
    HostWeights {
        embed: w.embed.clone(),
        layers,
        final_norm: w.final_norm.clone(),
        // Tied or not, a rank's LM head is its rows of the vocabulary.
        lm_head: Some(take_rows(w.lm_head.unwrap_or(w.embed), &[vocab])),
    }
}

/// What rank 0 asks the other ranks to run.
enum Command {
    /// A forward pass over the batch (the ranks' logits are rank 0's to use).
    Forward(Box<ForwardBatch>),
    SetProfiling(bool),
}

struct Rank {
    commands: mpsc::Sender<Command>,
    done: mpsc::Receiver<Result<(), EngineError>>,
    thread: JoinHandle<()>,
}

/// A model over N CPU ranks behind the [`Runner`] interface: rank 0 answers, the others follow.
pub struct TpRunner {
    /// The whole model's config (each rank's has its share of the heads and the MLP).
    config: ModelConfig,
    rank0: ModelRunner<CpuDevice>,
    others: Vec<Rank>,
    comm: Arc<CpuComm>,
    /// The batch of a step begun and not finished (the other ranks run it at the finish).
    begun: Option<ForwardBatch>,
}

impl TpRunner {
    /// `config`'s model from `weights` over `opts.tensor_parallel_size` CPU ranks.
    pub fn new(
        config: &ModelConfig,
        weights: &HostWeights,
        opts: &RunnerOptions,
    ) -> Result<Self, EngineError> {
        let n = opts.tensor_parallel_size;
        check(config, n).map_err(EngineError::InvalidRequest)?;
        let comm = CpuComm::new(n);
        let local = rank_config(config, n);
        let refs = weights.as_refs();
        let build = |r: usize| -> Result<ModelRunner<CpuDevice>, EngineError> {
            let shard = shard_weights(&refs, config, r, n);
            ModelRunner::new(
                CpuDevice::rank(comm.clone(), r),
                &local,
                WeightSource::Owned(shard),
                opts,
            )
        };
        // Every rank is built at once: an INT8 cache's calibration is a forward pass, whose
        // collectives need every rank in them. A rank that fails aborts the group, so the others
        // leave their collectives with an error instead of waiting.
        let built: Vec<Result<ModelRunner<CpuDevice>, EngineError>> = std::thread::scope(|s| {
            let build = &build;
            let comm = &comm;
            let handles: Vec<_> = (1..n)
                .map(|r| {
                    s.spawn(move || {
                        let runner = build(r);
                        if runner.is_err() {
                            comm.abort();
                        }
                        runner
                    })
                })
                .collect();
            let rank0 = build(0);
            if rank0.is_err() {
                comm.abort();
            }
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
                .position(|e| !e.to_string().contains("another rank failed"))
                .unwrap_or(0);
            return Err(errors.swap_remove(own));
        }
        let mut runners = runners.into_iter();
        let rank0 = runners.next().expect("rank 0");
        let mut others = Vec::with_capacity(n - 1);
        for (i, mut runner) in runners.enumerate() {
            let r = i + 1;
            let (tx, commands) = mpsc::channel::<Command>();
            let (done_tx, done) = mpsc::channel();
            let comm = comm.clone();
            let thread = std::thread::Builder::new()
                .name(format!("cachet-tp-rank-{r}"))
                .spawn(move || {
                    for c in commands {
                        let result = match c {
                            Command::Forward(b) => runner.forward(&b).map(|_| ()),
                            Command::SetProfiling(on) => {
                                runner.set_profiling(on);
                                Ok(())
                            }
                        };
                        if result.is_err() {
                            comm.abort();
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
        tracing::info!(ranks = n, "tensor parallel: one model over {n} CPU ranks");
        Ok(TpRunner {
            config: config.clone(),
            rank0,
            others,
            comm,
            begun: None,
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

    /// Waits for every other rank's answer; the first error, if any.
    fn gather(&self) -> Result<(), EngineError> {
        let mut first = Ok(());
        for (i, r) in self.others.iter().enumerate() {
            let res = r.done.recv().unwrap_or_else(|_| {
                Err(EngineError::InvalidRequest(format!(
                    "tensor-parallel rank {} has stopped",
                    i + 1
                )))
            });
            if first.is_ok() {
                first = res;
            }
        }
        first
    }

    /// Runs `f` on rank 0 while the other ranks run `batch`'s forward pass.
    fn with_ranks<T>(
        &mut self,
        batch: &ForwardBatch,
        f: impl FnOnce(&mut ModelRunner<CpuDevice>) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        self.broadcast(|| Command::Forward(Box::new(batch.clone())))?;
        let out = f(&mut self.rank0);
        if out.is_err() {
            // Ranks waiting in a collective for rank 0 get an error instead of waiting forever.
            self.comm.abort();
        }
        let others = self.gather();
        if out.is_err() || others.is_err() {
            // Every rank is back: the next step starts clean (a step refused for its batch
            // fails on every rank alike and leaves the model as it was).
            self.comm.reset();
        }
        let out = out?;
        others?;
        Ok(out)
    }
}

impl Drop for TpRunner {
    fn drop(&mut self) {
        self.comm.abort();
        for Rank {
            commands, thread, ..
        } in self.others.drain(..)
        {
            drop(commands); // the rank's loop ends
            let _ = thread.join();
        }
    }
}

impl Runner for TpRunner {
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
    fn forward_step(
        &mut self,
        batch: &ForwardBatch,
        plan: &StepPlan,
    ) -> Result<StepOutput, EngineError> {
        self.with_ranks(batch, |r| r.forward_step(batch, plan))
    }
    fn forward_begin(&mut self, batch: &ForwardBatch) -> Result<(), EngineError> {
        // The CPU computes at the finish anyway: the ranks run the whole step there.
        self.begun = Some(batch.clone());
        Ok(())
    }
    fn forward_finish(&mut self, plan: &StepPlan) -> Result<StepOutput, EngineError> {
        let batch = self.begun.take().ok_or_else(|| {
            EngineError::InvalidRequest("forward_finish without forward_begin".into())
        })?;
        self.forward_step(&batch, plan)
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
    fn set_cuda_graphs(&mut self, _on: bool) -> bool {
        false
    }
    fn cuda_graphs(&self) -> Option<GraphReport> {
        None
    }
    fn set_profiling(&self, on: bool) {
        self.rank0.set_profiling(on);
        if self.broadcast(|| Command::SetProfiling(on)).is_ok() {
            let _ = self.gather();
        }
    }
    fn take_profile(&self) -> Result<Vec<(String, f64, usize)>, EngineError> {
        self.rank0.take_profile()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_item_once_in_order() {
        for len in [1usize, 7, 8, 300, 49_155] {
            for n in 1..=5 {
                let parts: Vec<_> = (0..n).map(|r| split(len, r, n)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[n - 1].end, len);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
                }
            }
        }
    }

    #[test]
    fn fewer_kv_heads_than_ranks_are_kept_by_the_ranks_whose_queries_use_them() {
        // 8 query heads, 2 KV heads, 4 ranks: ranks 0–1 hold queries 0–3 (KV head 0).
        let got: Vec<_> = (0..4).map(|r| kv_heads(2, r, 4)).collect();
        assert_eq!(got, vec![0..1, 0..1, 1..2, 1..2]);
        assert_eq!(kv_heads(8, 1, 4), 2..4);
    }

    #[test]
    fn shapes_that_do_not_divide_are_refused_with_what_does_not() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tiny-gqa-llama3/config.json");
        let mut c = ModelConfig::from_hf_json(&path).unwrap();
        c.num_attention_heads = 6;
        c.num_key_value_heads = 2;
        c.intermediate_size = 96;
        assert!(check(&c, 3).unwrap_err().contains("2 KV heads"));
        assert!(check(&c, 4).unwrap_err().contains("6 attention heads"));
        c.intermediate_size = 63;
        assert!(check(&c, 2).unwrap_err().contains("63 hidden units"));
        c.intermediate_size = 96;
        assert!(check(&c, 2).is_ok());
        assert!(
            check(&c, 6).is_ok(),
            "KV heads replicated: 6 is a multiple of 2"
        );
    }
}
