//! The CPU device: f32 everywhere, the reference every other device is compared with.
//! Matmuls and attention use all cores through rayon.

mod attention;
mod comm;
pub mod gemm;

use std::sync::Arc;

use rayon::prelude::*;

use super::{
    fp8, kv_int8, AttnLayer, AttnParams, Delta, Device, DeviceSample, ForwardBatch, HeadNorm,
    KvCacheDtype, KvLayout, MoeParams, MoeWeights, Part, RowSampling,
};
use crate::config::Activation;
use crate::error::DeviceError;
use crate::tensor::HostTensor;

pub use comm::CpuComm;

/// A row-major f32 matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuTensor {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// The paged KV cache: per layer, K and V of `[num_slots, num_kv_heads, head_dim]`, in f32, or
/// (FP8) as e4m3 codes with a scale per `[num_slots, num_kv_heads]`, or (INT8) as codes with an
/// aux word per `[num_slots, num_kv_heads]` and the calibrated table ([`kv_int8`]).
pub struct CpuKv {
    pub layout: KvLayout,
    pub store: CpuKvStore,
}

pub enum CpuKvStore {
    F32 {
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
    },
    Fp8 {
        k: Vec<Vec<u8>>,
        v: Vec<Vec<u8>>,
        k_scale: Vec<Vec<f32>>,
        v_scale: Vec<Vec<f32>>,
    },
    Int8 {
        k: Vec<Vec<u8>>,
        v: Vec<Vec<u8>>,
        k_aux: Vec<Vec<u32>>,
        v_aux: Vec<Vec<u32>>,
        /// Per layer, per KV head: K's and V's formats (the calibrated table's).
        heads: Vec<Vec<[kv_int8::HeadFormat; 2]>>,
    },
}

impl CpuKv {
    fn slot_stride(&self) -> usize {
        self.layout.num_kv_heads * self.layout.head_dim
    }

    /// Stores one token's K and V (`[num_kv_heads · head_dim]` each) at `slot` of `layer`.
    fn write(&mut self, layer: usize, slot: usize, k_src: &[f32], v_src: &[f32]) {
        let (stride, d) = (self.slot_stride(), self.layout.head_dim);
        let range = slot * stride..(slot + 1) * stride;
        match &mut self.store {
            CpuKvStore::F32 { k, v } => {
                k[layer][range.clone()].copy_from_slice(k_src);
                v[layer][range].copy_from_slice(v_src);
            }
            CpuKvStore::Fp8 {
                k,
                v,
                k_scale,
                v_scale,
            } => {
                let nkv = self.layout.num_kv_heads;
                for h in 0..nkv {
                    let (lo, hi) = (slot * stride + h * d, slot * stride + (h + 1) * d);
                    k_scale[layer][slot * nkv + h] =
                        fp8::quantize_head(&k_src[h * d..(h + 1) * d], &mut k[layer][lo..hi]);
                    v_scale[layer][slot * nkv + h] =
                        fp8::quantize_head(&v_src[h * d..(h + 1) * d], &mut v[layer][lo..hi]);
                }
            }
            CpuKvStore::Int8 {
                k,
                v,
                k_aux,
                v_aux,
                heads,
            } => {
                let nkv = self.layout.num_kv_heads;
                for (h, [fk, fv]) in heads[layer].iter().enumerate() {
                    let (lo, hi) = (slot * stride + h * d, slot * stride + (h + 1) * d);
                    k_aux[layer][slot * nkv + h] = kv_int8::quantize_head(
                        &k_src[h * d..(h + 1) * d],
                        fk,
                        &mut k[layer][lo..hi],
                    );
                    v_aux[layer][slot * nkv + h] = kv_int8::quantize_head(
                        &v_src[h * d..(h + 1) * d],
                        fv,
                        &mut v[layer][lo..hi],
                    );
                }
            }
        }
    }
}

