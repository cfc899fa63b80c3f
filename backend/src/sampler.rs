//! Turning logits into a token. The processors (`logit_bias`, presence / frequency / repetition
//! penalties, `min_tokens`) become sparse per-row [`TokenEdit`]s applied to the logits where
//! they live (the device); then greedy or temperature + min-p + top-k + top-p sampling with a
//! counter-based random number of (seed, output index) — the same draw as the GPU kernel's, so a
//! seeded request reproduces whatever batch it shares and whether speculation ran or not — and,
//! when asked, the chosen token's log-probability with the most likely alternatives.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::error::EngineError;

/// Most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most `logit_bias` entries a request may carry.
pub const MAX_LOGIT_BIAS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    /// 1 means no nucleus cut.
    pub top_p: f32,
    /// Keep tokens at least this likely relative to the most likely one; 0 means off.
    pub min_p: f32,
    pub seed: Option<u64>,
    /// Subtracted once from every token already generated (OpenAI, -2..2).
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output (OpenAI, -2..2).
    pub frequency_penalty: f32,
    /// Tokens of the prompt or output: positive logits divided by it, negative multiplied
    /// (vLLM's and transformers' definition); 1 means off.
    pub repetition_penalty: f32,
    /// Added to the logits of these tokens (OpenAI's `logit_bias`, -100..100).
    pub logit_bias: Vec<(u32, f32)>,
    /// Stop tokens (EOS included) are banned until this many tokens are generated, and stop
    /// strings are not looked for.
    pub min_tokens: usize,
    /// Return the chosen token's log-probability and this many alternatives (0..=20);
    /// `None`: none.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            min_tokens: 0,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidRequest(m));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 10.0) {
            return bad(format!(
                "repetition_penalty must be in (0, 10], got {}",
                self.repetition_penalty
            ));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return bad(format!(
                "logit_bias takes at most {MAX_LOGIT_BIAS} tokens, got {}",
                self.logit_bias.len()
            ));
        }
        if let Some(&(t, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return bad(format!(
                "logit_bias for token {t} must be in [-100, 100], got {b}"
            ));
        }
        if self.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return bad(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {}",
                self.logprobs.unwrap_or_default()
            ));
        }
        Ok(())
    }
    /// Checks token ids against the vocabulary.
    pub fn validate_vocab(&self, vocab: usize) -> Result<(), EngineError> {
        match self.logit_bias.iter().find(|(t, _)| *t as usize >= vocab) {
            Some((t, _)) => Err(EngineError::InvalidRequest(format!(
                "logit_bias names token {t}, outside the vocabulary of {vocab}"
            ))),
            None => Ok(()),
        }
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
    /// Whether any processor edits the logits (then [`row_edits`] has work to do).
    pub fn has_processors(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
            || !self.logit_bias.is_empty()
            || self.min_tokens > 0
    }
    /// Whether the repetition penalty needs the prompt's tokens.
    pub fn needs_prompt_tokens(&self) -> bool {
        self.repetition_penalty != 1.0
    }
}

/// One token's edit of a logits row: `x ← (x > 0 ? x · pos : x · neg) + add`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenEdit {
    pub token: u32,
    pub pos: f32,
    pub neg: f32,
    pub add: f32,
}

impl TokenEdit {
    fn new(token: u32) -> Self {
        TokenEdit {
            token,
            pos: 1.0,
            neg: 1.0,
            add: 0.0,
        }
    }
    pub fn apply(&self, x: f32) -> f32 {
        (if x > 0.0 { x * self.pos } else { x * self.neg }) + self.add
    }
}

/// What the processors need to know of a request's tokens, kept up to date as it generates.
#[derive(Debug, Clone, Default)]
pub struct TokenHistory {
    /// Distinct prompt tokens (only when the repetition penalty needs them).
    prompt: Vec<u32>,
    /// Occurrences of each output token.
    output: HashMap<u32, u32>,
    num_output: usize,
}

impl TokenHistory {
    pub fn new(p: &SamplingParams, prompt: &[u32]) -> Self {
        let mut h = TokenHistory::default();
        if p.needs_prompt_tokens() {
            h.prompt = prompt.to_vec();
            h.prompt.sort_unstable();
            h.prompt.dedup();
        }
        h
    }
    pub fn push(&mut self, tok: u32) {
        *self.output.entry(tok).or_default() += 1;
        self.num_output += 1;
    }
    pub fn num_output(&self) -> usize {
        self.num_output
    }
}

