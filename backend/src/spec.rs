//! N-gram (prompt-lookup) speculative decoding.
//!
//! A decoding request proposes the tokens that followed the most recent earlier occurrence of
//! its last `n` tokens (`n` from `prompt_lookup_max` down to `prompt_lookup_min`) in its own
//! prompt + output: copy-heavy work (editing code, quoting a document, reformatting JSON) repeats
//! itself, and such drafts cost no model. The scheduler computes the drafts as extra tokens of the
//! request's step (the counter model: drafts are just tokens to compute) with logits for every
//! one; [`verify_draft`] keeps the longest prefix the model agrees with plus one token of its own,
//! so greedy output is exactly non-speculative output, and sampled output has exactly the target
//! distribution. KV slots past the accepted tokens are rolled back, and since block hashes only
//! ever cover accepted tokens, no cached block is registered from a rejected draft.
//!
//! Each request has its own index (drafts never come from another request, let alone another
//! tenant: acceptance timing would leak their text). Speculation turns itself off for a step
//! with many decoding requests (verification then costs compute that a memory-bound small batch
//! gets for free) and, per request, while its acceptance rate is low.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::sampler::{self, SamplingParams};

/// Most draft tokens per step a request may propose.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// vLLM's `--speculative-config` for `"method": "ngram"`, plus when to stand down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpecConfig {
    /// Only "ngram" (prompt lookup).
    pub method: String,
    pub num_speculative_tokens: usize,
    pub prompt_lookup_max: usize,
    pub prompt_lookup_min: usize,
    /// No speculation in a step with more decoding requests than this.
    pub disable_by_batch_size: usize,
    /// A request whose running acceptance rate (drafts accepted / proposed, exponentially
    /// averaged) falls below this stops proposing for `cooldown_steps` steps.
    pub min_acceptance_rate: f64,
    pub cooldown_steps: u32,
    /// A request also stands down while its drafts do not pay for their verification: when its
    /// tokens per verification step (exponentially averaged) fall below this times the measured
    /// cost of a verification step relative to a plain decode step. 0 turns the check off.
    pub min_speedup: f64,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            method: "ngram".into(),
            num_speculative_tokens: 4,
            prompt_lookup_max: 4,
            prompt_lookup_min: 2,
            disable_by_batch_size: 8,
            min_acceptance_rate: 0.3,
            cooldown_steps: 16,
            min_speedup: 1.0,
        }
    }
}

/// A speculative decoding setting out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidSpec {
    #[error("speculative method `{0}` is not supported: use \"ngram\"")]
    Method(String),
    #[error("num_speculative_tokens must be 1..={MAX_SPECULATIVE_TOKENS}, got {0}")]
    Tokens(usize),
    #[error("need 1 <= prompt_lookup_min <= prompt_lookup_max, got {0} and {1}")]
    LookupRange(usize, usize),
    #[error("prompt_lookup_max must be at most 32, got {0}")]
    LookupMax(usize),
    #[error("min_acceptance_rate must be in [0, 1], got {0}")]
    AcceptanceRate(f64),
    #[error("min_speedup must be in [0, 4], got {0}")]
    Speedup(f64),
}

impl SpecConfig {
    pub fn validate(&self) -> Result<(), InvalidSpec> {
        use InvalidSpec as E;
        if self.method != "ngram" {
            return Err(E::Method(self.method.clone()));
        }
        if self.num_speculative_tokens == 0 || self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS
        {
            return Err(E::Tokens(self.num_speculative_tokens));
        }
        if self.prompt_lookup_min == 0 || self.prompt_lookup_min > self.prompt_lookup_max {
            return Err(E::LookupRange(
                self.prompt_lookup_min,
                self.prompt_lookup_max,
            ));
        }
        if self.prompt_lookup_max > 32 {
            return Err(E::LookupMax(self.prompt_lookup_max));
        }
        if !(0.0..=1.0).contains(&self.min_acceptance_rate) {
            return Err(E::AcceptanceRate(self.min_acceptance_rate));
        }
        if !(0.0..=4.0).contains(&self.min_speedup) {
            return Err(E::Speedup(self.min_speedup));
        }
        Ok(())
    }
}