/// Batch metadata for the CPU: the host batch plus each token's sequence.
pub struct CpuBatch {
    pub batch: ForwardBatch,
    pub seq_of_token: Vec<u32>,
}

/// Every mixture-of-experts call's routing, in call order: per token, its experts by slot.
type RouteLog = Arc<std::sync::Mutex<Vec<Vec<Vec<usize>>>>>;

/// A CPU device's place in a tensor-parallel group.
#[derive(Debug, Clone)]
struct CpuRank {
    comm: Arc<CpuComm>,
    rank: usize,
    /// The ranks' shares of the vocabulary, in rank order (their embedding rows).
    vocab_widths: Vec<usize>,
}

#[derive(Debug, Default, Clone)]
pub struct CpuDevice {
    /// The tensor-parallel group this device is a rank of.
    tp: Option<CpuRank>,
    /// Where [`Device::moe`] records its routing, when asked ([`CpuDevice::recording_routes`]).
    routes: Option<RouteLog>,
}

impl CpuDevice {
    pub fn new() -> Self {
        CpuDevice::default()
    }

    /// Rank `rank` of the tensor-parallel group `comm` ([`crate::model::tensor_parallel`]),
    /// the ranks holding `vocab_widths` rows of the vocabulary each.
    pub fn rank(comm: Arc<CpuComm>, rank: usize, vocab_widths: Vec<usize>) -> Self {
        CpuDevice {
            tp: Some(CpuRank {
                comm,
                rank,
                vocab_widths,
            }),
            routes: None,
        }
    }

    /// A device that records which experts every token goes to (for checking a model's routing
    /// against a reference); [`CpuDevice::take_routes`] hands them over.
    pub fn recording_routes() -> Self {
        CpuDevice {
            routes: Some(Default::default()),
            ..Default::default()
        }
    }

    /// The routing recorded since the last call: per mixture-of-experts call (a layer of a
    /// forward pass), per token, the chosen experts in slot order.
    pub fn take_routes(&self) -> Vec<Vec<Vec<usize>>> {
        self.routes
            .as_ref()
            .map(|r| std::mem::take(&mut *r.lock().unwrap_or_else(|e| e.into_inner())))
            .unwrap_or_default()
    }
}

/// `layers` zero-filled vectors of `len`, or an out-of-memory error instead of an abort.
fn zeroed_layers<T: Clone>(layers: usize, len: usize, zero: T) -> Result<Vec<Vec<T>>, DeviceError> {
    (0..layers)
        .map(|_| {
            let mut v = Vec::new();
            v.try_reserve_exact(len)
                .map_err(|_| DeviceError::OutOfMemory {
                    device: "cpu",
                    bytes: len * std::mem::size_of::<T>(),
                    what: "KV cache".into(),
                })?;
            v.resize(len, zero.clone());
            Ok(v)
        })
        .collect()
}

fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((o, &xv), &wv) in out.iter_mut().zip(x).zip(w) {
        *o = wv * (xv * inv);
    }
}

impl Device for CpuDevice {
    type Tensor = CpuTensor;
    type Kv = CpuKv;
    type Batch = CpuBatch;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn upload(&self, t: &HostTensor) -> Result<CpuTensor, DeviceError> {
        let (rows, cols) = super::matrix_dims(&t.shape, "cpu", "upload")?;
        Ok(CpuTensor {
            rows,
            cols,
            data: t.data.clone(),
        })
    }

    fn upload_owned(&self, t: HostTensor) -> Result<CpuTensor, DeviceError> {
        let (rows, cols) = super::matrix_dims(&t.shape, "cpu", "upload")?;
        Ok(CpuTensor {
            rows,
            cols,
            data: t.data,
        })
    }

    /// The reference keeps f32: each weight becomes the value its e4m3 code and row scale
    /// stand for, so the arithmetic after is exactly what FP8 weights mean.
    fn quantize_fp8(&self, mut w: CpuTensor) -> Result<CpuTensor, DeviceError> {
        let mut codes = vec![0u8; w.cols];
        for row in w.data.chunks_mut(w.cols.max(1)) {
            let scale = super::fp8::quantize_row(row, &mut codes);
            super::fp8::dequantize_head(&codes, scale, row);
        }
        Ok(w)
    }

