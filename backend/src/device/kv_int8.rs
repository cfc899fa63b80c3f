//! The INT8 KV cache (`--kv-cache-dtype int8`): the seed's format — INT8 codes with a static
//! scale per (layer, KV head, channel) found by a calibration pass at load, and each head's
//! [`OUTLIERS`] channels of largest magnitude kept in bf16. It takes FP8's bytes (`d + 4` per
//! token-head) and, measured on four real models (BENCHMARKS §4), stays closer to the
//! unquantized cache than FP8 does.
//!
//! Layout, per token-head (the same allocation as the FP8 cache): `d` code bytes and a 4-byte
//! aux word (where FP8 keeps its f32 scale). A normal channel `c` holds
//! `clamp(round(x / scale[c]), -127, 127)` as an `i8`. Outlier `i` (channel `o_i`) holds its value
//! rounded to bf16, split in two: the high byte in the code slot of `o_i`, the low byte in byte
//! `i` of the aux word. Scales are [`HEADROOM`] × the calibration's bound / 127 (values past
//! that saturate) — V's bound a channel's largest magnitude, K's the largest norm of its RoPE
//! pair ([`fold_pair_amax`]); the outliers are the channels with the largest bounds, per layer,
//! KV head and K or V.
//! The CUDA kernels (`rope_kv.cu`, `attention.cu`) use the same arithmetic.

use half::bf16;

/// Channels of each head (per layer, KV head, K and V) kept in bf16.
pub const OUTLIERS: usize = 4;

/// A channel's range is its calibration bound times this: text the calibration never saw goes
/// past the bounds (SmolLM2 on `bench kv-fp8`'s prompts: V up to 2.0×, K 1.4×), and a saturated
/// value costs far more than the bit given up. Emulated on SmolLM2 at 4,096 tokens of those
/// prompts: KL 1.2e-2 with no headroom (FP8: 1.7e-3), 1.9e-4 with 1.5×, 1.2e-4 with 2×; on
/// 4,096 tokens of this repository's docs 8.1e-4 / 1.3e-3 at 1× / 2× (FP8: 1.0e-2).
pub const HEADROOM: f32 = 2.0;

/// Bytes one token-head takes: `d` codes plus the aux word of the outliers' low bytes.
pub const fn int8_head_bytes(head_dim: usize) -> usize {
    head_dim + 4
}

/// Text the cache's scales are calibrated on at load: prose, chat turns, code of several
/// languages, JSON and numbers, so the channels see the magnitudes serving does. It is none of
/// the texts the fidelity measurements are taken on.
pub const CALIBRATION_TEXT: &str = include_str!("kv_int8_calibration.txt");

/// Most calibration tokens run (one prefill).
pub const CALIBRATION_MAX_TOKENS: usize = 2048;

/// [`CALIBRATION_TEXT`] in the model's tokenizer (its markup as plain text).
pub fn calibration_tokens(
    tokenizer: &crate::tokenizer::TextTokenizer,
) -> Result<Vec<u32>, crate::error::EngineError> {
    tokenizer.encode_plain(CALIBRATION_TEXT)
}

/// Calibration tokens for a model with random weights and no tokenizer (`--load-format dummy`
/// in the benchmarks): the text's bytes as token ids. Random weights give the scales no meaning
/// either way; the cache's speed does not depend on them.
pub fn dummy_calibration_tokens(vocab: usize) -> Vec<u32> {
    CALIBRATION_TEXT
        .bytes()
        .take(CALIBRATION_MAX_TOKENS)
        .map(|b| b as u32 % vocab.max(1) as u32)
        .collect()
}

/// The static part of the format for every layer: per layer, `[2 (K, V)][kv heads][d]` scales
/// (0 at an outlier channel) then `[2][kv heads][OUTLIERS]` outlier channels (as f32: small
/// integers, exact), in one f32 buffer — what the CUDA kernels read as the layer's table.
#[derive(Debug, Clone, PartialEq)]
pub struct KvInt8Table {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub data: Vec<f32>,
}

/// Calibration maxima a table cannot be made from.
#[derive(Debug, thiserror::Error)]
pub enum BadCalibration {
    #[error("the int8 KV cache needs head_dim ≥ {OUTLIERS} (got {0})")]
    HeadDim(usize),
    #[error("layer {layer}: {got} calibration maxima for {heads} heads of {head_dim}")]
    Maxima {
        layer: usize,
        got: usize,
        heads: usize,
        head_dim: usize,
    },
}