fn ngram_key(gram: &[u32]) -> u64 {
    // FNV-1a over the tokens, then the length: collisions only cost a proposal (checked below).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in gram {
        for b in t.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h ^ (gram.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Where each n-gram of a request's tokens (for n in min..=max) last ended. Updated with the new
/// tokens only: a proposal costs `max - min + 1` lookups, never a rescan.
#[derive(Debug, Clone)]
pub struct NgramIndex {
    min: usize,
    max: usize,
    /// n-gram → exclusive end of its latest occurrence that has a token after it.
    last_end: HashMap<u64, u32>,
    /// Ends below this are indexed.
    indexed: usize,
}

impl NgramIndex {
    pub fn new(min: usize, max: usize) -> Self {
        NgramIndex {
            min,
            max,
            last_end: HashMap::new(),
            indexed: 0,
        }
    }

    fn update(&mut self, tokens: &[u32]) {
        // An occurrence ending at e is useful only if tokens[e] exists: index ends < len.
        let len = tokens.len();
        for e in self.indexed.max(self.min)..len {
            for n in self.min..=self.max.min(e) {
                self.last_end.insert(ngram_key(&tokens[e - n..e]), e as u32);
            }
        }
        self.indexed = self.indexed.max(len);
    }

    /// Up to `k` tokens that followed the latest earlier occurrence of the longest matching
    /// suffix of `tokens`.
    pub fn propose(&mut self, tokens: &[u32], k: usize) -> Vec<u32> {
        let len = tokens.len();
        if k == 0 || len < self.min + 1 {
            self.update(tokens);
            return Vec::new();
        }
        // Ends below len are indexed; the suffix's own end is len, so it never matches itself.
        self.update(tokens);
        let mut out = Vec::new();
        for n in (self.min..=self.max.min(len - 1)).rev() {
            let suffix = &tokens[len - n..];
            if let Some(&e) = self.last_end.get(&ngram_key(suffix)) {
                let e = e as usize;
                if e >= n && &tokens[e - n..e] == suffix {
                    out.extend_from_slice(&tokens[e..(e + k).min(len)]);
                    break;
                }
            }
        }
        out
    }
}

/// Most doublings of a repeated stand-down's cool-down.
const MAX_BACKOFF: u32 = 4;

/// A request's speculation state.
#[derive(Debug, Clone)]
pub struct SpecState {
    pub index: NgramIndex,
    /// Exponential average of accepted / proposed.
    pub acceptance: f64,
    /// Exponential average of tokens emitted per verification step (accepted drafts + 1).
    pub yield_per_step: f64,
    /// Steps left without proposing.
    pub cooldown: u32,
    /// Stand-downs in a row: each doubles the next cool-down (up to 2^MAX_BACKOFF).
    pub strikes: u32,
}

impl SpecState {
    pub fn new(cfg: &SpecConfig) -> Self {
        SpecState {
            index: NgramIndex::new(cfg.prompt_lookup_min, cfg.prompt_lookup_max),
            acceptance: 1.0,
            yield_per_step: (cfg.num_speculative_tokens + 1) as f64,
            cooldown: 0,
            strikes: 0,
        }
    }

    /// Records a verification and stands the request down for a while when its drafts keep
    /// failing, or when they do not pay for themselves: `cost` is what a verification step costs
    /// relative to a plain decode step, as measured by the engine (1 before it knows).
    pub fn record(&mut self, cfg: &SpecConfig, proposed: usize, accepted: usize, cost: f64) {
        if proposed == 0 {
            return;
        }
        self.acceptance = 0.7 * self.acceptance + 0.3 * accepted as f64 / proposed as f64;
        self.yield_per_step = 0.7 * self.yield_per_step + 0.3 * (accepted + 1) as f64;
        if 2 * accepted >= proposed {
            self.strikes = 0;
        }
        let bar = cfg.min_speedup * cost;
        if self.acceptance < cfg.min_acceptance_rate || self.yield_per_step < bar {
            self.cooldown = cfg.cooldown_steps << self.strikes.min(MAX_BACKOFF);
            self.strikes += 1;
            // A fresh chance after the cool-down, not an immediate relapse.
            self.acceptance = (cfg.min_acceptance_rate + 1.0) / 2.0;
            self.yield_per_step = (bar.max(1.0) + (cfg.num_speculative_tokens + 1) as f64) / 2.0;
        }
    }
}

/// What a verification step costs relative to a plain decode step, measured on the steps the
/// engine runs: exponential averages of the wall time of small decode-only steps with drafts
/// and without.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepCost {
    plain: Option<f64>,
    verify: Option<f64>,
}

impl StepCost {
    /// Records a decode-only step of `secs` seconds that verified drafts or not.
    pub fn record(&mut self, verified: bool, secs: f64) {
        let slot = if verified {
            &mut self.verify
        } else {
            &mut self.plain
        };
        *slot = Some(match *slot {
            Some(t) => 0.8 * t + 0.2 * secs,
            None => secs,
        });
    }

    /// verification ÷ plain step time, or 1 until both have been seen.
    pub fn ratio(&self) -> f64 {
        match (self.plain, self.verify) {
            (Some(p), Some(v)) if p > 0.0 => v / p,
            _ => 1.0,
        }
    }
}

/// Verifies one draft token against the model's logits at its position (output token `step` of
/// a request seeded `seed`): returns the token to emit and whether it is the draft.
///
/// The position is sampled exactly as plain decoding samples it and the draft is kept when they
/// agree. Greedy: the argmax. Sampled: an n-gram draft is a point mass, so this accepts it with
/// probability p(draft) — speculative sampling's rate — and the emitted token is distributed
/// exactly as p; being the same draw as plain decoding's, a seeded request's output does not
/// depend on whether speculation ran.
pub fn verify_draft(
    logits: &[f32],
    params: &SamplingParams,
    draft: u32,
    seed: u64,
    step: u64,
) -> (u32, bool) {
    let t = sampler::sample(logits, params, seed, step);
    (t, t == draft)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn proposes_what_followed_the_latest_longest_match() {
        let mut ix = NgramIndex::new(2, 4);
        // ... 5 6 7 [8 9] ... 5 6 7 [1 2] ... 5 6 7 → the latest "5 6 7" was followed by 1 2.
        let t = [5, 6, 7, 8, 9, 0, 5, 6, 7, 1, 2, 3, 5, 6, 7];
        assert_eq!(ix.propose(&t, 2), vec![1, 2]);
        assert_eq!(ix.propose(&t, 8), vec![1, 2, 3, 5, 6, 7]);
        // A longer match wins over a later shorter one: "4 5 6 7" occurred once, before 8.
        let mut ix = NgramIndex::new(2, 4);
        let t = [4, 5, 6, 7, 8, 0, 5, 6, 7, 1, 4, 5, 6, 7];
        assert_eq!(ix.propose(&t, 1), vec![8]);
        // No match: nothing proposed; the suffix never matches itself.
        assert!(NgramIndex::new(2, 3).propose(&[1, 2, 3, 4], 4).is_empty());
        let mut ix = NgramIndex::new(2, 3);
        assert!(ix.propose(&[7, 7], 4).is_empty());
        assert_eq!(ix.propose(&[7, 7, 7], 4), vec![7]);
    }

    #[test]
    fn the_index_grows_with_the_tokens_and_matches_a_rescan() {
        let mut rng = Rng::new(1);
        let mut tokens: Vec<u32> = Vec::new();
        let mut ix = NgramIndex::new(1, 3);
        for _ in 0..400 {
            tokens.push((rng.next_u64() % 6) as u32);
            let got = ix.propose(&tokens, 3);
            // The rescan: longest n first, then the latest earlier end.
            let mut want = Vec::new();
            'n: for n in (1..=3.min(tokens.len().saturating_sub(1))).rev() {
                let len = tokens.len();
                let suffix = &tokens[len - n..];
                for e in (n..len).rev() {
                    if &tokens[e - n..e] == suffix {
                        want = tokens[e..(e + 3).min(len)].to_vec();
                        break 'n;
                    }
                }
            }
            assert_eq!(got, want, "at {}", tokens.len());
        }
    }

    #[test]
    fn verified_tokens_follow_the_target_distribution_whatever_the_draft() {
        // Speculative sampling is exact: for a fixed draft, the emitted token's frequencies match
        // p (chi-square, 5 degrees of freedom, p < 0.001 critical value 20.5).
        let logits = [0.5f32, 1.5, -0.3, 2.0, 0.0, 1.0];
        let params = SamplingParams {
            temperature: 0.8,
            ..Default::default()
        };
        let p: Vec<f64> = {
            let d = sampler::distribution(&logits, &params);
            let mut v = vec![0.0; logits.len()];
            for (id, pr) in d {
                v[id as usize] = pr as f64;
            }
            v
        };
        for draft in [3u32, 2, 5] {
            let n = 40_000;
            let mut counts = vec![0usize; logits.len()];
            let mut accepted = 0;
            for step in 0..n {
                let (t, ok) = verify_draft(&logits, &params, draft, draft as u64 + 10, step);
                assert_eq!(
                    t,
                    sampler::sample(&logits, &params, draft as u64 + 10, step)
                );
                counts[t as usize] += 1;
                accepted += ok as usize;
            }
            let chi2: f64 = counts
                .iter()
                .zip(&p)
                .map(|(&c, &q)| (c as f64 - n as f64 * q).powi(2) / (n as f64 * q))
                .sum();
            assert!(
                chi2 < 20.5,
                "draft {draft}: chi2 {chi2}, counts {counts:?}, p {p:?}"
            );
            // And the draft is accepted exactly as often as the model would pick it.
            let rate = accepted as f64 / n as f64;
            assert!(
                (rate - p[draft as usize]).abs() < 0.01,
                "{rate} vs {}",
                p[draft as usize]
            );
        }
        // With top-k, a draft outside the candidates is never accepted.
        let params = SamplingParams { top_k: 2, ..params };
        for step in 0..1000 {
            let (t, ok) = verify_draft(&logits, &params, 2, 3, step);
            assert!(!ok && (t == 3 || t == 1));
        }
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let bad = |f: fn(&mut SpecConfig)| {
            let mut c = SpecConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.method = "eagle".into()).contains("ngram"));
        assert!(bad(|c| c.num_speculative_tokens = 0).contains("num_speculative_tokens"));
        assert!(bad(|c| c.prompt_lookup_min = 5).contains("prompt_lookup_min"));
        assert!(bad(|c| c.min_speedup = -1.0).contains("min_speedup"));
        assert!(SpecConfig::default().validate().is_ok());
    }

    /// A fresh state after `n` verifications of `proposed` drafts, `accepted` of them, at a
    /// verification cost of `cost` plain steps (stopping at the first stand-down).
    fn after(cfg: &SpecConfig, n: usize, proposed: usize, accepted: usize, cost: f64) -> SpecState {
        let mut st = SpecState::new(cfg);
        for _ in 0..n {
            st.record(cfg, proposed, accepted, cost);
            if st.cooldown > 0 {
                break;
            }
        }
        st
    }

    #[test]
    fn drafts_that_do_not_pay_for_their_verification_stand_down_with_backoff() {
        // 4 drafts, acceptance bar 0.3, min_speedup 1.
        let cfg = SpecConfig::default();
        // Half the drafts accepted (3 tokens a verification): worth it even at twice the cost.
        let st = after(&cfg, 50, 4, 2, 2.0);
        assert_eq!(st.cooldown, 0, "{st:?}");
        // One of three drafts accepted: a rate above the bar (0.33), 2 tokens per verification —
        // not worth a verification step that costs 2.5 plain ones.
        let cfg3 = SpecConfig {
            num_speculative_tokens: 3,
            ..SpecConfig::default()
        };
        let st = after(&cfg3, 50, 3, 1, 2.5);
        assert_eq!(st.cooldown, cfg3.cooldown_steps, "{st:?}");
        // The same drafts on a weight-bound step (a verification costs 1.2 plain ones) pay.
        let st = after(&cfg3, 50, 3, 1, 1.2);
        assert_eq!(st.cooldown, 0, "{st:?}");
        // The check can be turned off.
        let off = SpecConfig {
            min_speedup: 0.0,
            ..cfg3.clone()
        };
        assert_eq!(after(&off, 50, 3, 1, 2.5).cooldown, 0);
        // Failing again and again: each cool-down twice the last, up to 2^4 times the first.
        let mut st = SpecState::new(&cfg);
        let mut cooldowns = Vec::new();
        for _ in 0..8 {
            while st.cooldown == 0 {
                st.record(&cfg, 4, 0, 1.0);
            }
            cooldowns.push(st.cooldown);
            st.cooldown = 0;
        }
        assert_eq!(cooldowns, [16, 32, 64, 128, 256, 256, 256, 256]);
        // A good verification (half accepted) resets the back-off.
        st.record(&cfg, 4, 2, 1.0);
        while st.cooldown == 0 {
            st.record(&cfg, 4, 0, 1.0);
        }
        assert_eq!(st.cooldown, 16);
    }

    #[test]
    fn step_cost_is_the_ratio_of_averaged_step_times() {
        let mut c = StepCost::default();
        assert_eq!(c.ratio(), 1.0);
        c.record(false, 0.010);
        assert_eq!(c.ratio(), 1.0, "no verification step seen yet");
        c.record(true, 0.015);
        assert!((c.ratio() - 1.5).abs() < 1e-12);
        for _ in 0..100 {
            c.record(true, 0.012);
        }
        assert!((c.ratio() - 1.2).abs() < 1e-6, "{}", c.ratio());
    }
}