    fn alloc_kv(
        &self,
        layout: &KvLayout,
        int8: Option<&kv_int8::KvInt8Table>,
    ) -> Result<CpuKv, DeviceError> {
        let int8 = kv_int8::check_table("cpu", layout, int8)?;
        let heads = layout.num_slots() * layout.num_kv_heads;
        let n = heads * layout.head_dim;
        let l = layout.num_layers;
        let store = match layout.dtype {
            KvCacheDtype::Auto => CpuKvStore::F32 {
                k: zeroed_layers(l, n, 0.0f32)?,
                v: zeroed_layers(l, n, 0.0f32)?,
            },
            KvCacheDtype::Fp8E4m3 => CpuKvStore::Fp8 {
                k: zeroed_layers(l, n, 0u8)?,
                v: zeroed_layers(l, n, 0u8)?,
                k_scale: zeroed_layers(l, heads, 0.0f32)?,
                v_scale: zeroed_layers(l, heads, 0.0f32)?,
            },
            KvCacheDtype::Int8 => CpuKvStore::Int8 {
                k: zeroed_layers(l, n, 0u8)?,
                v: zeroed_layers(l, n, 0u8)?,
                k_aux: zeroed_layers(l, heads, 0u32)?,
                v_aux: zeroed_layers(l, heads, 0u32)?,
                heads: int8.map_or_else(Vec::new, |t| {
                    (0..l)
                        .map(|layer| {
                            (0..layout.num_kv_heads)
                                .map(|h| [t.head(layer, 0, h), t.head(layer, 1, h)])
                                .collect()
                        })
                        .collect()
                }),
            },
        };
        Ok(CpuKv {
            layout: *layout,
            store,
        })
    }

    fn kv_rows(
        &self,
        kv: &CpuKv,
        layer: usize,
        slots: std::ops::Range<usize>,
    ) -> Result<(Vec<f32>, Vec<f32>), DeviceError> {
        let stride = kv.slot_stride();
        let (CpuKvStore::F32 { k, v }, true) = (
            &kv.store,
            layer < kv.layout.num_layers && slots.end <= kv.layout.num_slots(),
        ) else {
            return Err(DeviceError::Op {
                device: "cpu",
                op: "kv_rows",
                msg: "reads an unquantized cache's layers and slots only".into(),
            });
        };
        let r = slots.start * stride..slots.end * stride;
        Ok((k[layer][r.clone()].to_vec(), v[layer][r].to_vec()))
    }

    fn prepare_batch(&self, batch: &ForwardBatch) -> Result<CpuBatch, DeviceError> {
        let mut seq_of_token = vec![0u32; batch.num_tokens()];
        for (i, s) in batch.seqs.iter().enumerate() {
            seq_of_token[s.query_start..s.query_start + s.query_len].fill(i as u32);
        }
        Ok(CpuBatch {
            batch: batch.clone(),
            seq_of_token,
        })
    }

