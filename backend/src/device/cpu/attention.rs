//! Paged causal attention on the CPU: each new token attends over its sequence's keys
//! `0..=position`, found through the block table. Exact softmax in f32 (max-subtracted); work is
//! split over (token, head) pairs.

use rayon::prelude::*;

use super::{CpuBatch, CpuKv, CpuTensor};
use crate::device::AttnParams;

pub fn paged_attention(
    qkv: &CpuTensor,
    kv: &CpuKv,
    layer: usize,
    b: &CpuBatch,
    p: &AttnParams,
) -> CpuTensor {
    let d = p.head_dim;
    let n = qkv.rows;
    let group = p.num_heads / p.num_kv_heads;
    let bs = kv.layout.block_size;
    let stride = p.num_kv_heads * d;
    let (kc, vc) = (&kv.k[layer], &kv.v[layer]);
    let mut out = vec![0.0f32; n * p.num_heads * d];
    out.par_chunks_mut(d)
        .enumerate()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (idx, o)| {
            let (t, h) = (idx / p.num_heads, idx % p.num_heads);
            let kvh = h / group;
            let seq = &b.batch.seqs[b.seq_of_token[t] as usize];
            let ctx = b.batch.positions[t] as usize + 1;
            let q = &qkv.data[t * qkv.cols + h * d..t * qkv.cols + (h + 1) * d];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in 0..ctx {
                let slot = seq.block_table[j / bs] as usize * bs + j % bs;
                let k = &kc[slot * stride + kvh * d..slot * stride + (kvh + 1) * d];
                let s = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * p.scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut denom = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                denom += *s;
            }
            o.fill(0.0);
            for (j, &w) in scores.iter().enumerate() {
                let slot = seq.block_table[j / bs] as usize * bs + j % bs;
                let v = &vc[slot * stride + kvh * d..slot * stride + (kvh + 1) * d];
                for (oi, vi) in o.iter_mut().zip(v) {
                    *oi += w * vi;
                }
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
