//! FP8 e4m3 (the `e4m3fn` variant: no infinities, one NaN code per sign, largest finite 448) for
//! the KV cache, with one scale per token and KV head.
//!
//! A head's `d` values are stored as `round(x · 448 / amax)` in e4m3 and its scale `amax / 448`
//! in f32, so each token-head uses its whole range whatever its magnitude. Encoding rounds to the
//! nearest even code and saturates at ±448. The CUDA kernels (`common.cuh`) use the same
//! arithmetic; `tests/tests/kv_fp8.rs` holds both ends against `ml_dtypes.float8_e4m3fn`.

/// Largest finite e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;

/// Bytes one token-head takes in an FP8 cache: `d` codes plus its f32 scale.
pub const fn fp8_head_bytes(head_dim: usize) -> usize {
    head_dim + 4
}

/// f32 → e4m3fn, rounding to nearest even, saturating at ±448; NaN → 0x7f.
pub fn encode_e4m3(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    let q = if a.is_nan() {
        0x7f
    } else if a >= E4M3_MAX {
        0x7e
    } else if a < 0.015625 {
        // Subnormal range (below 2^-6): multiples of 2^-9; 8 · 2^-9 rounds up to the smallest
        // normal, whose code is also 8.
        (a * 512.0).round_ties_even() as u32
    } else {
        let b = a.to_bits();
        let mut q = (((b >> 23) - 120) << 3) | ((b >> 20) & 7);
        let rem = b & 0xf_ffff;
        if rem > 0x8_0000 || (rem == 0x8_0000 && q & 1 == 1) {
            q += 1; // a mantissa carry moves into the exponent, as it should
        }
        q.min(0x7e)
    };
    sign | q as u8
}

/// e4m3fn → f32 (the NaN codes 0x7f / 0xff are never written; they decode as ±480).
pub fn decode_e4m3(c: u8) -> f32 {
    let em = (c & 0x7f) as u32;
    let f = if em >= 8 {
        f32::from_bits((em << 20) + (120 << 23))
    } else {
        em as f32 * (1.0 / 512.0)
    };
    if c & 0x80 != 0 {
        -f
    } else {
        f
    }
}

/// Quantizes one token-head: codes into `out` (same length as `x`), returns its scale.
pub fn quantize_head(x: &[f32], out: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let inv = if amax > 0.0 { E4M3_MAX / amax } else { 0.0 };
    for (o, &v) in out.iter_mut().zip(x) {
        *o = encode_e4m3(v * inv);
    }
    amax / E4M3_MAX
}

/// Quantizes one row of projection weights in place of `codes`, returns its scale: `scale =
/// amax / 448` and `code = e4m3(x / scale)` — per-channel FP8 as torch and compressed-tensors
/// compute it (a division, where [`quantize_head`] multiplies by the inverse).
pub fn quantize_row(x: &[f32], codes: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = amax / E4M3_MAX;
    for (o, &v) in codes.iter_mut().zip(x) {
        *o = if scale > 0.0 {
            encode_e4m3(v / scale)
        } else {
            0
        };
    }
    scale
}

/// Dequantizes one token-head into `out`.
pub fn dequantize_head(codes: &[u8], scale: f32, out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = decode_e4m3(c) * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_code_round_trips() {
        for c in 0u8..=255 {
            if c & 0x7f == 0x7f {
                continue;
            }
            let x = decode_e4m3(c);
            // -0.0 encodes back to 0x80, +0.0 to 0x00.
            assert_eq!(encode_e4m3(x), c, "code {c:#04x} decodes to {x}");
        }
    }

    #[test]
    fn rounds_half_to_even_and_saturates() {
        // 1.0 = 0x38, next 1.125 = 0x39: 1.0625 is the halfway point, ties go to even (0x38).
        assert_eq!(encode_e4m3(1.0625), 0x38);
        assert_eq!(encode_e4m3(1.0626), 0x39);
        // 1.1875 halfway between 0x39 and 0x3a (1.25): even is 0x3a.
        assert_eq!(encode_e4m3(1.1875), 0x3a);
        assert_eq!(encode_e4m3(1e9), 0x7e);
        assert_eq!(encode_e4m3(-1e9), 0xfe);
        assert_eq!(decode_e4m3(0x7e), 448.0);
        // Smallest subnormal 2^-9; half of it ties to zero.
        assert_eq!(decode_e4m3(0x01), 1.0 / 512.0);
        assert_eq!(encode_e4m3(1.0 / 1024.0), 0);
        assert_eq!(encode_e4m3(3.0 / 1024.0), 0x02);
    }

    #[test]
    fn a_head_keeps_its_largest_value_and_small_relative_error() {
        let x: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let mut q = vec![0u8; 64];
        let s = quantize_head(&x, &mut q);
        let mut y = vec![0f32; 64];
        dequantize_head(&q, s, &mut y);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, b) in x.iter().zip(&y) {
            // e4m3 has 3 mantissa bits: relative step 2^-3, error at most half of it (plus the
            // subnormal floor).
            assert!(
                (a - b).abs() <= a.abs() / 16.0 + amax / 448.0 / 512.0 + 1e-7,
                "{a} vs {b}"
            );
        }
        let zeros = [0f32; 8];
        let mut qz = [1u8; 8];
        assert_eq!(quantize_head(&zeros, &mut qz), 0.0);
        assert_eq!(qz, [0u8; 8]);
    }
}