    fn embed(&self, table: &CpuTensor, b: &CpuBatch, scale: f32) -> Result<CpuTensor, DeviceError> {
        // A tensor-parallel rank holding its part of the vocabulary looks up the ids it holds,
        // and the ranks' rows are summed (each id's row is on exactly one rank).
        let part = match &self.tp {
            Some(tp) => crate::shard::vocab_part(&tp.vocab_widths, tp.rank, table.rows, "cpu")?,
            None => None,
        };
        let first = part.as_ref().map_or(0, |p| p.start);
        let cols = table.cols;
        let mut data = Vec::with_capacity(b.batch.num_tokens() * cols);
        for &t in &b.batch.token_ids {
            match (t as usize).checked_sub(first).filter(|&r| r < table.rows) {
                Some(r) => data.extend(table.row(r).iter().map(|x| x * scale)),
                None => data.extend(std::iter::repeat_n(0.0, cols)),
            }
        }
        let mut out = CpuTensor {
            rows: b.batch.num_tokens(),
            cols,
            data,
        };
        if part.is_some() {
            self.all_reduce_sum(&mut out)?;
        }
        Ok(out)
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32) -> Result<CpuTensor, DeviceError> {
        let mut out = vec![0.0f32; x.data.len()];
        out.par_chunks_mut(x.cols)
            .zip(x.data.par_chunks(x.cols))
            .for_each(|(o, r)| rms_norm_row(r, &w.data, eps, o));
        Ok(CpuTensor {
            rows: x.rows,
            cols: x.cols,
            data: out,
        })
    }

    fn add_rms_norm(
        &self,
        residual: &mut CpuTensor,
        delta: Delta<'_, CpuTensor>,
        w: &CpuTensor,
        eps: f32,
    ) -> Result<CpuTensor, DeviceError> {
        let normed;
        let d = match delta.norm {
            Some(norm) => {
                normed = self.rms_norm(delta.x, norm, eps)?;
                &normed
            }
            None => delta.x,
        };
        for (r, d) in residual.data.iter_mut().zip(&d.data) {
            *r += d;
        }
        self.rms_norm(residual, w, eps)
    }

    fn all_reduce_sum(&self, t: &mut CpuTensor) -> Result<(), DeviceError> {
        match &self.tp {
            Some(tp) => tp.comm.all_reduce_sum(tp.rank, &mut t.data),
            None => Ok(()),
        }
    }

    fn all_gather_cols(&self, t: CpuTensor) -> Result<CpuTensor, DeviceError> {
        match &self.tp {
            Some(tp) => {
                let (data, cols) = tp.comm.all_gather_cols(tp.rank, &t.data, t.rows)?;
                Ok(CpuTensor {
                    rows: t.rows,
                    cols,
                    data,
                })
            }
            None => Ok(t),
        }
    }

    fn linear(&self, x: &CpuTensor, w: &CpuTensor) -> Result<CpuTensor, DeviceError> {
        if x.cols != w.cols {
            return Err(DeviceError::Op {
                device: "cpu",
                op: "linear",
                msg: format!("x has {} columns, w has {}", x.cols, w.cols),
            });
        }
        let data = gemm::matmul_t(&x.data, &w.data, x.rows, x.cols, w.rows);
        Ok(CpuTensor {
            rows: x.rows,
            cols: w.rows,
            data,
        })
    }

    fn attention(
        &self,
        qkv: &mut CpuTensor,
        kv: &mut CpuKv,
        b: &CpuBatch,
        l: AttnLayer<'_, CpuTensor>,
    ) -> Result<CpuTensor, DeviceError> {
        let AttnLayer {
            qk_norm,
            rope,
            layer,
            p,
        } = l;
        if let Some(n) = qk_norm {
            head_norm(qkv, n, p);
        }
        rope_and_cache(qkv, rope, kv, layer, b, p)?;
        Ok(attention::paged_attention(qkv, kv, layer, b, p))
    }

    fn add_bias(&self, x: &mut CpuTensor, bias: &CpuTensor) -> Result<(), DeviceError> {
        if bias.data.len() != x.cols {
            return Err(DeviceError::Op {
                device: "cpu",
                op: "add_bias",
                msg: format!("bias of {} for {} columns", bias.data.len(), x.cols),
            });
        }
        x.data
            .par_chunks_mut(x.cols)
            .for_each(|r| r.iter_mut().zip(&bias.data).for_each(|(v, b)| *v += b));
        Ok(())
    }

