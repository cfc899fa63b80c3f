//! CUDA graphs for decode steps.
//!
//! A decode step of an 8B model is about 300 kernel launches and GEMMs of a few microseconds
//! each: launched one by one from the host, the step is bound by launch latency, not by the
//! bytes it reads. A graph records the whole forward pass once and replays it with one launch.
//!
//! What a graph bakes in must not change between replays, so a decode batch is padded to one
//! of a fixed set of sizes and runs on *static* batch buffers (token ids, positions, slots,
//! block tables, uploaded before each replay) sized for the largest graph; its logits land in a
//! static buffer. Padding rows write no K/V (slot `u32::MAX`, skipped by `rope_kv_bf16`) and
//! their logits are dropped. The attention split (how many blocks share a long key range) is a
//! launch parameter, so graphs are keyed by size *and* a power-of-two bucket of the longest
//! context: a replay covers contexts up to its bucket, exactly as an eager launch planned for
//! that context would.
//!
//! Speculative verification steps (the last known token of each sequence and up to k drafts,
//! logits for every token) get graphs of their own when asked for: each sequence padded to
//! 1 + k tokens (padding tokens repeat the position of the sequence's last real token, so they
//! see no key it does not, write no K/V, and their logits are dropped), on a second static
//! batch whose attention tiles are 1 + k tokens long. Without them a verification step of a
//! launch-bound model costs several plain steps and speculation cannot pay.
//!
//! All of it is captured at start-up (the activations it allocates stay reserved, and are
//! reported); a shape that has no graph runs eagerly.

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};

use super::{op_err, CudaBatch, CudaBuf, CudaDevice, CudaKv, CudaTensor, DEV};
use crate::device::{Device, ForwardBatch, ForwardBody, GraphReport, GraphShapes};
use crate::error::{DeviceError, EngineError};

/// Padding rows' slot: their K/V are not written.
const PAD_SLOT: u32 = u32::MAX;
/// Smallest context bucket.
const MIN_BUCKET: usize = 256;

/// An instantiated graph.
struct Graph(CudaGraph);

// SAFETY: like the device that captured it, a graph is only used from the thread that owns the
// device and its KV cache (the engine thread); moving it there is fine, sharing is not allowed
// (it is not Sync).
unsafe impl Send for Graph {}

/// The graphs of one KV cache (they bake in its buffers).
pub struct DecodeGraphs {
    pub enabled: bool,
    /// Padded batch sizes of plain decode steps, ascending.
    sizes: Vec<usize>,
    /// Tokens per sequence of verification steps (0: no verification graphs) and their padded
    /// batch sizes, ascending.
    verify_tokens: usize,
    verify_sizes: Vec<usize>,
    max_len: usize,
    vocab: usize,
    /// Block-table width of the static batches: enough blocks for `max_len` tokens.
    width: usize,
    /// Static batch of plain decode steps (one token per sequence).
    batch: CudaBatch,
    /// Static batch of verification steps (`verify_tokens` per sequence), if any.
    verify_batch: Option<CudaBatch>,
    logits: CudaSlice<f32>,
    /// By (tokens per sequence, padded batch size, context bucket).
    graphs: HashMap<(usize, usize, usize), Graph>,
    report: GraphReport,
}

impl DecodeGraphs {
    fn bucket(&self, ctx: usize) -> usize {
        ctx.max(MIN_BUCKET)
            .next_power_of_two()
            .min(self.max_len.next_power_of_two())
    }

    /// The static batch of steps with `tokens` new tokens per sequence.
    fn static_batch_for(&mut self, tokens: usize) -> Result<&mut CudaBatch, DeviceError> {
        if tokens == 1 {
            return Ok(&mut self.batch);
        }
        self.verify_batch.as_mut().ok_or(DeviceError::Op {
            device: DEV,
            op: "graph",
            msg: "no static batch for verification steps".into(),
        })
    }