/// The edits for the row that samples output token number `history.num_output() +
/// extra.len()`, where `extra` are tokens generated but not yet in `history` (the drafts before
/// this row in a verification step). `stop_ids` are banned while under `min_tokens`.
pub fn row_edits(
    p: &SamplingParams,
    history: &TokenHistory,
    extra: &[u32],
    stop_ids: &[u32],
) -> Vec<TokenEdit> {
    if !p.has_processors() {
        return Vec::new();
    }
    let mut e: BTreeMap<u32, TokenEdit> = BTreeMap::new();
    // The output's counts, with the drafts before this row (a copy only when there are some).
    let penalised =
        p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 || p.repetition_penalty != 1.0;
    let counts: std::borrow::Cow<'_, HashMap<u32, u32>> = if extra.is_empty() || !penalised {
        std::borrow::Cow::Borrowed(&history.output)
    } else {
        let mut c = history.output.clone();
        for &t in extra {
            *c.entry(t).or_default() += 1;
        }
        std::borrow::Cow::Owned(c)
    };
    if p.repetition_penalty != 1.0 {
        let r = p.repetition_penalty;
        for &t in history.prompt.iter().chain(counts.keys()) {
            let x = e.entry(t).or_insert_with(|| TokenEdit::new(t));
            x.pos = 1.0 / r;
            x.neg = r;
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        for (&t, &c) in counts.iter() {
            e.entry(t).or_insert_with(|| TokenEdit::new(t)).add -=
                p.presence_penalty + p.frequency_penalty * c as f32;
        }
    }
    for &(t, b) in &p.logit_bias {
        e.entry(t).or_insert_with(|| TokenEdit::new(t)).add += b;
    }
    if history.num_output + extra.len() < p.min_tokens {
        for &t in stop_ids {
            e.entry(t).or_insert_with(|| TokenEdit::new(t)).add = f32::NEG_INFINITY;
        }
    }
    e.into_values().collect()
}

/// Applies `edits` to a host logits row (the CPU device's and the references' path).
pub fn apply_edits(row: &mut [f32], edits: &[TokenEdit]) {
    for e in edits {
        if let Some(x) = row.get_mut(e.token as usize) {
            *x = e.apply(*x);
        }
    }
}

/// The uniform number in [0, 1) that draws output token `step` of a request seeded `seed`:
/// SplitMix64 of (seed, step), 24 bits — bit for bit the GPU kernel's `uniform01`.
pub fn uniform(seed: u64, step: u64) -> f32 {
    let mut z = seed ^ step.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 * (1.0 / 16_777_216.0)
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

/// The candidate distribution after temperature, min-p, top-k and top-p: `(token,
/// probability)` sorted by probability, descending, summing to 1.
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
        .filter(|x| x.1 >= p.min_p && x.1 > 0.0)
        .collect();
    if probs.is_empty() {
        // Every logit is -inf (all banned): the argmax stands.
        return vec![(idx[0], 1.0)];
    }
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

/// Samples output token number `step` of a request seeded `seed`: the argmax when greedy, else
/// the inverse CDF at [`uniform`]`(seed, step)` over the kept tokens in index order (as the GPU
/// kernel walks them).
pub fn sample(logits: &[f32], p: &SamplingParams, seed: u64, step: u64) -> u32 {
    if p.is_greedy() {
        return argmax(logits);
    }
    let mut dist = distribution(logits, p);
    dist.sort_unstable_by_key(|x| x.0);
    let u = uniform(seed, step);
    let mut acc = 0.0;
    for &(id, pr) in &dist {
        acc += pr;
        if u < acc {
            return id;
        }
    }
    dist.last().expect("non-empty vocabulary").0
}

/// A sampled token's log-probability under the (processed) model distribution, before
/// temperature and truncation, and the `top` most likely tokens with theirs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RowLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// Most likely first (the lowest id on ties).
    pub top: Vec<(u32, f32)>,
}

