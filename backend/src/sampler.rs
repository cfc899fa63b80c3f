//! Turning logits into a token: greedy, temperature, top-k, top-p, with a per-request seeded RNG
//! so seeded runs reproduce exactly.

use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::rng::Rng;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    /// 1 means no nucleus cut.
    pub top_p: f32,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }
    pub fn validate(&self) -> Result<(), EngineError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(EngineError::InvalidRequest(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::InvalidRequest(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// Index of the largest logit (the lowest index on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The candidate distribution after temperature, top-k and top-p: `(token, probability)` sorted by
/// probability, descending, summing to 1.
pub fn distribution(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f32)> {
    let t = p.temperature.max(1e-6);
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = if p.top_k == 0 {
        logits.len()
    } else {
        p.top_k.min(logits.len())
    };
    let cmp = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_unstable_by(cmp);
    let max = logits[idx[0] as usize];
    let mut probs: Vec<(u32, f32)> = idx
        .iter()
        .map(|&i| (i, ((logits[i as usize] - max) / t).exp()))
        .collect();
    let sum: f32 = probs.iter().map(|x| x.1).sum();
    probs.iter_mut().for_each(|x| x.1 /= sum);
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, x) in probs.iter().enumerate() {
            acc += x.1;
            if acc >= p.top_p {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        let sum: f32 = probs.iter().map(|x| x.1).sum();
        probs.iter_mut().for_each(|x| x.1 /= sum);
    }
    probs
}

/// Samples one token.
pub fn sample(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
    if p.is_greedy() {
        return argmax(logits);
    }
    let dist = distribution(logits, p);
    let u = rng.uniform() as f32;
    let mut acc = 0.0;
    for &(id, pr) in &dist {
        acc += pr;
        if u < acc {
            return id;
        }
    }
    dist.last().expect("non-empty vocabulary").0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_k_and_top_p_cut_the_distribution() {
        let logits = [0.0, 1.0, 2.0, 3.0];
        let d = distribution(
            &logits,
            &SamplingParams {
                temperature: 1.0,
                top_k: 2,
                top_p: 1.0,
                seed: None,
            },
        );
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
        let d = distribution(
            &logits,
            &SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.5,
                seed: None,
            },
        );
        assert_eq!(d.len(), 1);
        assert!((d[0].1 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn seeded_sampling_reproduces_and_follows_the_distribution() {
        let logits = [0.0f32, 1.0, 2.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: Some(3),
        };
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..4000)
                .map(|_| sample(&logits, &p, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        let xs = draw(5);
        let frac2 = xs.iter().filter(|&&x| x == 2).count() as f64 / xs.len() as f64;
        let want = (2f64).exp() / (1.0 + 1f64.exp() + 2f64.exp());
        assert!((frac2 - want).abs() < 0.03, "{frac2} vs {want}");
    }
}
