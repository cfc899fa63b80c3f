//! RoPE frequency tables (default and `llama3` scaling), computed the way HF transformers
//! computes them (f32 inverse frequencies, f32 angle = position · inv_freq) so logits agree.

use crate::config::{ModelConfig, RopeScaling};
use crate::tensor::HostTensor;

/// Inverse frequencies, one per pair of rotated dimensions.
pub fn inv_freq(cfg: &ModelConfig) -> Vec<f32> {
    let d = cfg.head_dim;
    let base = cfg.rope_theta as f32;
    let mut f: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / d as f32))
        .collect();
    if let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    } = cfg.rope_scaling
    {
        let (factor, lo, hi) = (
            factor as f32,
            low_freq_factor as f32,
            high_freq_factor as f32,
        );
        let old = original_max_position_embeddings as f32;
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
    f
}

/// The cos/sin table: row `pos` holds `head_dim/2` cosines then `head_dim/2` sines.
pub fn table(cfg: &ModelConfig, max_positions: usize) -> HostTensor {
    let freqs = inv_freq(cfg);
    let half = freqs.len();
    let mut data = Vec::with_capacity(max_positions * 2 * half);
    for pos in 0..max_positions {
        let angles: Vec<f32> = freqs.iter().map(|&f| pos as f32 * f).collect();
        data.extend(angles.iter().map(|&a| (a as f64).cos() as f32));
        data.extend(angles.iter().map(|&a| (a as f64).sin() as f32));
    }
    HostTensor::new(vec![max_positions, 2 * half], data)
}
