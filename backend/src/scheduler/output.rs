//! The records that cross the scheduler's boundary: what a step plans ([`SchedulerOutput`], a
//! plain record the runner turns into a device batch) and what the step sampled
//! ([`SampledSeq`], fed back to [`super::Scheduler::update`]).

use crate::request::FinishReason;
use crate::sampler::{RowLogprobs, SamplingParams, TokenEdit};

pub type RequestId = u64;

/// One scheduled piece of work: everything the runner needs to compute it and sample after it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduledSeq {
    pub id: RequestId,
    /// Tokens in the cache before this step (cached prefix and earlier steps).
    pub num_computed: usize,
    /// The tokens this step computes, at positions `num_computed..`: a prefill chunk, one
    /// decode token, or the last known token followed by `drafts`.
    pub tokens: Vec<u32>,
    /// The request's physical KV blocks, covering every position up to `num_computed +
    /// tokens.len()`.
    pub block_table: Vec<u32>,
    /// Whether this step reaches the end of the known tokens, so a token is sampled.
    pub sample: bool,
    /// Draft tokens computed after the last known one (the tail of `tokens`), each with logits.
    pub drafts: Vec<u32>,
    /// How the request samples, its seed (the request's or one drawn from its id) and how many
    /// tokens it has generated so far (with the seed, it fixes a device sampler's draw).
    pub sampling: SamplingParams,
    pub seed: u64,
    pub num_output: usize,
    /// The logits processors' edits, one list per logits row (empty: none).
    pub edits: Vec<Vec<TokenEdit>>,
}

impl ScheduledSeq {
    /// Tokens this step computes.
    pub fn num_new(&self) -> usize {
        self.tokens.len()
    }
    /// Logits rows this entry asks for: one per sampled position.
    pub fn num_logit_rows(&self) -> usize {
        if self.sample {
            1 + self.drafts.len()
        } else {
            0
        }
    }
}

/// The plain record a step hands to the runner.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerOutput {
    pub scheduled: Vec<ScheduledSeq>,
    /// Requests preempted this step (their blocks freed; they wait to be recomputed).
    pub preempted: Vec<RequestId>,
    pub num_batched_tokens: usize,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }

    /// New tokens of every scheduled entry, drafts included.
    pub fn num_new_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.num_new()).sum()
    }
}

/// What sampling made of one scheduled entry, in `scheduled` order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampledSeq {
    /// Tokens to append: none for a prefill chunk that does not reach the end of the prompt;
    /// otherwise the accepted drafts, then the model's own token.
    pub tokens: Vec<u32>,
    /// How many leading `tokens` are accepted drafts.
    pub accepted_drafts: usize,
    /// One per token when the request asked for log-probabilities.
    pub logprobs: Vec<RowLogprobs>,
}

/// A token produced by a step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepToken {
    pub id: RequestId,
    pub token: u32,
    /// Set when this token ends the request (stop token, length, model length).
    pub finish: Option<FinishReason>,
    pub logprobs: Option<RowLogprobs>,
}
