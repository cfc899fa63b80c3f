//! How one attention launch is laid out: which kernel, how many query tokens a block serves,
//! and how long key ranges are split over blocks. A pure function of the step's shape and the
//! device's SM count ([`AttentionPlan::choose`]), so the split sizing is tested on the CPU.
//!
//! - The tensor-core kernel (`attention_mma.cu`, head_dim 64/128) serves a KV head with its whole
//!   GQA group as rows: a *unit* is `sub_tokens` tokens × group ≤ MMA_ROWS rows; the CUDA-core
//!   kernel (`attention.cu`) serves one q head per block over a whole query tile.
//! - Splits: when too few blocks have work (decode), each unit's key range is split over more
//!   blocks, merged afterwards by `attention_combine_bf16`. Decode-like steps (each sequence one
//!   unit) may fill `waves` waves of blocks; prompts, whose units attend over causal triangles,
//!   one. Each split is a multiple of `step` keys (whole ATT_TK tiles for the CUDA-core kernel).

use super::kernels::{
    ATT_MAXD, ATT_MAXD_WIDE, ATT_TK, ATT_TQ, MMA_BLOCKS_PER_SM, MMA_ROWS, SIMT_BLOCKS_PER_SM,
};
use super::options::SplitOptions;
use super::DEV;
use crate::error::DeviceError;

/// The shape of a step's attention, as the plan needs it.
#[derive(Debug, Clone, Copy)]
pub struct StepShape<'a> {
    /// Tokens of each query tile (ATT_TQ at most), in tile order.
    pub tile_lens: &'a [u32],
    /// Longest context any tile attends over.
    pub max_ctx: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// What the device offers a launch.
#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    /// Streaming multiprocessors.
    pub sms: usize,
    /// A tensor-core kernel exists for this head_dim and KV dtype (and is not switched off).
    pub tensor_cores: bool,
    /// The tensor-core kernel may rotate q/k and write K/V itself (not built for the INT8 cache).
    pub fused_rope: bool,
    pub split: SplitOptions,
}

/// One attention launch, decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionPlan {
    /// The tensor-core kernel (else the CUDA-core one).
    pub tensor_cores: bool,
    /// The attention rotates q/k and writes K/V itself (no rope_kv launch before it).
    pub fused_rope: bool,
    /// q heads per KV head.
    pub group: usize,
    /// Tokens one block serves.
    pub sub_tokens: usize,
    /// Blocks per query tile (as many as its longest tile needs).
    pub units_per_tile: usize,
    /// Work units: tiles × units per tile.
    pub units: usize,
    /// Second grid dimension: KV heads (tensor cores) or q heads.
    pub grid_y: usize,
    /// Rows a unit has in the split buffers.
    pub unit_rows: usize,
    /// Blocks each key range is split over (1: no combine).
    pub splits: usize,
    /// Keys per split.
    pub split_len: usize,
}

/// Tokens per block unit of the tensor-core attention: as many as fill its MMA_ROWS query rows
/// with a GQA group each, at most a tile.
pub fn mma_sub_tokens(group: usize) -> usize {
    (MMA_ROWS / group.max(1)).clamp(1, ATT_TQ)
}

/// Whether each sequence's new tokens form one attention unit of `sub_tokens` (decode and
/// verification steps, short chunks): no tile longer than a unit, and none a full ATT_TQ, so no
/// sequence was cut into several tiles.
pub fn one_unit_per_sequence(tile_lens: &[u32], sub_tokens: usize) -> bool {
    let longest = tile_lens.iter().copied().max().unwrap_or(0) as usize;
    longest <= sub_tokens && longest < ATT_TQ
}

