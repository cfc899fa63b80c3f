//! The worker's wire format (JSON bodies, NDJSON streams), shared by `cachet worker` and the
//! gateway's client of it.

use cachet_backend::block_hash::BlockHash;
use cachet_backend::request::{FinishReason, RequestTimings, Usage};
use serde::{Deserialize, Serialize};

/// `POST /v1/generate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    #[serde(default = "one")]
    pub temperature: f32,
    #[serde(default = "one")]
    pub top_p: f32,
    #[serde(default)]
    pub top_k: usize,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Vec<String>,
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    #[serde(default)]
    pub ignore_eos: bool,
    /// The tenant's cache salt, 64 hex digits (computed by the gateway, never by a client).
    pub salt: String,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub tag: String,
}

fn one() -> f32 {
    1.0
}

/// One line of a `/v1/generate` stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireEvent {
    Token {
        id: u32,
        text: String,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
        timings: RequestTimings,
        error: Option<String>,
        text: String,
    },
}

/// One line of a `/v1/kv_events` stream; `seq` orders them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvWire {
    /// Every block hash the worker holds now.
    Snapshot {
        seq: u64,
        blocks: Vec<String>,
    },
    Stored {
        seq: u64,
        blocks: Vec<String>,
    },
    Removed {
        seq: u64,
        blocks: Vec<String>,
    },
    Cleared {
        seq: u64,
    },
}

/// `GET /v1/state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateReply {
    pub model: String,
    pub block_size: usize,
    pub max_model_len: usize,
    /// See `worker::key_id`: equal ids mean equal deployment keys.
    pub key_id: String,
    pub running: usize,
    pub waiting: usize,
    pub kv_total: usize,
    pub kv_used: usize,
    pub cached_blocks: usize,
}

pub fn hex_hash(h: &BlockHash) -> String {
    crate::tenants::hex(&h.0)
}

pub use crate::tenants::parse_hex32;

pub fn parse_hash(s: &str) -> Option<BlockHash> {
    parse_hex32(s).map(BlockHash)
}
