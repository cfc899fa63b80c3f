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
//! All of it is captured at start-up (the activations it allocates stay reserved, and are
//! reported); a shape that has no graph runs eagerly.

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};

use super::{op_err, CudaBatch, CudaBuf, CudaDevice, CudaKv, CudaTensor, DEV};
use crate::device::{Device, ForwardBatch, ForwardBody, GraphReport};
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
    /// Padded batch sizes, ascending.
    sizes: Vec<usize>,
    max_len: usize,
    vocab: usize,
    /// Block-table width of the static batch: enough blocks for `max_len` tokens.
    width: usize,
    batch: CudaBatch,
    logits: CudaSlice<f32>,
    graphs: HashMap<(usize, usize), Graph>,
    report: GraphReport,
}

impl DecodeGraphs {
    fn bucket(&self, ctx: usize) -> usize {
        ctx.max(MIN_BUCKET)
            .next_power_of_two()
            .min(self.max_len.next_power_of_two())
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

/// Whether `batch` is a decode step a graph can run: one new token per sequence, logits for
/// each in order.
fn is_decode(batch: &ForwardBatch) -> bool {
    !batch.seqs.is_empty()
        && batch.seqs.iter().all(|s| s.query_len == 1)
        && batch.logit_rows.len() == batch.seqs.len()
        && batch
            .logit_rows
            .iter()
            .enumerate()
            .all(|(i, &r)| r as usize == i)
}

impl CudaDevice {
    /// Static batch buffers for up to `rows` decode rows of `width` block-table entries.
    fn static_batch(&self, rows: usize, width: usize) -> Result<CudaBatch, DeviceError> {
        let seq: Vec<u32> = (0..rows as u32).collect();
        let zeros = vec![0u32; rows];
        Ok(CudaBatch {
            n: rows,
            ids: self.htod_u32(&zeros)?,
            pos: self.htod_u32(&zeros)?,
            slots: self.htod_u32(&vec![PAD_SLOT; rows])?,
            block_tables: self.htod_u32(&vec![0u32; rows * width])?,
            max_blocks: width,
            logit_rows: self.htod_u32(&seq)?,
            num_logit_rows: rows,
            block_size: self.block_size,
            tile_seq: self.htod_u32(&seq)?,
            tile_start: self.htod_u32(&seq)?,
            tile_len: self.htod_u32(&vec![1u32; rows])?,
            num_tiles: rows,
            tile_lens: vec![1; rows],
            max_ctx: 0,
        })
    }

    pub(super) fn capture_all(
        &self,
        kv: &mut CudaKv,
        sizes: &[usize],
        max_len: usize,
        vocab: usize,
        body: &mut ForwardBody<'_, Self>,
    ) -> Result<Option<GraphReport>, EngineError> {
        let mut sizes: Vec<usize> = sizes.iter().copied().filter(|&s| s > 0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let Some(&largest) = sizes.last() else {
            return Ok(None);
        };
        let t0 = Instant::now();
        self.synchronize()?;
        let free0 = self.ctx.mem_get_info().map_err(op_err("memory info"))?.0;
        let width = max_len.div_ceil(self.block_size).max(1);
        let mut g = DecodeGraphs {
            enabled: true,
            sizes: sizes.clone(),
            max_len,
            vocab,
            width,
            batch: self.static_batch(largest, width)?,
            logits: self.alloc_f32(largest * vocab, "graph logits")?,
            graphs: HashMap::new(),
            report: GraphReport::default(),
        };
        for &size in &sizes {
            for bucket in g.buckets() {
                let graph = self.capture(&mut g, kv, size, bucket, body)?;
                g.graphs.insert((size, bucket), graph);
            }
        }
        self.synchronize()?;
        let free1 = self.ctx.mem_get_info().map_err(op_err("memory info"))?.0;
        g.report = GraphReport {
            graphs: g.graphs.len(),
            bytes: free0.saturating_sub(free1),
            capture_ms: t0.elapsed().as_secs_f64() * 1e3,
        };
        let report = g.report;
        kv.graphs = Some(g);
        Ok(Some(report))
    }

    /// Records the forward pass of a `size`-row decode batch whose longest context is at most
    /// `bucket`.
    fn capture(
        &self,
        g: &mut DecodeGraphs,
        kv: &mut CudaKv,
        size: usize,
        bucket: usize,
        body: &mut ForwardBody<'_, Self>,
    ) -> Result<Graph, EngineError> {
        g.batch.n = size;
        g.batch.num_tiles = size;
        g.batch.num_logit_rows = size;
        g.batch.tile_lens = vec![1; size];
        g.batch.max_ctx = bucket;
        let was_profiling = self.profiling.replace(false);
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(op_err("begin graph capture"))?;
        let recorded = body(kv, &g.batch).and_then(|t| {
            let CudaBuf::F32(src) = &t.buf else {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "graph capture",
                    msg: "logits must be f32".into(),
                }
                .into());
            };
            let mut dst = g.logits.slice_mut(0..size * g.vocab);
            self.stream
                .memcpy_dtod(src, &mut dst)
                .map_err(op_err("graph logits copy"))?;
            Ok(())
        });
        // Ends the capture whatever happened, so the stream is usable again.
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(op_err("end graph capture"));
        self.profiling.set(was_profiling);
        recorded?;
        let graph = graph?.ok_or(DeviceError::Op {
            device: DEV,
            op: "graph capture",
            msg: "the capture recorded nothing".into(),
        })?;
        graph.upload().map_err(op_err("graph upload"))?;
        Ok(Graph(graph))
    }

    pub(super) fn replay(
        &self,
        kv: &mut CudaKv,
        batch: &ForwardBatch,
        body: &mut ForwardBody<'_, Self>,
    ) -> Result<Option<CudaTensor>, EngineError> {
        if self.profiling.get() || !is_decode(batch) {
            return Ok(None);
        }
        let Some(mut g) = kv.graphs.take() else {
            return Ok(None);
        };
        let out = self.replay_with(&mut g, kv, batch, body);
        kv.graphs = Some(g);
        out
    }

    fn replay_with(
        &self,
        g: &mut DecodeGraphs,
        kv: &mut CudaKv,
        batch: &ForwardBatch,
        body: &mut ForwardBody<'_, Self>,
    ) -> Result<Option<CudaTensor>, EngineError> {
        let rows = batch.seqs.len();
        let max_ctx = batch.seqs.iter().map(|s| s.context_len).max().unwrap_or(0);
        let Some(&size) = g.sizes.iter().find(|&&s| s >= rows) else {
            return Ok(None);
        };
        if !g.enabled
            || max_ctx > g.max_len
            || batch.seqs.iter().any(|s| s.block_table.len() > g.width)
        {
            return Ok(None);
        }
        let bucket = g.bucket(max_ctx);
        let mut ids = vec![0u32; size];
        let mut pos = vec![0u32; size];
        let mut slots = vec![PAD_SLOT; size];
        let mut tables = vec![0u32; size * g.width];
        for (i, s) in batch.seqs.iter().enumerate() {
            ids[i] = batch.token_ids[s.query_start];
            pos[i] = batch.positions[s.query_start];
            slots[i] = batch.slot_mapping[s.query_start];
            tables[i * g.width..i * g.width + s.block_table.len()].copy_from_slice(&s.block_table);
        }
        let up = |src: &[u32], dst: &mut CudaSlice<u32>| {
            self.stream
                .memcpy_htod(src, &mut dst.slice_mut(0..src.len()))
                .map_err(op_err("graph batch upload"))
        };
        up(&ids, &mut g.batch.ids)?;
        up(&pos, &mut g.batch.pos)?;
        up(&slots, &mut g.batch.slots)?;
        up(&tables, &mut g.batch.block_tables)?;
        if !g.graphs.contains_key(&(size, bucket)) {
            let graph = self.capture(g, kv, size, bucket, body)?;
            g.graphs.insert((size, bucket), graph);
            g.report.graphs = g.graphs.len();
        }
        g.graphs[&(size, bucket)]
            .0
            .launch()
            .map_err(op_err("graph launch"))?;
        let mut out = self.alloc_f32(rows * g.vocab, "logits")?;
        self.stream
            .memcpy_dtod(&g.logits.slice(0..rows * g.vocab), &mut out)
            .map_err(op_err("graph logits copy"))?;
        Ok(Some(CudaTensor {
            rows,
            cols: g.vocab,
            buf: CudaBuf::F32(out),
        }))
    }
}
