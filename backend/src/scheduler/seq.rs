//! [`Seq`]: one request inside the scheduler — its tokens (prompt, then output), how many are
//! computed, its block hashes and timestamps.

use std::time::Instant;

use crate::block_hash::{BlockHash, HashContext};
use crate::request::{EngineRequest, FinishReason};
use crate::sampler::{self, TokenEdit, TokenHistory};
use crate::spec::SpecState;

use super::output::RequestId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Waiting,
    Running,
}

/// A request inside the scheduler.
#[derive(Debug)]
pub struct Seq {
    pub id: RequestId,
    pub req: EngineRequest,
    /// Prompt followed by output.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub num_computed: usize,
    pub status: Status,
    pub arrival: Instant,
    /// Arrival order, for stable tie-breaks.
    pub seq_no: u64,
    pub hasher: HashContext,
    pub block_hashes: Vec<BlockHash>,
    /// Prompt tokens found in the prefix cache at first scheduling.
    pub cached_tokens: Option<usize>,
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub preemptions: u32,
    /// N-gram speculation, when the engine speculates and this request may.
    pub spec: Option<SpecState>,
    /// What the logits processors (penalties, `min_tokens`) need to know of its tokens.
    pub history: TokenHistory,
}

impl Seq {
    pub fn num_output(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Appends a generated token (hashing any block it completes) and says whether it ends the
    /// request: a stop token, `max_tokens`, or the model's length.
    pub(super) fn append(
        &mut self,
        tok: u32,
        now: Instant,
        max_model_len: usize,
    ) -> Option<FinishReason> {
        self.tokens.push(tok);
        self.history.push(tok);
        self.hasher.extend(&mut self.block_hashes, &self.tokens);
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        if !self.req.ignore_eos && self.req.stop_token_ids.contains(&tok) {
            Some(FinishReason::Stop)
        } else if self.num_output() >= self.req.max_tokens || self.tokens.len() >= max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// The processors' edits of each logits row of a step that samples after `drafts` (row `j`
    /// follows the first `j` drafts); empty rows when the request has no processors.
    pub fn row_edits(&self, drafts: &[u32]) -> Vec<Vec<TokenEdit>> {
        let stop: &[u32] = if self.req.ignore_eos {
            &[]
        } else {
            &self.req.stop_token_ids
        };
        (0..=drafts.len())
            .map(|j| sampler::row_edits(&self.req.sampling, &self.history, &drafts[..j], stop))
            .collect()
    }

    /// The request's sampling seed: its own, or one drawn from its id.
    pub fn seed(&self) -> u64 {
        self.req
            .sampling
            .seed
            .unwrap_or(self.id.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}