/// [`RowLogprobs`] of `chosen` in a host logits row: log-softmax, and the `top` largest.
pub fn logprobs(row: &[f32], chosen: u32, top: usize) -> RowLogprobs {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    let mut best: Vec<u32> = (0..row.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let k = top.min(row.len());
    if k > 0 && k < best.len() {
        best.select_nth_unstable_by(k - 1, cmp);
    }
    best.truncate(k);
    best.sort_unstable_by(cmp);
    RowLogprobs {
        token: chosen,
        logprob: row[chosen as usize] - lse,
        top: best.iter().map(|&i| (i, row[i as usize] - lse)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_k_top_p_and_min_p_cut_the_distribution() {
        let logits = [0.0, 1.0, 2.0, 3.0];
        let d = distribution(&logits, &params(1.0, 2, 1.0));
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
        let d = distribution(&logits, &params(1.0, 0, 0.5));
        assert_eq!(d.len(), 1);
        assert!((d[0].1 - 1.0).abs() < 1e-6);
        // min_p 0.3: e^-1 = 0.37 stays, e^-2 = 0.14 goes.
        let d = distribution(
            &logits,
            &SamplingParams {
                min_p: 0.3,
                ..params(1.0, 0, 1.0)
            },
        );
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
    }

    #[test]
    fn seeded_sampling_reproduces_and_follows_the_distribution() {
        let logits = [0.0f32, 1.0, 2.0];
        let p = params(1.0, 0, 1.0);
        let draw = |seed| {
            (0..4000)
                .map(|step| sample(&logits, &p, seed, step))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        let xs = draw(5);
        let frac2 = xs.iter().filter(|&&x| x == 2).count() as f64 / xs.len() as f64;
        let want = (2f64).exp() / (1.0 + 1f64.exp() + 2f64.exp());
        assert!((frac2 - want).abs() < 0.03, "{frac2} vs {want}");
    }

    #[test]
    fn the_draw_is_the_gpu_kernels_splitmix() {
        // Values of the kernel's formula, computed independently (Python, 64-bit wrapping).
        assert_eq!(uniform(0, 0) as f64, 0.8833107948303223);
        assert_eq!(uniform(42, 7) as f64, 0.055024147033691406);
    }

    #[test]
    fn penalties_and_bias_edit_the_logits_as_openai_and_vllm_define_them() {
        // Prompt [1, 2]; output so far [3, 3, 4]; logits over 6 tokens.
        let prompt = [1u32, 2];
        let row = [2.0f32, 1.0, -1.0, 4.0, 0.5, 3.0];
        let edited = |p: &SamplingParams, extra: &[u32]| {
            let mut h = TokenHistory::new(p, &prompt);
            for t in [3, 3, 4] {
                h.push(t);
            }
            let mut r = row;
            apply_edits(&mut r, &row_edits(p, &h, extra, &[5]));
            r
        };
        // OpenAI: logit − count·frequency − presence, output tokens only.
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        assert_eq!(edited(&p, &[]), [2.0, 1.0, -1.0, 3.0, -0.25, 3.0]);
        // A draft before the row counts as output.
        assert_eq!(edited(&p, &[0]), [1.25, 1.0, -1.0, 3.0, -0.25, 3.0]);
        // Repetition (prompt and output): positive ÷ r, negative × r.
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..Default::default()
        };
        assert_eq!(edited(&p, &[]), [2.0, 0.5, -2.0, 2.0, 0.25, 3.0]);
        // logit_bias adds; -100 all but bans.
        let p = SamplingParams {
            logit_bias: vec![(0, -100.0), (4, 10.0)],
            ..Default::default()
        };
        assert_eq!(edited(&p, &[]), [-98.0, 1.0, -1.0, 4.0, 10.5, 3.0]);
        // min_tokens bans the stop tokens until enough are out (3 so far, +1 draft).
        let p = SamplingParams {
            min_tokens: 5,
            ..Default::default()
        };
        assert_eq!(edited(&p, &[])[5], f32::NEG_INFINITY);
        assert_eq!(edited(&p, &[0])[5], f32::NEG_INFINITY);
        assert_eq!(edited(&p, &[0, 0])[5], 3.0);
        // Nothing asked, nothing edited.
        assert!(row_edits(
            &SamplingParams::default(),
            &TokenHistory::default(),
            &[],
            &[5]
        )
        .is_empty());
        // A banned row samples what is left, greedy or not.
        let mut r = row;
        apply_edits(
            &mut r,
            &row_edits(
                &SamplingParams {
                    min_tokens: 1,
                    ..Default::default()
                },
                &TokenHistory::default(),
                &[],
                &[3],
            ),
        );
        assert_eq!(argmax(&r), 5);
        assert!((0..50).all(|s| sample(&r, &params(1.0, 0, 1.0), 9, s) != 3));
    }

    #[test]
    fn logprobs_are_the_log_softmax_with_the_top_alternatives() {
        let row = [1.0f32, 3.0, 3.0, -2.0, 0.0];
        let lp = logprobs(&row, 4, 3);
        let lse = row.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        assert!((lp.logprob as f64 - (0.0 - lse)).abs() < 1e-6);
        assert_eq!(
            lp.top.iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![1, 2, 0]
        );
        assert!((lp.top[0].1 as f64 - (3.0 - lse)).abs() < 1e-6);
        assert!(logprobs(&row, 1, 0).top.is_empty());
        assert_eq!(logprobs(&row, 1, 99).top.len(), 5);
    }

    #[test]
    fn out_of_range_parameters_are_refused_by_name() {
        let bad = |p: SamplingParams| p.validate().unwrap_err().to_string();
        let d = SamplingParams::default;
        assert!(bad(SamplingParams { min_p: 1.5, ..d() }).contains("min_p"));
        assert!(bad(SamplingParams {
            presence_penalty: 3.0,
            ..d()
        })
        .contains("presence_penalty"));
        assert!(bad(SamplingParams {
            repetition_penalty: 0.0,
            ..d()
        })
        .contains("repetition_penalty"));
        assert!(bad(SamplingParams {
            logit_bias: vec![(1, 101.0)],
            ..d()
        })
        .contains("logit_bias"));
        assert!(bad(SamplingParams {
            logprobs: Some(21),
            ..d()
        })
        .contains("top_logprobs"));
        assert!(SamplingParams {
            logit_bias: vec![(9, 1.0)],
            ..d()
        }
        .validate_vocab(8)
        .is_err());
    }
}