    fn glu(&self, gu: &CpuTensor, act: Activation) -> Result<CpuTensor, DeviceError> {
        let i = gu.cols / 2;
        let mut out = vec![0.0f32; gu.rows * i];
        // torch's gelu(approximate="tanh"): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
        let c = (2.0f32 / std::f32::consts::PI).sqrt();
        let f = |x: f32| match act {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::GeluTanh => 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh()),
        };
        out.par_chunks_mut(i)
            .zip(gu.data.par_chunks(gu.cols))
            .for_each(|(o, r)| {
                let (g, u) = r.split_at(i);
                for j in 0..i {
                    o[j] = f(g[j]) * u[j];
                }
            });
        Ok(CpuTensor {
            rows: gu.rows,
            cols: i,
            data: out,
        })
    }

    /// The reference: every token routed on the host, then each expert's tokens through its
    /// gate|up, activation and down as one small matmul (a row's result does not depend on the
    /// rows beside it), the outputs summed per token in its routing order.
    fn moe(
        &self,
        x: &CpuTensor,
        w: MoeWeights<'_, CpuTensor>,
        p: &MoeParams,
    ) -> Result<CpuTensor, DeviceError> {
        let (n, h, e, k, i) = (x.rows, x.cols, p.num_experts, p.top_k, p.inter);
        p.check_shapes(
            h,
            (w.router.rows, w.router.cols),
            (w.gate_up.rows, w.gate_up.cols),
            (w.down.rows, w.down.cols),
        )
        .map_err(|e| DeviceError::Op {
            device: "cpu",
            op: "moe",
            msg: e.to_string(),
        })?;
        let logits = gemm::matmul_t(&x.data, &w.router.data, n, h, e);
        let routes: Vec<Vec<(usize, f32)>> = logits
            .chunks(e)
            .map(|l| super::moe::route(l, k, p.norm_topk_prob))
            .collect();
        if let Some(log) = &self.routes {
            let chosen = routes
                .iter()
                .map(|r| r.iter().map(|c| c.0).collect())
                .collect();
            log.lock().unwrap_or_else(|e| e.into_inner()).push(chosen);
        }
        // Each expert's (token, slot) pairs.
        let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e];
        for (t, r) in routes.iter().enumerate() {
            for (j, &(ex, _)) in r.iter().enumerate() {
                by_expert[ex].push((t, j));
            }
        }
        let outputs: Vec<(usize, Vec<f32>)> = by_expert
            .par_iter()
            .enumerate()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(ex, rows)| {
                let xs: Vec<f32> = rows
                    .iter()
                    .flat_map(|&(t, _)| x.row(t).iter().copied())
                    .collect();
                let m = rows.len();
                let gu = gemm::matmul_t(
                    &xs,
                    &w.gate_up.data[ex * 2 * i * h..(ex + 1) * 2 * i * h],
                    m,
                    h,
                    2 * i,
                );
                let act = self.glu(
                    &CpuTensor {
                        rows: m,
                        cols: 2 * i,
                        data: gu,
                    },
                    p.act,
                )?;
                let y = gemm::matmul_t(
                    &act.data,
                    &w.down.data[ex * h * i..(ex + 1) * h * i],
                    m,
                    i,
                    h,
                );
                Ok((ex, y))
            })
            .collect::<Result<_, DeviceError>>()?;
        let mut per_slot = vec![0.0f32; n * k * h];
        for (ex, y) in outputs {
            for (r, &(t, j)) in by_expert[ex].iter().enumerate() {
                per_slot[(t * k + j) * h..(t * k + j + 1) * h]
                    .copy_from_slice(&y[r * h..(r + 1) * h]);
            }
        }
        let mut out = vec![0.0f32; n * h];
        out.par_chunks_mut(h.max(1)).enumerate().for_each(|(t, o)| {
            for (j, &(_, wt)) in routes[t].iter().enumerate() {
                let y = &per_slot[(t * k + j) * h..(t * k + j + 1) * h];
                o.iter_mut().zip(y).for_each(|(o, y)| *o += wt * y);
            }
        });
        Ok(CpuTensor {
            rows: n,
            cols: h,
            data: out,
        })
    }

    fn gather_logit_rows(&self, x: &CpuTensor, b: &CpuBatch) -> Result<CpuTensor, DeviceError> {
        let mut data = Vec::with_capacity(b.batch.logit_rows.len() * x.cols);
        for &r in &b.batch.logit_rows {
            data.extend_from_slice(x.row(r as usize));
        }
        Ok(CpuTensor {
            rows: b.batch.logit_rows.len(),
            cols: x.cols,
            data,
        })
    }

    fn mask_logits(
        &self,
        logits: &mut CpuTensor,
        masks: &super::RowMasks,
    ) -> Result<(), DeviceError> {
        for (i, &r) in masks.rows.iter().enumerate() {
            let bits = &masks.bits[i * masks.words..(i + 1) * masks.words];
            let row = &mut logits.data[r as usize * logits.cols..(r as usize + 1) * logits.cols];
            for (t, x) in row.iter_mut().enumerate() {
                if bits[t / 32] >> (t % 32) & 1 == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    fn edit_logits(
        &self,
        logits: &mut CpuTensor,
        edits: &super::LogitEdits,
    ) -> Result<(), DeviceError> {
        for i in 0..edits.len() {
            let at = edits.row[i] as usize * logits.cols + edits.token[i] as usize;
            let e = crate::sampler::TokenEdit {
                token: edits.token[i],
                pos: edits.pos[i],
                neg: edits.neg[i],
                add: edits.add[i],
            };
            logits.data[at] = e.apply(logits.data[at]);
        }
        Ok(())
    }

    fn to_host(&self, t: &CpuTensor) -> Result<Vec<f32>, DeviceError> {
        Ok(t.data.clone())
    }

    fn random(
        &self,
        shape: &[usize],
        seed: u64,
        mean: f32,
        std: f32,
    ) -> Result<CpuTensor, DeviceError> {
        let (rows, cols) = super::matrix_dims(shape, "cpu", "random")?;
        let mut rng = crate::rng::Rng::new(seed);
        let data = (0..rows * cols)
            .map(|_| mean + std * rng.normal() as f32)
            .collect();
        Ok(CpuTensor { rows, cols, data })
    }

    // The fused operations of other devices: here, their composition.
    fn linear_delta(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
    ) -> Result<Self::Tensor, DeviceError> {
        self.linear(x, w)
    }

    fn norm_linear(
        &self,
        residual: &mut Self::Tensor,
        delta: Option<Delta<'_, Self::Tensor>>,
        norm: &Self::Tensor,
        eps: f32,
        w: &Self::Tensor,
    ) -> Result<Self::Tensor, DeviceError> {
        let x = self.norm(residual, delta, norm, eps)?;
        self.linear(&x, w)
    }

    fn norm_glu(
        &self,
        residual: &mut Self::Tensor,
        delta: Option<Delta<'_, Self::Tensor>>,
        norm: &Self::Tensor,
        eps: f32,
        gate_up: &Self::Tensor,
        act: Activation,
    ) -> Result<Self::Tensor, DeviceError> {
        let x = self.norm(residual, delta, norm, eps)?;
        let gu = self.linear(&x, gate_up)?;
        self.glu(&gu, act)
    }

    fn norm_moe(
        &self,
        residual: &mut Self::Tensor,
        delta: Option<Delta<'_, Self::Tensor>>,
        norm: &Self::Tensor,
        eps: f32,
        w: MoeWeights<'_, Self::Tensor>,
        p: &MoeParams,
    ) -> Result<Self::Tensor, DeviceError> {
        let x = self.norm(residual, delta, norm, eps)?;
        self.moe(&x, w, p)
    }

    fn upload_table(&self, t: &HostTensor) -> Result<Self::Tensor, DeviceError> {
        self.upload(t)
    }

    fn lm_head(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor, DeviceError> {
        self.linear(x, w)
    }

    /// The whole tensor made, read back and cut (CUDA's counter-based generator makes only
    /// the part).
    fn random_part(
        &self,
        shape: &[usize],
        part: &Part<'_>,
        seed: u64,
        mean: f32,
        std: f32,
    ) -> Result<Self::Tensor, DeviceError> {
        let whole = self.random(shape, seed, mean, std)?;
        let host = HostTensor::new(shape.to_vec(), self.to_host(&whole)?);
        self.upload(&part.cut(&host))
    }

    /// Tokens are picked on the host ([`crate::sampler`]).
    fn sample(
        &self,
        _logits: &Self::Tensor,
        _rows: &[RowSampling],
        _logprobs: &[i32],
    ) -> Result<Option<DeviceSample>, DeviceError> {
        Ok(None)
    }

    fn samples_on_device(&self) -> bool {
        false
    }
}

/// RMSNorm of each q head and each k head of a fused `[n, (h + 2·kvh)·d]` q|k|v tensor, in
/// place; v untouched (the q/k norm of Qwen3 and Gemma 3, before RoPE).
fn head_norm(qkv: &mut CpuTensor, n: HeadNorm<'_, CpuTensor>, p: &AttnParams) {
    let d = p.head_dim;
    let mut head = vec![0.0f32; d];
    for row in qkv.data.chunks_mut(qkv.cols) {
        for h in 0..p.num_heads + p.num_kv_heads {
            let w = if h < p.num_heads { n.q } else { n.k };
            let x = &mut row[h * d..(h + 1) * d];
            head.copy_from_slice(x);
            rms_norm_row(&head, &w.data, n.eps, x);
        }
    }
}

/// Rotates the q and k parts of `qkv` in place and writes k and v into the cache of `layer` at
/// the batch's slot mapping.
fn rope_and_cache(
    qkv: &mut CpuTensor,
    rope: &CpuTensor,
    kv: &mut CpuKv,
    layer: usize,
    b: &CpuBatch,
    p: &AttnParams,
) -> Result<(), DeviceError> {
    let d = p.head_dim;
    let half = d / 2;
    let max_pos = rope.rows;
    let heads_rotated = p.num_heads + p.num_kv_heads;
    let kv_dim = p.num_kv_heads * d;
    for (t, row) in qkv.data.chunks_mut(qkv.cols).enumerate() {
        let pos = b.batch.positions[t] as usize;
        if pos >= max_pos {
            return Err(DeviceError::Op {
                device: "cpu",
                op: "rope",
                msg: format!("position {pos} is beyond the model's {max_pos} positions"),
            });
        }
        let cos = &rope.data[pos * d..pos * d + half];
        let sin = &rope.data[pos * d + half..(pos + 1) * d];
        for h in 0..heads_rotated {
            let v = &mut row[h * d..(h + 1) * d];
            for i in 0..half {
                let (x1, x2) = (v[i], v[i + half]);
                v[i] = x1 * cos[i] - x2 * sin[i];
                v[i + half] = x2 * cos[i] + x1 * sin[i];
            }
        }
        let slot = b.batch.slot_mapping[t] as usize;
        let k_src = &row[p.num_heads * d..p.num_heads * d + kv_dim];
        let v_src = &row[p.num_heads * d + kv_dim..p.num_heads * d + 2 * kv_dim];
        kv.write(layer, slot, k_src, v_src);
    }
    Ok(())
}

impl super::Instruments for CpuDevice {
    fn time_all_reduce(&self, elems: usize, count: usize) -> Result<Option<f64>, DeviceError> {
        let Some(CpuRank { comm, rank, .. }) = &self.tp else {
            return Ok(None);
        };
        let mut v = vec![1.0f32; elems];
        comm.all_reduce_sum(*rank, &mut v)?; // every rank arrived: the clock starts together
        let t = std::time::Instant::now();
        for _ in 0..count {
            comm.all_reduce_sum(*rank, &mut v)?;
        }
        Ok(Some(t.elapsed().as_secs_f64()))
    }
}
