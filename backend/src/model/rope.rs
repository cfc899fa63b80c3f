//! RoPE frequency tables (default, `linear`, `llama3` and `yarn` scaling), computed the way HF
//! transformers computes them (f32 inverse frequencies, f32 angle = position · inv_freq) so
//! logits agree.

use crate::config::{ModelConfig, RopeScaling};
use crate::tensor::HostTensor;

/// Inverse frequencies, one per pair of rotated dimensions.
pub fn inv_freq(cfg: &ModelConfig) -> Vec<f32> {
    let d = cfg.head_dim;
    let base = cfg.rope_theta as f32;
    let mut f: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / d as f32))
        .collect();
    match cfg.rope_scaling {
        RopeScaling::Default => {}
        RopeScaling::Linear { factor } => f.iter_mut().for_each(|x| *x /= factor as f32),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => llama3(
            &mut f,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        ),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            // Dimensions that turn fewer than `beta_slow` times over the original context are
            // interpolated (divided by `factor`), those turning more than `beta_fast` times kept,
            // a linear ramp between.
            let (dim, base) = (d as f64, cfg.rope_theta);
            let corr = |rot: f64| {
                dim * (original_max_position_embeddings as f64 / (rot * 2.0 * std::f64::consts::PI))
                    .ln()
                    / (2.0 * base.ln())
            };
            let (mut low, mut high) = (corr(beta_fast), corr(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0) as f32, high.min(dim - 1.0) as f32);
            if low == high {
                high += 0.001;
            }
            for (i, x) in f.iter_mut().enumerate() {
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                let interpolated = *x / factor as f32;
                *x = interpolated * (1.0 - extrapolation) + *x * extrapolation;
            }
        }
    }
    f
}

/// Llama 3.1's wavelength-dependent scaling of `f`.
fn llama3(
    f: &mut [f32],
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original: usize,
) {
    {
        let (factor, lo, hi) = (
            factor as f32,
            low_freq_factor as f32,
            high_freq_factor as f32,
        );
        let old = original as f32;
        let low_wavelen = old / lo;
        let high_wavelen = old / hi;
        for x in f.iter_mut() {
            let wavelen = 2.0 * std::f32::consts::PI / *x;
            if wavelen > low_wavelen {
                *x /= factor;
            } else if wavelen >= high_wavelen {
                let smooth = (old / wavelen - lo) / (hi - lo);
                *x = (1.0 - smooth) * *x / factor + smooth * *x;
            }
        }
    }
}

/// The cos/sin table: row `pos` holds `head_dim/2` cosines then `head_dim/2` sines.
pub fn table(cfg: &ModelConfig, max_positions: usize) -> HostTensor {
    let freqs = inv_freq(cfg);
    let half = freqs.len();
    // YaRN scales cos and sin (HF's `attention_scaling`).
    let scale = match cfg.rope_scaling {
        RopeScaling::Yarn {
            attention_factor, ..
        } => attention_factor as f32,
        _ => 1.0,
    };
    let mut data = Vec::with_capacity(max_positions * 2 * half);
    for pos in 0..max_positions {
        let angles: Vec<f32> = freqs.iter().map(|&f| pos as f32 * f).collect();
        data.extend(angles.iter().map(|&a| (a as f64).cos() as f32 * scale));
        data.extend(angles.iter().map(|&a| (a as f64).sin() as f32 * scale));
    }
    HostTensor::new(vec![max_positions, 2 * half], data)
}
