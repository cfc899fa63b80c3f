//! The wire format of `cachet worker` (JSON bodies, NDJSON streams), shared by the worker's
//! server (`worker`) and the gateway's client of it (`upstream::worker`), and the hex forms of
//! hashes and keys used on the wire and in config files.
//!
//! ```text
//! GET  /health          liveness
//! GET  /v1/state        StateReply: model, block size, key id, load (running / waiting / KV use)
//! POST /v1/generate     GenerateRequest in, NDJSON WireEvents out; closing the connection
//!                       cancels the request
//! GET  /v1/kv_events    NDJSON KvWire: a snapshot of the stored block hashes, then every change
//! ```

use cachet_backend::block_hash::BlockHash;
use cachet_backend::request::{EngineEvent, FinishReason, RequestTimings, Usage};
use cachet_backend::sampler::{RowLogprobs, SamplingParams};
use serde::{Deserialize, Serialize};

/// `POST /v1/generate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// Temperature, truncation, seed, the logits processors and the log-probabilities wanted
    /// (absent fields take their defaults: greedy, no processors).
    #[serde(default)]
    pub sampling: SamplingParams,
    /// What the output must match (structured outputs).
    #[serde(default)]
    pub constraint: Option<cachet_backend::grammar::Constraint>,
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
    /// Leading prompt blocks inside an operator-declared public prefix (hashed without the
    /// salt, so every tenant shares them).
    #[serde(default)]
    pub public_blocks: usize,
    /// The tenant's weight under fair sharing.
    #[serde(default = "one")]
    pub share: f32,
    /// Milliseconds the request may take from its arrival at the worker; past it the worker
    /// ends it with an error (the gateway's request timeout, less what it already spent).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
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
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logprobs: Option<RowLogprobs>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
        timings: RequestTimings,
        error: Option<String>,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_sequence: Option<String>,
    },
}

impl From<EngineEvent> for WireEvent {
    /// An engine event as the worker sends it (a token's arrival time stays on the worker).
    fn from(ev: EngineEvent) -> Self {
        match ev {
            EngineEvent::Token {
                id, text, logprobs, ..
            } => WireEvent::Token { id, text, logprobs },
            EngineEvent::Finished {
                reason,
                usage,
                timings,
                error,
                text,
                stop_sequence,
            } => WireEvent::Finished {
                reason,
                usage,
                timings,
                error,
                text,
                stop_sequence,
            },
        }
    }
}

impl WireEvent {
    /// The engine event a line of the wire stands for, a token timed on its arrival here.
    pub fn into_event(self, at: std::time::Instant) -> EngineEvent {
        match self {
            WireEvent::Token { id, text, logprobs } => EngineEvent::Token {
                id,
                text,
                at,
                logprobs,
            },
            WireEvent::Finished {
                reason,
                usage,
                timings,
                error,
                text,
                stop_sequence,
            } => EngineEvent::Finished {
                reason,
                usage,
                timings,
                error,
                text,
                stop_sequence,
            },
        }
    }
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

/// Lowercase hex of `bytes` (on the request path: the salt sent upstream, call ids — no
/// formatter per byte).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// 64 hex digits → 32 bytes.
pub fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let v: Option<Vec<u8>> = (0..32)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    v?.try_into().ok()
}

pub fn hex_hash(h: &BlockHash) -> String {
    hex(&h.0)
}

pub fn parse_hash(s: &str) -> Option<BlockHash> {
    parse_hex32(s).map(BlockHash)
}

/// A short, public id of a deployment key: the first 8 bytes of blake3("cachet key id" ‖ key).
/// Equal ids mean equal keys, so a gateway can check its workers hash prompts as it does.
pub fn key_id(key: &[u8; 32]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"cachet key id");
    h.update(key);
    h.finalize().to_hex()[..16].to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_lowercase_two_digits_a_byte_and_parses_back() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0xa5);
        let h = super::hex(&bytes);
        let formatted: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(h, formatted);
        assert_eq!(super::parse_hex32(&h), Some(bytes));
        assert_eq!(super::hex(&[0x00, 0x0f, 0xf0, 0xff]), "000ff0ff");
    }
}