    /// The static batch set up for a step of `size` sequences of `tokens` new tokens each whose
    /// longest context is at most `bucket`.
    fn step_batch(
        &mut self,
        tokens: usize,
        size: usize,
        bucket: usize,
    ) -> Result<&mut CudaBatch, DeviceError> {
        let batch = self.static_batch_for(tokens)?;
        let rows = size * tokens;
        batch.n = rows;
        batch.num_tiles = size;
        batch.num_logit_rows = rows;
        batch.tile_lens = vec![tokens as u32; size];
        batch.max_ctx = bucket;
        Ok(batch)
    }

    fn buckets(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut b = MIN_BUCKET.min(self.max_len.next_power_of_two());
        loop {
            v.push(b);
            if b >= self.max_len {
                return v;
            }
            b *= 2;
        }
    }
}

/// The most new tokens any sequence of `batch` has, when it is a step a graph can run: every
/// sequence with at least one new token and logits for every token, in order (a decode step
/// has one token per sequence; a verification step the last known token and its drafts).
fn graph_tokens(batch: &ForwardBatch) -> Option<usize> {
    let all_logits = batch.logit_rows.len() == batch.token_ids.len()
        && batch
            .logit_rows
            .iter()
            .enumerate()
            .all(|(i, &r)| r as usize == i);
    if batch.seqs.is_empty() || !all_logits || batch.seqs.iter().any(|s| s.query_len == 0) {
        return None;
    }
    batch.seqs.iter().map(|s| s.query_len).max()
}

impl CudaDevice {
    /// Static batch buffers for up to `seqs` sequences of `q` new tokens each (one attention
    /// tile per sequence, logits for every token) and `width` block-table entries.
    fn static_batch(&self, seqs: usize, q: usize, width: usize) -> Result<CudaBatch, DeviceError> {
        let rows = seqs * q;
        let seq: Vec<u32> = (0..seqs as u32).collect();
        let starts: Vec<u32> = (0..seqs as u32).map(|i| i * q as u32).collect();
        let all: Vec<u32> = (0..rows as u32).collect();
        let zeros = vec![0u32; rows];
        Ok(CudaBatch {
            n: rows,
            ids: self.htod_u32(&zeros)?,
            pos: self.htod_u32(&zeros)?,
            slots: self.htod_u32(&vec![PAD_SLOT; rows])?,
            block_tables: self.htod_u32(&vec![0u32; seqs * width])?,
            max_blocks: width,
            logit_rows: self.htod_u32(&all)?,
            num_logit_rows: rows,
            block_size: self.block_size,
            tile_seq: self.htod_u32(&seq)?,
            tile_start: self.htod_u32(&starts)?,
            tile_len: self.htod_u32(&vec![q as u32; seqs])?,
            num_tiles: seqs,
            tile_lens: vec![q as u32; seqs],
            max_ctx: 0,
        })
    }