impl KvInt8Table {
    /// f32 values one layer's table takes.
    pub fn layer_len(num_kv_heads: usize, head_dim: usize) -> usize {
        2 * num_kv_heads * (head_dim + OUTLIERS)
    }

    /// The table from calibration maxima: `amax[layer][which][kvh * d + c]`, `which` 0 for K and
    /// 1 for V. Each head's `OUTLIERS` largest channels (ties to the lower channel) are kept in
    /// bf16; the others get `HEADROOM · amax / 127` (a channel never seen non-zero gets the
    /// head's smallest non-zero scale, or 1e-6, so a value there still encodes).
    pub fn from_amax(
        amax: &[[Vec<f32>; 2]],
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self, BadCalibration> {
        let d = head_dim;
        if d < OUTLIERS {
            return Err(BadCalibration::HeadDim(d));
        }
        let per = Self::layer_len(num_kv_heads, d);
        let mut data = vec![0f32; amax.len() * per];
        for (l, layer) in amax.iter().enumerate() {
            let t = &mut data[l * per..(l + 1) * per];
            let (scales, outliers) = t.split_at_mut(2 * num_kv_heads * d);
            for (w, a) in layer.iter().enumerate() {
                if a.len() != num_kv_heads * d {
                    return Err(BadCalibration::Maxima {
                        layer: l,
                        got: a.len(),
                        heads: num_kv_heads,
                        head_dim: d,
                    });
                }
                for h in 0..num_kv_heads {
                    let head = &a[h * d..(h + 1) * d];
                    let mut order: Vec<usize> = (0..d).collect();
                    order.sort_by(|&x, &y| head[y].total_cmp(&head[x]).then(x.cmp(&y)));
                    let out = &order[..OUTLIERS];
                    let floor = head
                        .iter()
                        .copied()
                        .filter(|&v| v > 0.0)
                        .fold(f32::INFINITY, f32::min);
                    let floor = if floor.is_finite() {
                        floor
                    } else {
                        1e-6 * 127.0
                    };
                    let s = &mut scales[(w * num_kv_heads + h) * d..(w * num_kv_heads + h + 1) * d];
                    for (c, sc) in s.iter_mut().enumerate() {
                        *sc = if out.contains(&c) {
                            0.0
                        } else if head[c] > 0.0 {
                            HEADROOM * head[c] / 127.0
                        } else {
                            HEADROOM * floor / 127.0
                        };
                    }
                    let o = &mut outliers
                        [(w * num_kv_heads + h) * OUTLIERS..(w * num_kv_heads + h + 1) * OUTLIERS];
                    let mut sorted = out.to_vec();
                    sorted.sort_unstable();
                    for (dst, &c) in o.iter_mut().zip(&sorted) {
                        *dst = c as f32;
                    }
                }
            }
        }
        Ok(KvInt8Table {
            num_layers: amax.len(),
            num_kv_heads,
            head_dim: d,
            data,
        })
    }

    /// One layer's table (what a kernel is given).
    pub fn layer(&self, layer: usize) -> &[f32] {
        let per = Self::layer_len(self.num_kv_heads, self.head_dim);
        &self.data[layer * per..(layer + 1) * per]
    }

    /// The scales and outlier channels of (`layer`, K (`which` 0) or V (1), KV head `h`).
    pub fn head(&self, layer: usize, which: usize, h: usize) -> HeadFormat {
        let (nkv, d) = (self.num_kv_heads, self.head_dim);
        let t = self.layer(layer);
        let i = which * nkv + h;
        let mut outliers = [0usize; OUTLIERS];
        for (o, &c) in outliers
            .iter_mut()
            .zip(&t[2 * nkv * d + i * OUTLIERS..2 * nkv * d + (i + 1) * OUTLIERS])
        {
            *o = c as usize;
        }
        HeadFormat {
            scales: t[i * d..(i + 1) * d].to_vec(),
            outliers,
        }
    }
}

/// What [`super::Device::alloc_kv`] is given for `layout`: an INT8 cache needs its table, of the
/// cache's shape; any other takes none.
pub fn check_table<'a>(
    device: &'static str,
    layout: &super::KvLayout,
    table: Option<&'a KvInt8Table>,
) -> Result<Option<&'a KvInt8Table>, crate::error::DeviceError> {
    let bad = |msg: &str| crate::error::DeviceError::Op {
        device,
        op: "alloc_kv",
        msg: msg.into(),
    };
    match (layout.dtype, table) {
        (super::KvCacheDtype::Int8, None) => {
            Err(bad("an int8 KV cache needs its calibrated table"))
        }
        (super::KvCacheDtype::Int8, Some(t))
            if (t.num_layers, t.num_kv_heads, t.head_dim)
                != (layout.num_layers, layout.num_kv_heads, layout.head_dim) =>
        {
            Err(bad("the int8 table's shape is not the cache's"))
        }
        (super::KvCacheDtype::Int8, t) => Ok(t),
        (_, Some(_)) => Err(bad("an int8 table for a cache that is not int8")),
        (_, None) => Ok(None),
    }
}