impl AttentionPlan {
    /// The plan for `shape` on a device with `caps`.
    pub fn choose(shape: &StepShape<'_>, caps: &Capabilities) -> Result<Self, DeviceError> {
        let err = |msg: String| DeviceError::Op {
            device: DEV,
            op: "attention",
            msg,
        };
        let d = shape.head_dim;
        if d > ATT_MAXD_WIDE {
            return Err(err(format!("head_dim {d} > {ATT_MAXD_WIDE}")));
        }
        let group = shape.num_heads / shape.num_kv_heads.max(1);
        let mma = caps.tensor_cores;
        if mma && group > MMA_ROWS {
            return Err(err(format!("GQA group {group} > {MMA_ROWS}")));
        }
        let longest = shape.tile_lens.iter().copied().max().unwrap_or(0) as usize;
        let (sub_tokens, units_per_tile, grid_y, unit_rows) = if mma {
            // Units of `sub` tokens, as many per tile as its longest tile needs (one for a decode
            // step), so no block is launched only to find no tokens.
            let sub = mma_sub_tokens(group);
            (
                sub,
                longest.max(1).div_ceil(sub).max(1),
                shape.num_kv_heads,
                MMA_ROWS,
            )
        } else {
            (ATT_TQ, 1, shape.num_heads, ATT_TQ)
        };
        let units = shape.tile_lens.len() * units_per_tile;
        let decode_like = one_unit_per_sequence(shape.tile_lens, sub_tokens);
        // Blocks with work before splitting.
        let busy: usize = shape
            .tile_lens
            .iter()
            .map(|&l| (l as usize).div_ceil(sub_tokens))
            .sum::<usize>()
            * grid_y;
        // As many splits as fill `waves` waves of blocks when every unit is a sequence's whole
        // step (each attends over its full range); units of a longer prompt attend over causal
        // triangles and their partials cost a round trip: one wave (a 512-token prefill ran
        // 23 ms split three ways, 14 ms unsplit).
        // head_dim 256: one block per SM either way (its shared memory).
        let per_sm = if d > ATT_MAXD {
            1
        } else if mma {
            MMA_BLOCKS_PER_SM
        } else {
            SIMT_BLOCKS_PER_SM
        };
        let waves = if decode_like {
            caps.split.waves
        } else {
            caps.split.prompt_waves
        };
        // A decode-like step whose unsplit blocks already fill `fill_percent` of a wave streams
        // the cache as it is: splits would only add their partials and the merge. Measured for
        // the tensor-core kernels of head_dim ≤ 128 (several blocks an SM); head_dim 256 (one
        // block an SM) and the CUDA-core kernel keep the waves rule alone.
        let fills = decode_like
            && mma
            && d <= ATT_MAXD
            && caps.split.fill_percent > 0
            && busy * 100 >= caps.sms * per_sm * caps.split.fill_percent;
        let want = if fills {
            1
        } else {
            (caps.sms * per_sm * waves / busy.max(1)).max(1)
        };
        let max_splits = shape.max_ctx.div_ceil(caps.split.min_keys).max(1);
        let splits = want.clamp(1, max_splits.min(caps.split.max_splits));
        // The CUDA-core kernel needs whole key tiles per split; the tensor-core one masks any
        // range.
        let step = if mma { caps.split.step } else { ATT_TK };
        let split_len = shape.max_ctx.div_ceil(splits).div_ceil(step) * step;
        let splits = shape.max_ctx.div_ceil(split_len.max(1)).max(1);
        let fused_rope = caps.fused_rope
            && mma
            && !shape.tile_lens.is_empty()
            && one_unit_per_sequence(shape.tile_lens, mma_sub_tokens(group));
        Ok(AttentionPlan {
            tensor_cores: mma,
            fused_rope,
            group,
            sub_tokens,
            units_per_tile,
            units,
            grid_y,
            unit_rows,
            splits,
            split_len,
        })
    }