    pub(super) fn capture_all(
        &self,
        kv: &mut CudaKv,
        shapes: &GraphShapes,
        max_len: usize,
        vocab: usize,
        body: &mut ForwardBody<'_, Self>,
    ) -> Result<Option<GraphReport>, EngineError> {
        let mut sizes: Vec<usize> = shapes.sizes.iter().copied().filter(|&s| s > 0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let Some(&largest) = sizes.last() else {
            return Ok(None);
        };
        // Verification steps: the sizes up to verify_max_seqs, and the smallest size above it
        // (a step of verify_max_seqs sequences must find one).
        let q = shapes.verify_tokens;
        let verify_sizes: Vec<usize> = if q > 1 {
            let upto = sizes
                .iter()
                .position(|&s| s >= shapes.verify_max_seqs)
                .map_or(sizes.len(), |i| i + 1);
            sizes[..upto].to_vec()
        } else {
            Vec::new()
        };
        let t0 = Instant::now();
        self.synchronize()?;
        let free0 = self.ctx.mem_get_info().map_err(op_err("memory info"))?.0;
        let width = max_len.div_ceil(self.block_size).max(1);
        let verify_rows = verify_sizes.last().map_or(0, |&s| s * q);
        let mut g = DecodeGraphs {
            enabled: true,
            sizes: sizes.clone(),
            verify_tokens: if verify_sizes.is_empty() { 0 } else { q },
            verify_sizes: verify_sizes.clone(),
            max_len,
            vocab,
            width,
            batch: self.static_batch(largest, 1, width)?,
            verify_batch: match verify_sizes.last() {
                Some(&s) => Some(self.static_batch(s, q, width)?),
                None => None,
            },
            logits: self.alloc_f32(largest.max(verify_rows) * vocab, "graph logits")?,
            graphs: HashMap::new(),
            report: GraphReport::default(),
        };
        let shapes: Vec<(usize, usize)> = sizes
            .iter()
            .map(|&s| (1, s))
            .chain(verify_sizes.iter().map(|&s| (q, s)))
            .collect();
        for (tokens, size) in shapes {
            for bucket in g.buckets() {
                let graph = self.capture(&mut g, kv, tokens, size, bucket, body)?;
                g.graphs.insert((tokens, size, bucket), graph);
            }
        }
        self.synchronize()?;
        let free1 = self.ctx.mem_get_info().map_err(op_err("memory info"))?.0;
        g.report = GraphReport {
            graphs: g.graphs.len(),
            programmatic_edges: g.report.programmatic_edges,
            bytes: free0.saturating_sub(free1),
            capture_ms: t0.elapsed().as_secs_f64() * 1e3,
        };
        let report = g.report;
        kv.graphs = Some(g);
        Ok(Some(report))
    }

    /// Records the forward pass of a batch of `size` sequences of `tokens` new tokens each
    /// (1: a decode step; more: a verification step) whose longest context is at most `bucket`.
    fn capture(
        &self,
        g: &mut DecodeGraphs,
        kv: &mut CudaKv,
        tokens: usize,
        size: usize,
        bucket: usize,
        body: &mut ForwardBody<'_, Self>,
    ) -> Result<Graph, EngineError> {
        let vocab = g.vocab;
        let rows = size * tokens;
        let batch = g.step_batch(tokens, size, bucket)?;
        let was_profiling = self.pause_profiling();
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(op_err("begin graph capture"))?;
        // Our kernels' launches make their edges programmatic while this is set (launch.rs).
        let edges0 = self.pdl_edges.get();
        self.capturing.set(true);
        let recorded = body(kv, batch).and_then(|t| {
            let CudaBuf::F32(src) = &t.buf else {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "graph capture",
                    msg: "logits must be f32".into(),
                }
                .into());
            };
            let mut dst = g.logits.slice_mut(0..rows * vocab);
            self.stream
                .memcpy_dtod(src, &mut dst)
                .map_err(op_err("graph logits copy"))?;
            Ok(())
        });
        self.capturing.set(false);
        // Ends the capture whatever happened, so the stream is usable again.
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(op_err("end graph capture"));
        self.resume_profiling(was_profiling);
        recorded?;
        let edges = self.pdl_edges.get() - edges0;
        let graph = match graph {
            Err(e) if edges > 0 => {
                tracing::warn!(error = %e, "a decode graph with programmatic edges did not instantiate; plain edges from now on");
                self.pdl.set(false);
                return self.capture(g, kv, tokens, size, bucket, body);
            }
            graph => graph?.ok_or(DeviceError::Op {
                device: DEV,
                op: "graph capture",
                msg: "the capture recorded nothing".into(),
            })?,
        };
        g.report.programmatic_edges += edges;
        graph.upload().map_err(op_err("graph upload"))?;
        Ok(Graph(graph))
    }

    pub(super) fn replay(
        &self,
        kv: &mut CudaKv,
        batch: &ForwardBatch,
        body: &mut ForwardBody<'_, Self>,
    ) -> Result<Option<CudaTensor>, EngineError> {
        let Some(most) = graph_tokens(batch).filter(|_| !self.profiling_on()) else {
            return Ok(None);
        };
        let Some(mut g) = kv.graphs.take() else {
            return Ok(None);
        };
        let out = self.replay_with(&mut g, kv, batch, most, body);
        kv.graphs = Some(g);
        out
    }

    fn replay_with(
        &self,
        g: &mut DecodeGraphs,
        kv: &mut CudaKv,
        batch: &ForwardBatch,
        most: usize,
        body: &mut ForwardBody<'_, Self>,
    ) -> Result<Option<CudaTensor>, EngineError> {
        // `most`: the most new tokens a sequence has (graph_tokens). Decode steps take the one-token graphs; verification steps the padded ones.
        let (q, sizes) = if most == 1 {
            (1, &g.sizes)
        } else if most <= g.verify_tokens {
            (g.verify_tokens, &g.verify_sizes)
        } else {
            return Ok(None);
        };
        let seqs = batch.seqs.len();
        let max_ctx = batch.seqs.iter().map(|s| s.context_len).max().unwrap_or(0);
        let Some(&size) = sizes.iter().find(|&&s| s >= seqs) else {
            return Ok(None);
        };
        if !g.enabled
            || max_ctx > g.max_len
            || batch.seqs.iter().any(|s| s.block_table.len() > g.width)
        {
            return Ok(None);
        }
        let bucket = g.bucket(max_ctx);
        let rows = size * q;
        let mut ids = vec![0u32; rows];
        let mut pos = vec![0u32; rows];
        let mut slots = vec![PAD_SLOT; rows];
        let mut tables = vec![0u32; size * g.width];
        for (i, s) in batch.seqs.iter().enumerate() {
            let last = s.query_start + s.query_len - 1;
            for j in 0..q {
                let r = i * q + j;
                let src = s.query_start + j;
                // Padding repeats the last real token's position: it sees what that token sees.
                pos[r] = batch.positions[src.min(last)];
                if src <= last {
                    ids[r] = batch.token_ids[src];
                    slots[r] = batch.slot_mapping[src];
                }
            }
            tables[i * g.width..i * g.width + s.block_table.len()].copy_from_slice(&s.block_table);
        }
        let vocab = g.vocab;
        let static_batch = g.static_batch_for(q)?;
        let up = |src: &[u32], dst: &mut CudaSlice<u32>| {
            self.stream
                .memcpy_htod(src, &mut dst.slice_mut(0..src.len()))
                .map_err(op_err("graph batch upload"))
        };
        up(&ids, &mut static_batch.ids)?;
        up(&pos, &mut static_batch.pos)?;
        up(&slots, &mut static_batch.slots)?;
        up(&tables, &mut static_batch.block_tables)?;
        if !g.graphs.contains_key(&(q, size, bucket)) {
            let graph = self.capture(g, kv, q, size, bucket, body)?;
            g.graphs.insert((q, size, bucket), graph);
            g.report.graphs = g.graphs.len();
        }
        g.graphs[&(q, size, bucket)]
            .0
            .launch()
            .map_err(op_err("graph launch"))?;
        // Logits of the real tokens, in the batch's order (sequence after sequence).
        let n = batch.token_ids.len();
        let mut out = self.alloc_f32(n * vocab, "logits")?;
        if q == 1 || batch.seqs.iter().all(|s| s.query_len == q) {
            self.stream
                .memcpy_dtod(&g.logits.slice(0..n * vocab), &mut out)
                .map_err(op_err("graph logits copy"))?;
        } else {
            for (i, s) in batch.seqs.iter().enumerate() {
                let from = i * q * vocab;
                let to = s.query_start * vocab;
                let len = s.query_len * vocab;
                self.stream
                    .memcpy_dtod(
                        &g.logits.slice(from..from + len),
                        &mut out.slice_mut(to..to + len),
                    )
                    .map_err(op_err("graph logits copy"))?;
            }
        }
        Ok(Some(CudaTensor {
            rows: n,
            cols: vocab,
            buf: CudaBuf::F32(out),
        }))
    }
}
