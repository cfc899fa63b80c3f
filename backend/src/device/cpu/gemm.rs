//! f32 matrix product `x · wᵀ` for the CPU device.
//!
//! Work is split over output columns (rows of `w`) across rayon's threads; inside a task, four
//! tokens share each loaded row of `w`, with eight independent accumulators per dot product so the
//! compiler emits vector FMAs. An AVX2+FMA build of the same code is chosen at run time when the
//! processor has it; results differ from the portable build only by rounding.
//!
//! Invariant: every kernel here reduces a dot product in the same order, so a token's output is
//! bitwise the same whatever batch it is in (the engine's equivalence tests rely on it).

use rayon::prelude::*;

/// Rows of `w` one task computes.
const COLS_PER_TASK: usize = 32;
const LANES: usize = 8;

/// `out[n, m] = x[n, k] · w[m, k]ᵀ`
pub fn matmul_t(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    assert_eq!(x.len(), n * k);
    assert_eq!(w.len(), m * k);
    if n == 1 {
        // Decode: one token, so each output is contiguous in `w`'s row order; no tiles to gather.
        let mut out = vec![0.0f32; m];
        out.par_chunks_mut(COLS_PER_TASK * 4)
            .enumerate()
            .for_each(|(b, o)| {
                let c0 = b * COLS_PER_TASK * 4;
                block(x, &w[c0 * k..(c0 + o.len()) * k], 1, k, o.len(), o);
            });
        return out;
    }
    let blocks: Vec<(usize, Vec<f32>)> = (0..m.div_ceil(COLS_PER_TASK))
        .into_par_iter()
        .map(|b| {
            let c0 = b * COLS_PER_TASK;
            let c1 = (c0 + COLS_PER_TASK).min(m);
            let mut tile = vec![0.0f32; n * (c1 - c0)];
            block(x, &w[c0 * k..c1 * k], n, k, c1 - c0, &mut tile);
            (c0, tile)
        })
        .collect();
    let mut out = vec![0.0f32; n * m];
    for (c0, tile) in blocks {
        let w_cols = tile.len() / n.max(1);
        for t in 0..n {
            out[t * m + c0..t * m + c0 + w_cols]
                .copy_from_slice(&tile[t * w_cols..(t + 1) * w_cols]);
        }
    }
    out
}

/// Whether the AVX2+FMA builds of these kernels run on this processor.
pub(super) fn fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn block(x: &[f32], w: &[f32], n: usize, k: usize, cols: usize, tile: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if fma_available() {
            // SAFETY: the processor supports AVX2 and FMA, checked just above.
            unsafe { block_avx2(x, w, n, k, cols, tile) };
            return;
        }
    }
    block_portable::<false>(x, w, n, k, cols, tile);
}

/// `a · b` in [`dot`]'s order (LANES independent sums, so it vectorises; a running scalar sum
/// waits on every add), fused where `fused` (from [`fma_available`]): attention's scores.
pub(super) fn dot_rt(fused: bool, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if fused {
        // SAFETY: `fused` comes from fma_available().
        return unsafe { dot_avx2(a, b) };
    }
    let _ = fused;
    dot::<false>(a, b)
}

