//! Launching a layer's attention: RoPE + the K/V write (`rope_kv.cu`, unless the attention does
//! it itself), the attention kernel the [`AttentionPlan`] chose, and the split combine.

use cudarc::driver::CudaFunction;

use super::attention_plan::{AttentionPlan, Capabilities, StepShape};
use super::batch::CudaBatch;
use super::kernels::{
    attention_smem_bytes, mma_fp8_dec_smem_bytes, mma_fp8_smem_bytes, mma_smem_bytes, ATT_MAXD,
};
use super::launch::{AttentionArgs, CombineArgs, LayerKv, QkNorm};
use super::tensor::{CudaKv, CudaTensor};
use super::CudaDevice;
use crate::device::{AttnLayer, AttnParams, KvCacheDtype};
use crate::error::DeviceError;

fn layer_kv(kv: &mut CudaKv, layer: usize) -> LayerKv<'_> {
    LayerKv {
        k: &mut kv.k[layer],
        v: &mut kv.v[layer],
        k_scale: &mut kv.k_scale[layer],
        v_scale: &mut kv.v_scale[layer],
        table: &kv.int8_table[layer],
    }
}

impl CudaDevice {
    /// The tensor-core attention kernel for head_dim `d` and the cache's dtype, with its shared
    /// memory, if there is one (else the CUDA-core kernel runs).
    fn mma_attention(&self, d: usize, dtype: KvCacheDtype) -> Option<(&CudaFunction, u32)> {
        use KvCacheDtype::*;
        let f = match (d, dtype) {
            (64, Auto) => &self.k.attention_mma_d64,
            (128, Auto) => &self.k.attention_mma_d128,
            (256, Auto) => &self.k.attention_mma_d256,
            (64, Fp8E4m3) => &self.k.attention_mma_d64_fp8,
            (128, Fp8E4m3) => &self.k.attention_mma_d128_fp8,
            (64, Int8) => &self.k.attention_mma_d64_int8,
            (128, Int8) => &self.k.attention_mma_d128_int8,
            _ => return None,
        };
        let smem = if dtype == Auto {
            mma_smem_bytes(d)
        } else {
            mma_fp8_smem_bytes(d)
        };
        Some((f, smem))
    }

    /// The transposed decode kernel (steps of at most 8 query rows a block: keys on the MMAs' 16
    /// rows, queries on their 8 columns) for head_dim `d` and the cache's dtype, with its shared
    /// memory, where it exists. Measured on the H200 against the 16-row kernel: FP8 and bf16
    /// decode steps 7–9% faster at batch 64 and 256 (BENCHMARKS-HISTORY.md).
    fn mma_decode_attention(&self, d: usize, dtype: KvCacheDtype) -> Option<(&CudaFunction, u32)> {
        let i = match d {
            64 => 0,
            128 => 1,
            _ => return None,
        };
        match dtype {
            KvCacheDtype::Fp8E4m3 => {
                Some((&self.k.attention_mma_fp8_dec[i], mma_fp8_dec_smem_bytes(d)))
            }
            KvCacheDtype::Auto => Some((&self.k.attention_mma_bf16_dec[i], mma_smem_bytes(d))),
            _ => None,
        }
    }

    /// The plan of an attention launch over batch `b`.
    pub(super) fn attention_plan(
        &self,
        b: &CudaBatch,
        p: &AttnParams,
        dtype: KvCacheDtype,
    ) -> Result<AttentionPlan, DeviceError> {
        AttentionPlan::choose(
            &StepShape {
                tile_lens: &b.tile_lens,
                max_ctx: b.max_ctx,
                num_heads: p.num_heads,
                num_kv_heads: p.num_kv_heads,
                head_dim: p.head_dim,
            },
            &Capabilities {
                sms: self.sms,
                tensor_cores: self.mma_attention(p.head_dim, dtype).is_some(),
                // The fused rope + cache write is not built for the INT8 cache.
                fused_rope: dtype != KvCacheDtype::Int8,
                split: self.options.split,
            },
        )
    }

    /// RoPE on the q and k heads of `qkv`, in place, and the K/V write into the cache of `layer`
    /// (rope_kv.cu): the step before the attention kernel, unless that kernel does it itself.
    fn rope_and_cache(
        &self,
        qkv: &mut CudaTensor,
        qk_norm: QkNorm<'_>,
        kv: &mut CudaKv,
        b: &CudaBatch,
        l: AttnLayer<'_, CudaTensor>,
    ) -> Result<(), DeviceError> {
        let AttnLayer { rope, layer, p, .. } = l;
        self.timed("rope+kv_write", || {
            if b.n == 0 {
                return Ok(());
            }
            let func = match kv.layout.dtype {
                KvCacheDtype::Auto => &self.k.rope_kv,
                KvCacheDtype::Fp8E4m3 => &self.k.rope_kv_fp8,
                KvCacheDtype::Int8 => &self.k.rope_kv_int8,
            };
            self.launch_rope_kv(
                func,
                qkv.bf16_mut("rope")?,
                (rope.f32("rope")?, &b.pos, &b.slots),
                layer_kv(kv, layer),
                (b.n, p.num_heads, p.num_kv_heads, p.head_dim),
                qk_norm,
            )
        })
    }

