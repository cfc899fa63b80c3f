//! Paged causal attention on the CPU: each new token attends over its sequence's keys
//! `0..=position` (the last `window` of them in a sliding-window layer), found through the block
//! table. Exact softmax in f32 (max-subtracted), the scores' dot products and the values' sums
//! through the GEMM's vector kernels (AVX2+FMA where the processor has them); work is split over
//! (token, head) pairs. An FP8 or INT8 cache is first dequantized, per sequence and KV
//! head, into dense rows (the values the GPU kernels compute with).

use rayon::prelude::*;

use super::{gemm, CpuBatch, CpuKv, CpuKvStore, CpuTensor};
use crate::device::{fp8, kv_int8, AttnParams, SeqInBatch};

/// Key and value rows of position `j` of a sequence, for one KV head.
trait Rows: Sync {
    fn k(&self, seq: usize, kvh: usize, j: usize) -> &[f32];
    fn v(&self, seq: usize, kvh: usize, j: usize) -> &[f32];
}

/// An f32 cache read in place through the block tables.
struct Paged<'a> {
    k: &'a [f32],
    v: &'a [f32],
    seqs: &'a [SeqInBatch],
    bs: usize,
    nkv: usize,
    d: usize,
}

impl Paged<'_> {
    fn at(&self, seq: usize, kvh: usize, j: usize) -> std::ops::Range<usize> {
        let s = &self.seqs[seq];
        let slot = s.block_table[j / self.bs] as usize * self.bs + j % self.bs;
        let o = (slot * self.nkv + kvh) * self.d;
        o..o + self.d
    }
}

impl Rows for Paged<'_> {
    fn k(&self, seq: usize, kvh: usize, j: usize) -> &[f32] {
        &self.k[self.at(seq, kvh, j)]
    }
    fn v(&self, seq: usize, kvh: usize, j: usize) -> &[f32] {
        &self.v[self.at(seq, kvh, j)]
    }
}

/// Dequantized rows: `[seq · nkv + kvh]` → `[context_len · d]` for K and for V.
struct Dense {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    nkv: usize,
    d: usize,
}

impl Rows for Dense {
    fn k(&self, seq: usize, kvh: usize, j: usize) -> &[f32] {
        &self.k[seq * self.nkv + kvh][j * self.d..(j + 1) * self.d]
    }
    fn v(&self, seq: usize, kvh: usize, j: usize) -> &[f32] {
        &self.v[seq * self.nkv + kvh][j * self.d..(j + 1) * self.d]
    }
}

pub fn paged_attention(
    qkv: &CpuTensor,
    kv: &CpuKv,
    layer: usize,
    b: &CpuBatch,
    p: &AttnParams,
) -> CpuTensor {
    let (d, nkv, bs) = (p.head_dim, p.num_kv_heads, kv.layout.block_size);
    let seqs = &b.batch.seqs;
    match &kv.store {
        CpuKvStore::F32 { k, v } => attend(
            qkv,
            b,
            p,
            &Paged {
                k: &k[layer],
                v: &v[layer],
                seqs,
                bs,
                nkv,
                d,
            },
        ),
        CpuKvStore::Fp8 {
            k,
            v,
            k_scale,
            v_scale,
        } => {
            let dense = |codes: &[u8], scales: &[f32]| {
                dense_rows(seqs, nkv, d, bs, |_, h, row| {
                    fp8::dequantize_head(&codes[h * d..(h + 1) * d], scales[h], row)
                })
            };
            let rows = Dense {
                k: dense(&k[layer], &k_scale[layer]),
                v: dense(&v[layer], &v_scale[layer]),
                nkv,
                d,
            };
            attend(qkv, b, p, &rows)
        }
        CpuKvStore::Int8 {
            k,
            v,
            k_aux,
            v_aux,
            heads,
        } => {
            let formats = &heads[layer];
            let dense = |codes: &[u8], aux: &[u32], which: usize| {
                dense_rows(seqs, nkv, d, bs, |kvh, h, row| {
                    let f = &formats[kvh][which];
                    kv_int8::dequantize_head(&codes[h * d..(h + 1) * d], aux[h], f, row)
                })
            };
            let rows = Dense {
                k: dense(&k[layer], &k_aux[layer], 0),
                v: dense(&v[layer], &v_aux[layer], 1),
                nkv,
                d,
            };
            attend(qkv, b, p, &rows)
        }
    }
}

/// Each sequence's rows for each KV head, dense: `[seq · nkv + kvh]` → `[context_len · d]`, row
/// `j` filled by `dequant(kvh, h, row)` from token-head `h` (its slot's, through the block table).
fn dense_rows(
    seqs: &[SeqInBatch],
    nkv: usize,
    d: usize,
    bs: usize,
    dequant: impl Fn(usize, usize, &mut [f32]) + Sync,
) -> Vec<Vec<f32>> {
    (0..seqs.len() * nkv)
        .into_par_iter()
        .map(|i| {
            let (s, kvh) = (&seqs[i / nkv], i % nkv);
            let mut out = vec![0f32; s.context_len * d];
            for (j, row) in out.chunks_mut(d).enumerate() {
                let slot = s.block_table[j / bs] as usize * bs + j % bs;
                dequant(kvh, slot * nkv + kvh, row);
            }
            out
        })
        .collect()
}

fn attend(qkv: &CpuTensor, b: &CpuBatch, p: &AttnParams, rows: &impl Rows) -> CpuTensor {
    let d = p.head_dim;
    let n = qkv.rows;
    let group = p.num_heads / p.num_kv_heads;
    let mut out = vec![0.0f32; n * p.num_heads * d];
    let fused = gemm::fma_available();
    out.par_chunks_mut(d)
        .enumerate()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (idx, o)| {
            let (t, h) = (idx / p.num_heads, idx % p.num_heads);
            let kvh = h / group;
            let seq = b.seq_of_token[t] as usize;
            let ctx = b.batch.positions[t] as usize + 1;
            // A sliding window keeps the keys `ctx - window .. ctx` (HF: k > q - window).
            let first = p.window.map_or(0, |w| ctx.saturating_sub(w));
            let q = &qkv.data[t * qkv.cols + h * d..t * qkv.cols + (h + 1) * d];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in first..ctx {
                let k = rows.k(seq, kvh, j);
                let s = gemm::dot_rt(fused, q, k) * p.scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut denom = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                denom += *s;
            }
            o.fill(0.0);
            for (j, &w) in (first..ctx).zip(scores.iter()) {
                gemm::axpy_rt(fused, w, rows.v(seq, kvh, j), o);
            }
            let inv = 1.0 / denom;
            o.iter_mut().for_each(|x| *x *= inv);
        });
    CpuTensor {
        rows: n,
        cols: p.num_heads * d,
        data: out,
    }
}