/// `y += s · x` element-wise, fused where `fused` (from [`fma_available`]): attention's
/// weighted sum of values.
pub(super) fn axpy_rt(fused: bool, s: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if fused {
        // SAFETY: `fused` comes from fma_available().
        unsafe { axpy_avx2(s, x, y) };
        return;
    }
    let _ = fused;
    axpy::<false>(s, x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot::<true>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(s: f32, x: &[f32], y: &mut [f32]) {
    axpy::<true>(s, x, y)
}

#[inline(always)]
fn axpy<const FUSED: bool>(s: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = fma::<FUSED>(s, xi, *yi);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(x: &[f32], w: &[f32], n: usize, k: usize, cols: usize, tile: &mut [f32]) {
    block_portable::<true>(x, w, n, k, cols, tile)
}

/// The 2×4 micro-kernel with explicit AVX2 vectors: 8 accumulators, 6 loads per 8 FMAs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot2x4_avx2(w0: &[f32], w1: &[f32], xs: [&[f32]; 4]) -> [[f32; 4]; 2] {
    use std::arch::x86_64::*;
    let k = w0.len();
    assert!(w1.len() == k && xs.iter().all(|x| x.len() == k));
    let body = k / 8 * 8;
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= body <= k, and every slice has length k (asserted above).
        unsafe {
            let a0 = _mm256_loadu_ps(w0.as_ptr().add(i));
            let a1 = _mm256_loadu_ps(w1.as_ptr().add(i));
            for r in 0..4 {
                let b = _mm256_loadu_ps(xs[r].as_ptr().add(i));
                acc[r] = _mm256_fmadd_ps(a0, b, acc[r]);
                acc[4 + r] = _mm256_fmadd_ps(a1, b, acc[4 + r]);
            }
        }
        i += 8;
    }
    let mut out = [[0.0f32; 4]; 2];
    for c in 0..2 {
        let w = if c == 0 { w0 } else { w1 };
        for r in 0..4 {
            let mut lanes = [0.0f32; 8];
            // SAFETY: `lanes` holds 8 f32.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[c * 4 + r]) };
            let mut s = lanes.iter().sum::<f32>();
            for j in body..k {
                s = w[j].mul_add(xs[r][j], s);
            }
            out[c][r] = s;
        }
    }
    out
}

#[inline(always)]
fn block_portable<const FUSED: bool>(
    x: &[f32],
    w: &[f32],
    n: usize,
    k: usize,
    cols: usize,
    tile: &mut [f32],
) {
    let mut t = 0;
    while t + 4 <= n {
        let xs = [
            &x[t * k..(t + 1) * k],
            &x[(t + 1) * k..(t + 2) * k],
            &x[(t + 2) * k..(t + 3) * k],
            &x[(t + 3) * k..(t + 4) * k],
        ];
        let mut c = 0;
        while c + 2 <= cols {
            let (w0, w1) = (&w[c * k..(c + 1) * k], &w[(c + 1) * k..(c + 2) * k]);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: FUSED is only true on the path chosen after detecting AVX2 and FMA.
            let r = if FUSED {
                unsafe { dot2x4_avx2(w0, w1, xs) }
            } else {
                dot2x4::<FUSED>(w0, w1, xs)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let r = dot2x4::<FUSED>(w0, w1, xs);
            for (j, col) in r.iter().enumerate() {
                for (i, v) in col.iter().enumerate() {
                    tile[(t + i) * cols + c + j] = *v;
                }
            }
            c += 2;
        }
        for c in c..cols {
            for (i, x) in xs.iter().enumerate() {
                tile[(t + i) * cols + c] = dot::<FUSED>(&w[c * k..(c + 1) * k], x);
            }
        }
        t += 4;
    }
    while t < n {
        let xr = &x[t * k..(t + 1) * k];
        for c in 0..cols {
            tile[t * cols + c] = dot::<FUSED>(&w[c * k..(c + 1) * k], xr);
        }
        t += 1;
    }
}

/// `a·b + c`, fused where the build has hardware FMA (a software `fmaf` would be far slower).
#[inline(always)]
fn fma<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

#[inline(always)]
fn lanes(s: &[f32]) -> std::slice::ChunksExact<'_, f32> {
    s.chunks_exact(LANES)
}

#[inline(always)]
fn as_lanes(c: &[f32]) -> &[f32; LANES] {
    c.try_into().expect("chunks_exact yields LANES elements")
}

/// One row of `w` times one row of `x`. Its reduction order (LANES lane-wise accumulators, then
/// the lanes summed in order, then the tail) is exactly the 2×4 kernels', so a token's result does
/// not depend on which kernel, batch or group computed it: batch-invariant output.
#[inline(always)]
fn dot<const FUSED: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    for (ac, bc) in lanes(a).zip(lanes(b)) {
        let (ac, bc) = (as_lanes(ac), as_lanes(bc));
        for l in 0..LANES {
            acc[l] = fma::<FUSED>(ac[l], bc[l], acc[l]);
        }
    }
    let tail = a.len() / LANES * LANES;
    let mut s = acc.iter().sum::<f32>();
    for i in tail..a.len() {
        s = fma::<FUSED>(a[i], b[i], s);
    }
    s
}

/// Dot products of two rows of `w` with four rows of `x`: eight accumulators of LANES each, so
/// every loaded vector feeds two or four FMAs.
#[inline(always)]
fn dot2x4<const FUSED: bool>(w0: &[f32], w1: &[f32], xs: [&[f32]; 4]) -> [[f32; 4]; 2] {
    let mut acc = [[[0.0f32; LANES]; 4]; 2];
    let it = lanes(w0)
        .zip(lanes(w1))
        .zip(lanes(xs[0]))
        .zip(lanes(xs[1]))
        .zip(lanes(xs[2]))
        .zip(lanes(xs[3]));
    for (((((a0, a1), b0), b1), b2), b3) in it {
        let ws = [as_lanes(a0), as_lanes(a1)];
        let xv = [as_lanes(b0), as_lanes(b1), as_lanes(b2), as_lanes(b3)];
        for c in 0..2 {
            for r in 0..4 {
                for l in 0..LANES {
                    acc[c][r][l] = fma::<FUSED>(ws[c][l], xv[r][l], acc[c][r][l]);
                }
            }
        }
    }
    let tail = w0.len() / LANES * LANES;
    let mut out = [[0.0f32; 4]; 2];
    for c in 0..2 {
        let w = if c == 0 { w0 } else { w1 };
        for r in 0..4 {
            let mut s = acc[c][r].iter().sum::<f32>();
            for i in tail..w.len() {
                s = fma::<FUSED>(w[i], xs[r][i], s);
            }
            out[c][r] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn matches_naive_f64_on_odd_sizes() {
        let mut rng = Rng::new(7);
        for &(n, k, m) in &[(1, 1, 1), (3, 13, 5), (5, 67, 70), (9, 576, 33)] {
            let x: Vec<f32> = (0..n * k).map(|_| rng.normal() as f32).collect();
            let w: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
            let got = matmul_t(&x, &w, n, k, m);
            for t in 0..n {
                for c in 0..m {
                    let want: f64 = (0..k)
                        .map(|i| x[t * k + i] as f64 * w[c * k + i] as f64)
                        .sum();
                    assert!(
                        (got[t * m + c] as f64 - want).abs() < 1e-4 * (k as f64).sqrt(),
                        "{n}x{k}x{m} at {t},{c}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod invariance {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn a_rows_result_is_bitwise_independent_of_its_batch() {
        let mut rng = Rng::new(11);
        let (k, m) = (83, 37);
        let x: Vec<f32> = (0..9 * k).map(|_| rng.normal() as f32).collect();
        let w: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
        let all = matmul_t(&x, &w, 9, k, m);
        for t in 0..9 {
            let one = matmul_t(&x[t * k..(t + 1) * k], &w, 1, k, m);
            assert_eq!(one, all[t * m..(t + 1) * m].to_vec(), "row {t}");
        }
    }
}