    /// [`crate::device::Device::attention`] on this device.
    pub(super) fn paged_attention(
        &self,
        qkv: &mut CudaTensor,
        kv: &mut CudaKv,
        b: &CudaBatch,
        l: AttnLayer<'_, CudaTensor>,
    ) -> Result<CudaTensor, DeviceError> {
        let AttnLayer {
            qk_norm,
            rope,
            layer,
            p,
        } = l;
        let dtype = kv.layout.dtype;
        let d = p.head_dim;
        if b.n == 0 {
            let out = self.alloc_bf16(0, "attention")?;
            return Ok(CudaTensor::new_bf16(0, p.num_heads * d, out));
        }
        let plan = self.attention_plan(b, p, dtype)?;
        let qk_norm = match qk_norm {
            Some(n) => Some((n.q.bf16("head norm")?, n.k.bf16("head norm")?, n.eps)),
            None => None,
        };
        if !plan.fused_rope {
            self.rope_and_cache(qkv, qk_norm, kv, b, l)?;
        }
        self.timed("attention", || {
            let mut out = self.alloc_bf16(b.n * p.num_heads * d, "attention")?;
            let rows = plan.part_rows();
            let split = plan.splits > 1;
            let mut part_o =
                self.alloc_f32(if split { rows * d } else { 1 }, "attention splits")?;
            let mut part_ml =
                self.alloc_f32(if split { rows * 2 } else { 1 }, "attention splits")?;
            let mma = self.mma_attention(d, dtype);
            // The tensor-core kernel takes a sequence's kv heads as consecutive blocks on the
            // grid's x (`fused` bit 1), so they read the same keys' rows — adjacent in the cache —
            // together; y holds at most 65,535 units.
            let heads_first = mma.is_some() && plan.units <= u16::MAX as usize;
            // A decode step with at most 8 query rows a block (a unit's rows are its tokens ×
            // the group) runs the transposed kernel of its cache, where there is one.
            let mma = match mma {
                Some(_) if plan.tensor_cores && b.longest_tile() * plan.group <= 8 => {
                    self.mma_decode_attention(d, dtype).or(mma)
                }
                _ => mma,
            };
            let (func, grid, shared) = match mma {
                Some((f, smem)) => (
                    f,
                    if heads_first {
                        (plan.grid_y, plan.units, plan.splits)
                    } else {
                        (plan.units, plan.grid_y, plan.splits)
                    },
                    smem,
                ),
                None => (
                    match (dtype, d > ATT_MAXD) {
                        (KvCacheDtype::Auto, false) => &self.k.attention,
                        (KvCacheDtype::Fp8E4m3, false) => &self.k.attention_fp8,
                        (KvCacheDtype::Int8, false) => &self.k.attention_int8,
                        (KvCacheDtype::Auto, true) => &self.k.attention_d256,
                        (KvCacheDtype::Fp8E4m3, true) => &self.k.attention_d256_fp8,
                        (KvCacheDtype::Int8, true) => &self.k.attention_d256_int8,
                    },
                    (b.num_tiles, p.num_heads, plan.splits),
                    attention_smem_bytes(d),
                ),
            };
            self.launch_attention(
                func,
                AttentionArgs {
                    qkv: qkv.bf16("attention")?,
                    kv: layer_kv(kv, layer),
                    pos: &b.pos,
                    tile_seq: &b.tile_seq,
                    tile_start: &b.tile_start,
                    tile_len: &b.tile_len,
                    block_tables: &b.block_tables,
                    max_blocks: b.max_blocks as i32,
                    out: &mut out,
                    part_o: &mut part_o,
                    part_ml: &mut part_ml,
                    num_heads: p.num_heads as i32,
                    num_kv_heads: p.num_kv_heads as i32,
                    head_dim: d as i32,
                    block_size: b.block_size as i32,
                    scale: p.scale,
                    split_len: plan.split_len as i32,
                    group: plan.group as i32,
                    sub_tokens: plan.sub_tokens as i32,
                    units_per_tile: plan.units_per_tile as i32,
                    rope: rope.f32("rope")?,
                    slots: &b.slots,
                    fused: plan.fused_rope as i32 | if heads_first { 2 } else { 0 },
                    window: p.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
                    qk_norm,
                },
                grid,
                plan.tensor_cores,
                shared,
            )?;
            if split {
                // Combine rows: token × group for the tensor-core kernel, token alone for the
                // CUDA-core one; outputs of the fullest unit: its tokens (at most sub_tokens, at
                // most the longest tile) × group × d.
                let group = if plan.tensor_cores { plan.group } else { 1 };
                let elems = plan.sub_tokens.min(b.longest_tile().max(1)) * group * d;
                self.launch_combine(
                    CombineArgs {
                        part_o: &part_o,
                        part_ml: &part_ml,
                        tile_start: &b.tile_start,
                        tile_len: &b.tile_len,
                        out: &mut out,
                        num_heads: p.num_heads as i32,
                        head_dim: d as i32,
                        splits: plan.splits as i32,
                        group: group as i32,
                        sub_tokens: plan.sub_tokens as i32,
                        units_per_tile: plan.units_per_tile as i32,
                        unit_rows: plan.unit_rows as i32,
                    },
                    (plan.units, plan.grid_y),
                    elems,
                )?;
            }
            Ok(CudaTensor::new_bf16(b.n, p.num_heads * d, out))
        })
    }
}
