//! What a client submits to the engine, and what it gets back.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sampler::{RowLogprobs, SamplingParams};

/// An engine request: token ids + sampling + tenant salt + priority + deadline.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Stop when one of these is generated (the model's EOS ids are added unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Stop when the generated text contains one of these; the text stops before it.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Cache salt of the authenticated tenant: requests with different salts never share KV.
    pub salt: [u8; 32],
    /// Leading full blocks of the prompt wholly inside an operator-declared public prefix:
    /// hashed without the tenant's salt, so every tenant shares them (see
    /// [`crate::block_hash`]). Set by the gateway, never from a client's word.
    pub public_blocks: usize,
    /// Lower runs first under the `priority` policy (a tenant tier, say).
    pub priority: i32,
    /// Give up (finish with an error) if not finished by then.
    pub deadline: Option<Instant>,
    /// The W3C `traceparent` of the request's trace, passed on to remote engines (workers,
    /// OpenAI-compatible servers) as a header; the local engine does not read it.
    pub trace_parent: Option<String>,
    /// The gateway's id of the request (`x-request-id`), passed on to remote engines as that
    /// header; the local engine does not read it.
    pub request_id: Option<String>,
    /// The tenant (or another label) the request belongs to: carried into logs and events, and
    /// the group fair sharing counts tokens by.
    pub tag: String,
    /// The tenant's weight under fair sharing (> 0; 1 by default): a tenant of share 2 gets
    /// twice the tokens of a tenant of share 1 when both have work waiting.
    pub share: f32,
    /// What the output must match (structured outputs); the request finishes when the grammar
    /// is complete.
    pub constraint: Option<crate::grammar::Constraint>,
}

impl EngineRequest {
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        EngineRequest {
            prompt,
            sampling: SamplingParams::greedy(),
            max_tokens,
            stop_token_ids: vec![],
            stop: vec![],
            ignore_eos: false,
            salt: [0; 32],
            public_blocks: 0,
            priority: 0,
            deadline: None,
            trace_parent: None,
            request_id: None,
            tag: String::new(),
            share: 1.0,
            constraint: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
    Error,
}

impl FinishReason {
    /// OpenAI's `finish_reason` string.
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// Server-side timings of one request.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct RequestTimings {
    /// Arrival → first scheduled.
    pub queue: Duration,
    /// First scheduled → first token (prefill, chunks and waits between them included).
    pub prefill: Duration,
    /// Arrival → first token.
    pub ttft: Duration,
    /// Arrival → finish.
    pub e2e: Duration,
    /// Mean time between output tokens after the first.
    pub mean_itl: Duration,
    pub preemptions: u32,
}

/// One event of a request's stream.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// A generated token and the text it completes (may be empty while a multi-byte character or
    /// a possible stop string is held back).
    Token {
        id: u32,
        text: String,
        at: Instant,
        /// When the request asked for log-probabilities.
        logprobs: Option<RowLogprobs>,
    },
    /// The last event of every stream.
    Finished {
        reason: FinishReason,
        usage: Usage,
        timings: RequestTimings,
        error: Option<String>,
        text: String,
        /// The stop string that ended the text, when one did (`reason` is then `Stop`).
        stop_sequence: Option<String>,
    },
}