    /// Rows of the split buffers (1 when unsplit: a placeholder).
    pub fn part_rows(&self) -> usize {
        if self.splits > 1 {
            self.units * self.grid_y * self.splits * self.unit_rows
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H200: 132 SMs, the default split options, tensor cores, the 8B shape's attention
    /// (32 q heads, 8 KV heads, head_dim 128).
    fn h200() -> Capabilities {
        Capabilities {
            sms: 132,
            tensor_cores: true,
            fused_rope: true,
            split: SplitOptions::default(),
        }
    }

    fn plan(tile_lens: &[u32], max_ctx: usize, caps: &Capabilities) -> AttentionPlan {
        AttentionPlan::choose(
            &StepShape {
                tile_lens,
                max_ctx,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 128,
            },
            caps,
        )
        .unwrap()
    }

    #[test]
    fn batch_one_decode_fills_two_waves_with_whole_tile_splits() {
        // A graph replay in the 8192 bucket (ctx 4096 + 1 rounds up there): 8 units of work
        // want 2 · 396 / 8 = 99 splits, capped at 64 of 128 keys (BENCHMARKS §1).
        let p = plan(&[1], 8192, &h200());
        assert_eq!(
            (p.sub_tokens, p.units, p.grid_y, p.splits, p.split_len),
            (16, 1, 8, 64, 128)
        );
        assert!(p.fused_rope && p.tensor_cores);
        assert_eq!(p.part_rows(), 8 * 64 * 64);
        // Eagerly at ctx 512: at least 64 keys a split, so 8 splits.
        let p = plan(&[1], 512, &h200());
        assert_eq!((p.splits, p.split_len), (8, 64));
    }

    /// Gemma 3's head_dim 256 takes the tensor-core kernel, its splits sized for one resident
    /// block per SM: 132 · 2 waves / 8 KV heads = 33 splits at ctx 8192 (not 99, capped at 64).
    #[test]
    fn head_dim_256_decodes_on_tensor_cores_with_one_block_per_sm() {
        let shape = |max_ctx| StepShape {
            tile_lens: &[1],
            max_ctx,
            num_heads: 16,
            num_kv_heads: 8,
            head_dim: 256,
        };
        let p = AttentionPlan::choose(&shape(8192), &h200()).unwrap();
        assert!(p.tensor_cores && p.fused_rope);
        assert_eq!(p.grid_y, 8);
        let want = h200().sms * h200().split.waves / 8;
        assert_eq!(p.splits, 8192usize.div_ceil(p.split_len));
        assert!(
            p.splits <= want,
            "{} splits for {want} block slots",
            p.splits
        );
    }

    #[test]
    fn a_decode_batch_filling_half_a_wave_is_not_split() {
        // 32 sequences × 8 KV heads = 256 blocks of 396 slots: no splits (three before the
        // rule); 24 sequences (192 blocks, 48%) still take 4; with the rule off, 32 take 3.
        assert_eq!(plan(&[1; 32], 1280, &h200()).splits, 1);
        assert_eq!(plan(&[1; 32], 4096, &h200()).splits, 1);
        assert_eq!(plan(&[5; 32], 4096, &h200()).splits, 1);
        assert_eq!(plan(&[1; 24], 1280, &h200()).splits, 4);
        assert_eq!(plan(&[1; 16], 4096, &h200()).splits, 6);
        let mut caps = h200();
        caps.split.fill_percent = 0;
        assert_eq!(plan(&[1; 32], 1280, &caps).splits, 3);
        // A prompt's units are not decode-like: the rule leaves them to their one wave (8 tiles
        // of 32 tokens, 128 blocks: 3 splits either way).
        assert_eq!(plan(&[32; 8], 4096, &h200()).splits, 3);
        assert_eq!(plan(&[32; 8], 4096, &caps).splits, 3);
        // Nor does it touch the CUDA-core kernel (one q head a block): 32 × 32 blocks = 1,024 of
        // 264 slots is past two waves already, 8 × 32 = 256 still split as before.
        let mut simt = h200();
        simt.tensor_cores = false;
        let mut simt_off = simt;
        simt_off.split.fill_percent = 0;
        assert_eq!(plan(&[1; 8], 4096, &simt), plan(&[1; 8], 4096, &simt_off));
        assert!(plan(&[1; 8], 4096, &simt).splits > 1);
        // Nor head_dim 256 (one block an SM): 32 sequences × 8 KV heads keep their split.
        let d256 = |caps: &Capabilities| {
            let shape = StepShape {
                tile_lens: &[1; 32],
                max_ctx: 4096,
                num_heads: 16,
                num_kv_heads: 8,
                head_dim: 256,
            };
            AttentionPlan::choose(&shape, caps).unwrap()
        };
        assert_eq!(d256(&h200()), d256(&caps));
    }

    #[test]
    fn a_large_decode_batch_is_not_split() {
        // 256 sequences × 8 KV heads = 2048 units: more than five waves already.
        let p = plan(&[1; 256], 512, &h200());
        assert_eq!((p.splits, p.units), (1, 256));
        assert_eq!(p.part_rows(), 1);
    }

    #[test]
    fn prompts_fill_one_wave_and_do_not_fuse_the_rope() {
        // A 512-token prompt: 16 tiles of 32, two units each → 256 busy blocks of 396 slots.
        let p = plan(&[32; 16], 512, &h200());
        assert_eq!((p.units_per_tile, p.units, p.splits), (2, 32, 1));
        assert!(!p.fused_rope);
        // A 40-token chunk at a long context: two tiles (32 + 8) → 3 units × 8 heads = 24 busy,
        // one wave: 396 / 24 = 16 splits of 256 keys over 4096.
        let p = plan(&[32, 8], 4096, &h200());
        assert_eq!((p.splits, p.split_len), (16, 256));
        assert!(!p.fused_rope);
    }

    #[test]
    fn verification_steps_are_decode_like() {
        // Five tokens a sequence (one known + four drafts), one unit each: two waves.
        let p = plan(&[5, 5], 2048, &h200());
        assert_eq!(p.units, 2);
        assert!(p.fused_rope);
        assert_eq!((p.splits, p.split_len), (32, 64));
    }

    #[test]
    fn switches_change_the_plan() {
        let mut caps = h200();
        // The session-7 comparison `64,64,1,16`: one wave, splits rounded to 16 keys — 43
        // splits of 96 keys at ctx 4096 + 1 (whole 64-key tiles stayed the default).
        caps.split = SplitOptions {
            waves: 1,
            step: 16,
            ..Default::default()
        };
        let p = plan(&[1], 4097, &caps);
        assert_eq!((p.splits, p.split_len), (43, 96));
        caps.fused_rope = false;
        assert!(!plan(&[1], 512, &caps).fused_rope);
        // The CUDA-core kernel: one q head per block, whole 64-key tiles, two blocks per SM.
        caps = h200();
        caps.tensor_cores = false;
        let p = plan(&[1], 4096, &caps);
        assert_eq!((p.grid_y, p.sub_tokens, p.unit_rows), (32, ATT_TQ, ATT_TQ));
        assert_eq!((p.splits, p.split_len), (16, 256));
        assert!(!p.fused_rope);
    }

    #[test]
    fn shapes_the_kernels_cannot_take_are_refused() {
        let caps = h200();
        let e = AttentionPlan::choose(
            &StepShape {
                tile_lens: &[1],
                max_ctx: 64,
                num_heads: 8,
                num_kv_heads: 1,
                head_dim: 512,
            },
            &caps,
        )
        .unwrap_err();
        assert!(e.to_string().contains("head_dim 512"));
        let e = AttentionPlan::choose(
            &StepShape {
                tile_lens: &[1],
                max_ctx: 64,
                num_heads: 128,
                num_kv_heads: 1,
                head_dim: 64,
            },
            &caps,
        )
        .unwrap_err();
        assert!(e.to_string().contains("GQA group 128"));
    }
}
