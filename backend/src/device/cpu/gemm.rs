//! f32 matrix product `x · wᵀ` for the CPU device.
//!
//! Work is split over output columns (rows of `w`) across rayon's threads; inside a task, four
//! tokens share each loaded row of `w`, with eight independent accumulators per dot product so the
//! compiler emits vector FMAs. An AVX2+FMA build of the same code is chosen at run time when the
//! processor has it; results differ from the portable build only by rounding.

use rayon::prelude::*;

/// Rows of `w` one task computes.
const COLS_PER_TASK: usize = 32;
const LANES: usize = 8;

/// `out[n, m] = x[n, k] · w[m, k]ᵀ`
pub fn matmul_t(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    assert_eq!(x.len(), n * k);
    assert_eq!(w.len(), m * k);
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
            out[t * m + c0..t * m + c0 + w_cols].copy_from_slice(&tile[t * w_cols..(t + 1) * w_cols]);
        }
    }
    out
}

fn block(x: &[f32], w: &[f32], n: usize, k: usize, cols: usize, tile: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the processor supports AVX2 and FMA, checked just above.
            unsafe { block_avx2(x, w, n, k, cols, tile) };
            return;
        }
    }
    block_portable::<false>(x, w, n, k, cols, tile);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(x: &[f32], w: &[f32], n: usize, k: usize, cols: usize, tile: &mut [f32]) {
    block_portable::<true>(x, w, n, k, cols, tile)
}

#[inline(always)]
fn block_portable<const FUSED: bool>(x: &[f32], w: &[f32], n: usize, k: usize, cols: usize, tile: &mut [f32]) {
    let mut t = 0;
    while t + 4 <= n {
        let xs = [&x[t * k..(t + 1) * k], &x[(t + 1) * k..(t + 2) * k], &x[(t + 2) * k..(t + 3) * k], &x[(t + 3) * k..(t + 4) * k]];
        for c in 0..cols {
            let r = dot4::<FUSED>(&w[c * k..(c + 1) * k], xs);
            for (i, v) in r.into_iter().enumerate() {
                tile[(t + i) * cols + c] = v;
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
fn dot<const FUSED: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = a.len() / LANES;
    for i in 0..chunks {
        let (ac, bc) = (&a[i * LANES..(i + 1) * LANES], &b[i * LANES..(i + 1) * LANES]);
        for l in 0..LANES {
            acc[l] = fma::<FUSED>(ac[l], bc[l], acc[l]);
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for i in chunks * LANES..a.len() {
        s = fma::<FUSED>(a[i], b[i], s);
    }
    s
}

#[inline(always)]
fn dot4<const FUSED: bool>(w: &[f32], xs: [&[f32]; 4]) -> [f32; 4] {
    let mut acc = [[0.0f32; LANES]; 4];
    let chunks = w.len() / LANES;
    for i in 0..chunks {
        let wc = &w[i * LANES..(i + 1) * LANES];
        for r in 0..4 {
            let xc = &xs[r][i * LANES..(i + 1) * LANES];
            for l in 0..LANES {
                acc[r][l] = fma::<FUSED>(wc[l], xc[l], acc[r][l]);
            }
        }
    }
    let mut out = [0.0f32; 4];
    for r in 0..4 {
        let mut s = acc[r].iter().sum::<f32>();
        for i in chunks * LANES..w.len() {
            s = fma::<FUSED>(w[i], xs[r][i], s);
        }
        out[r] = s;
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
                    let want: f64 = (0..k).map(|i| x[t * k + i] as f64 * w[c * k + i] as f64).sum();
                    assert!((got[t * m + c] as f64 - want).abs() < 1e-4 * (k as f64).sqrt(), "{n}x{k}x{m} at {t},{c}");
                }
            }
        }
    }
}
