//! What a step asks of a device besides the forward pass: how each logits row picks its token
//! ([`RowSampling`], [`DeviceSample`]), the processors' edits ([`LogitEdits`]) and the
//! grammars' masks ([`RowMasks`]), planned once per step ([`StepPlan`]).

use crate::error::EngineError;

/// How to pick one row's token on the device (layout shared with `sampling.cu`'s `RowParams`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// 0 (or `top_k == 1`) means greedy.
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    /// 0 means off.
    pub min_p: f32,
    pub seed: u64,
    /// The request's output index: with the seed, it fixes the random draw.
    pub step: u64,
}

impl RowSampling {
    /// Greedy selection (argmax), as a decode step of a benchmark uses.
    pub fn greedy() -> Self {
        RowSampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            step: 0,
        }
    }

    /// Row sampling for output token `step` of a request sampling with `p`, seeded `seed`.
    pub fn new(p: &crate::sampler::SamplingParams, seed: u64, step: u64) -> Self {
        RowSampling {
            temperature: p.temperature,
            top_k: p.top_k.min(i32::MAX as usize) as i32,
            top_p: p.top_p,
            min_p: p.min_p,
            seed,
            step,
        }
    }

    fn words(&self) -> [u32; 8] {
        [
            self.temperature.to_bits(),
            self.top_k as u32,
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            self.seed as u32,
            (self.seed >> 32) as u32,
            self.step as u32,
            (self.step >> 32) as u32,
        ]
    }
    /// The rows as the 32-bit words the device kernel reads.
    pub fn to_words(rows: &[RowSampling]) -> Vec<u32> {
        rows.iter().flat_map(|r| r.words()).collect()
    }
}

/// The processors' edits of a step's logits, flattened: entry `i` sets `x ← (x > 0 ? x ·
/// pos[i] : x · neg[i]) + add[i]` at `(row[i], token[i])`; a (row, token) appears at most once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitEdits {
    pub row: Vec<u32>,
    pub token: Vec<u32>,
    pub pos: Vec<f32>,
    pub neg: Vec<f32>,
    pub add: Vec<f32>,
}

impl LogitEdits {
    pub fn len(&self) -> usize {
        self.row.len()
    }
    pub fn is_empty(&self) -> bool {
        self.row.is_empty()
    }
    pub fn push_row(&mut self, row: usize, edits: &[crate::sampler::TokenEdit]) {
        for e in edits {
            self.row.push(row as u32);
            self.token.push(e.token);
            self.pos.push(e.pos);
            self.neg.push(e.neg);
            self.add.push(e.add);
        }
    }
    /// Checks rows and tokens against a `[rows, vocab]` logits tensor.
    pub fn validate(&self, rows: usize, vocab: usize) -> Result<(), EngineError> {
        let n = self.row.len();
        if [
            self.token.len(),
            self.pos.len(),
            self.neg.len(),
            self.add.len(),
        ] != [n; 4]
        {
            return Err(EngineError::InvalidBatch("ragged logit edits".into()));
        }
        if self.row.iter().any(|&r| r as usize >= rows)
            || self.token.iter().any(|&t| t as usize >= vocab)
        {
            return Err(EngineError::InvalidBatch(format!(
                "a logit edit outside the {rows} × {vocab} logits"
            )));
        }
        Ok(())
    }
}

/// Grammar masks of some of a step's logits rows (see [`Device::mask_logits`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowMasks {
    pub rows: Vec<u32>,
    pub words: usize,
    /// `rows.len() × words`.
    pub bits: Vec<u32>,
}

impl RowMasks {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// Checks the shape against `[rows, vocab]` logits.
    pub fn validate(&self, rows: usize, vocab: usize) -> Result<(), EngineError> {
        if self.is_empty() {
            return Ok(());
        }
        if self.words != vocab.div_ceil(32)
            || self.bits.len() != self.rows.len() * self.words
            || self.rows.iter().any(|&r| r as usize >= rows)
        {
            return Err(EngineError::InvalidBatch(format!(
                "grammar masks of {} words for {} rows do not fit {rows} × {vocab} logits",
                self.words,
                self.rows.len()
            )));
        }
        Ok(())
    }
}

/// What a step does with its logits rows: how each picks its token, the processors' edits, the
/// grammar masks, and how many top alternatives each row's log-probabilities carry (-1: none
/// wanted).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPlan {
    pub rows: Vec<RowSampling>,
    pub edits: LogitEdits,
    pub masks: RowMasks,
    pub logprobs: Vec<i32>,
}

impl StepPlan {
    /// Greedy rows, no edits, no log-probabilities (benchmarks' steps).
    pub fn greedy(rows: usize) -> Self {
        StepPlan {
            rows: vec![RowSampling::greedy(); rows],
            edits: LogitEdits::default(),
            masks: RowMasks::default(),
            logprobs: vec![-1; rows],
        }
    }
    pub fn wants_logprobs(&self) -> bool {
        self.logprobs.iter().any(|&n| n >= 0)
    }
}

/// Tokens chosen on the device, one per row, and the log-probabilities asked for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceSample {
    pub ids: Vec<u32>,
    pub logprobs: Vec<Option<crate::sampler::RowLogprobs>>,
}