/// One head's static format: a scale per channel (0 at the outliers) and the outlier channels,
/// in ascending order.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadFormat {
    pub scales: Vec<f32>,
    pub outliers: [usize; OUTLIERS],
}

/// `x` / `scale` rounded to the nearest integer (ties to even, as the kernels' `rintf`),
/// saturated to ±127.
pub fn encode_i8(x: f32, scale: f32) -> u8 {
    let q = if scale > 0.0 {
        (x / scale).round_ties_even().clamp(-127.0, 127.0)
    } else {
        0.0
    };
    q as i8 as u8
}

/// Quantizes one token-head `x` into `codes` (same length) and returns its aux word.
pub fn quantize_head(x: &[f32], f: &HeadFormat, codes: &mut [u8]) -> u32 {
    for ((o, &v), &s) in codes.iter_mut().zip(x).zip(&f.scales) {
        *o = encode_i8(v, s);
    }
    let mut aux = 0u32;
    for (i, &c) in f.outliers.iter().enumerate() {
        let b = bf16::from_f32(x[c]).to_bits();
        codes[c] = (b >> 8) as u8;
        aux |= ((b & 0xff) as u32) << (8 * i);
    }
    aux
}

/// Dequantizes one token-head into `out`.
pub fn dequantize_head(codes: &[u8], aux: u32, f: &HeadFormat, out: &mut [f32]) {
    for ((o, &c), &s) in out.iter_mut().zip(codes).zip(&f.scales) {
        *o = c as i8 as f32 * s;
    }
    for (i, &c) in f.outliers.iter().enumerate() {
        let bits = ((codes[c] as u32) << 24) | (((aux >> (8 * i)) & 0xff) << 16);
        out[c] = f32::from_bits(bits);
    }
}

/// K's per-channel bound from `rows` (`[n, kv heads · d]`, after RoPE), folded into `amax`:
/// for both channels of each rotated pair (`i`, `i + d/2`) the largest norm of the pair. RoPE
/// turns a pair by its position's angle and keeps its norm, so the bound holds at every
/// position — a channel's own largest value over the calibration text's positions does not
/// (a slowly turning pair seen only at small angles puts nearly all of its norm in one channel
/// there, and later positions move it into the other, past a scale fitted to the first view).
pub fn fold_pair_amax(amax: &mut [f32], rows: &[f32], head_dim: usize) {
    let half = head_dim / 2;
    if amax.is_empty() || half == 0 {
        return;
    }
    for r in rows.chunks(amax.len()) {
        for (a, x) in amax.chunks_mut(head_dim).zip(r.chunks(head_dim)) {
            for i in 0..half {
                let n = x[i].hypot(x[i + half]);
                a[i] = a[i].max(n);
                a[i + half] = a[i + half].max(n);
            }
        }
    }
}

/// Per-channel largest magnitudes of `rows` (`[n, kv heads · d]`), folded into `amax` (V's).
pub fn fold_amax(amax: &mut [f32], rows: &[f32]) {
    if amax.is_empty() {
        return;
    }
    for r in rows.chunks(amax.len()) {
        for (a, &v) in amax.iter_mut().zip(r) {
            *a = a.max(v.abs());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(amax_k: Vec<f32>, amax_v: Vec<f32>, nkv: usize, d: usize) -> KvInt8Table {
        KvInt8Table::from_amax(&[[amax_k, amax_v]], nkv, d).unwrap()
    }

    #[test]
    fn the_largest_channels_are_the_outliers_and_the_rest_get_their_bound_over_127() {
        let d = 8;
        let k = vec![1.0, 9.0, 2.0, 7.0, 0.5, 8.0, 6.0, 3.0];
        let v = vec![0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 4.0];
        let t = table(k, v, 1, d);
        let hk = t.head(0, 0, 0);
        assert_eq!(hk.outliers, [1, 3, 5, 6]);
        assert_eq!(hk.scales[0], HEADROOM / 127.0);
        assert_eq!(hk.scales[1], 0.0);
        assert_eq!(hk.scales[7], HEADROOM * 3.0 / 127.0);
        // Ties go to the lower channel; a channel never seen gets the smallest scale.
        let hv = t.head(0, 1, 0);
        assert_eq!(hv.outliers, [1, 2, 6, 7]);
        assert_eq!(hv.scales[0], HEADROOM / 127.0);
        assert!(
            KvInt8Table::from_amax(&[[vec![1.0; 3], vec![1.0; 3]]], 1, 3)
                .unwrap_err()
                .to_string()
                .contains("head_dim")
        );
    }

    #[test]
    fn a_head_round_trips_within_half_a_step_and_its_outliers_as_bf16() {
        let d = 16;
        let amax: Vec<f32> = (0..d)
            .map(|c| if c == 3 || c == 11 { 40.0 } else { 2.0 })
            .collect();
        let t = table(amax.clone(), amax, 1, d);
        let f = t.head(0, 0, 0);
        let x: Vec<f32> = (0..d)
            .map(|c| match c {
                3 => 37.123_45,
                11 => -39.9,
                _ => ((c as f32) * 0.7).sin() * 1.9,
            })
            .collect();
        let mut codes = vec![0u8; d];
        let aux = quantize_head(&x, &f, &mut codes);
        let mut y = vec![0f32; d];
        dequantize_head(&codes, aux, &f, &mut y);
        for c in 0..d {
            if f.outliers.contains(&c) {
                assert_eq!(y[c], bf16::from_f32(x[c]).to_f32(), "outlier {c}");
            } else {
                assert!(
                    (x[c] - y[c]).abs() <= f.scales[c] / 2.0 + 1e-7,
                    "{c}: {} vs {}",
                    x[c],
                    y[c]
                );
            }
        }
        // Channels 3 and 11 and the lowest two of the ties are kept in bf16; past its range a
        // normal channel saturates at ±127 steps.
        assert_eq!(f.outliers, [0, 1, 3, 11]);
        let mut big = x.clone();
        big[5] = 100.0;
        big[6] = -100.0;
        quantize_head(&big, &f, &mut codes);
        assert_eq!((codes[5] as i8, codes[6] as i8), (127, -127));
        assert_eq!(encode_i8(-1e9, 1.0) as i8, -127);
        assert_eq!(encode_i8(2.5, 1.0) as i8, 2, "ties to even");
    }

    #[test]
    fn k_bounds_hold_for_every_rotation_of_a_pair() {
        // One head of d = 4: pairs (0, 2) and (1, 3).
        let mut a = vec![0f32; 4];
        fold_pair_amax(&mut a, &[3.0, 0.5, 4.0, 0.0, -1.0, 1.0, 0.0, 0.0], 4);
        assert_eq!(a, vec![5.0, 1.0, 5.0, 1.0]);
        // The per-channel maxima of the same rows would put channel 0 at 3: a rotation of the
        // (3, 4) pair to (5, 0) saturates there and not under the pair's bound.
        let mut b = vec![0f32; 4];
        fold_amax(&mut b, &[3.0, 0.5, 4.0, 0.0, -1.0, 1.0, 0.0, 0.0]);
        assert_eq!(b, vec![3.0, 1.0, 4.0, 0.0]);
    }

    #[test]
    fn only_an_int8_cache_takes_a_table_and_only_of_its_shape() {
        use crate::device::{KvCacheDtype, KvLayout};
        let layout = |dtype| KvLayout {
            num_layers: 1,
            num_blocks: 2,
            block_size: 16,
            num_kv_heads: 1,
            head_dim: 8,
            dtype,
        };
        let t = table(vec![1.0; 8], vec![1.0; 8], 1, 8);
        let wide = table(vec![1.0; 16], vec![1.0; 16], 1, 16);
        let err = |l, t| check_table("cpu", &l, t).unwrap_err().to_string();
        assert!(check_table("cpu", &layout(KvCacheDtype::Int8), Some(&t)).is_ok());
        assert!(err(layout(KvCacheDtype::Int8), None).contains("needs its calibrated table"));
        assert!(err(layout(KvCacheDtype::Int8), Some(&wide)).contains("shape"));
        assert!(err(layout(KvCacheDtype::Fp8E4m3), Some(&t)).contains("not int8"));
        assert!(check_table("cpu", &layout(KvCacheDtype::Auto), None).is_ok());
    }

    #[test]
    fn amax_folds_over_rows() {
        let mut a = vec![0f32; 3];
        fold_amax(&mut a, &[1.0, -5.0, 2.0, -3.0, 4.0, 0.5]);
        assert_eq!(a, vec![3.0, 5.0, 2.0]);
    }
}
