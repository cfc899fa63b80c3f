//! Prefix block hashes, shared by the gateway (routing) and the engine (prefix cache).
//!
//! A prompt's full blocks (default 16 tokens; a partial last block is never hashed) are chained:
//!
//! ```text
//! h0 = blake3_keyed(key, "cachet-v1" ‖ salt[32] ‖ u32(len model_id) ‖ model_id ‖ u32(n) ‖ tokens[0..n] as u32)
//! hi = blake3_keyed(key, h(i-1)[32] ‖ u32(n) ‖ tokens[n·i..n·i+n] as u32 ‖ u32(len extra) ‖ extra)
//! ```
//!
//! all integers little-endian. `key` is the deployment's secret; `salt` comes from the
//! authenticated tenant (never from the client), so one tenant's cache entries are unreachable from
//! another's prompts and its hit/miss timing reveals nothing (vLLM CVE-2025-46570). Tenants who opt
//! into sharing a public system prompt share a salt. `extra` carries anything else that changes
//! a block's K/V (e.g. a LoRA id); empty by default. Checked against
//! `tests/fixtures/block_hash_vectors.json`, computed by an independent blake3 (Python `blake3`).

use serde::{Deserialize, Serialize};

/// The domain tag of the first block.
pub const TAG: &[u8] = b"cachet-v1";

/// One block's hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlockHash(pub [u8; 32]);

impl std::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl BlockHash {
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Everything a block hash depends on besides the tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashContext {
    pub key: [u8; 32],
    pub salt: [u8; 32],
    pub model_id: String,
    pub block_size: usize,
    pub extra: Vec<u8>,
}

impl HashContext {
    pub fn new(
        key: [u8; 32],
        salt: [u8; 32],
        model_id: impl Into<String>,
        block_size: usize,
    ) -> Self {
        HashContext {
            key,
            salt,
            model_id: model_id.into(),
            block_size,
            extra: Vec::new(),
        }
    }

    /// Hash of the first block.
    pub fn first(&self, tokens: &[u32]) -> BlockHash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(TAG);
        h.update(&self.salt);
        h.update(&(self.model_id.len() as u32).to_le_bytes());
        h.update(self.model_id.as_bytes());
        put_tokens(&mut h, tokens);
        BlockHash(*h.finalize().as_bytes())
    }

    /// Hash of a block after `parent`.
    pub fn next(&self, parent: &BlockHash, tokens: &[u32]) -> BlockHash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&parent.0);
        put_tokens(&mut h, tokens);
        h.update(&(self.extra.len() as u32).to_le_bytes());
        h.update(&self.extra);
        BlockHash(*h.finalize().as_bytes())
    }

    /// Extends `hashes` (the chain of `tokens`' first `hashes.len()` full blocks) to every full
    /// block of `tokens`.
    pub fn extend(&self, hashes: &mut Vec<BlockHash>, tokens: &[u32]) {
        let bs = self.block_size;
        while (hashes.len() + 1) * bs <= tokens.len() {
            let i = hashes.len();
            let blk = &tokens[i * bs..(i + 1) * bs];
            let h = match hashes.last() {
                None => self.first(blk),
                Some(p) => self.next(p, blk),
            };
            hashes.push(h);
        }
    }

    /// Hashes of every full block of `tokens`.
    pub fn hash_all(&self, tokens: &[u32]) -> Vec<BlockHash> {
        let mut v = Vec::with_capacity(tokens.len() / self.block_size);
        self.extend(&mut v, tokens);
        v
    }
}

fn put_tokens(h: &mut blake3::Hasher, tokens: &[u32]) {
    h.update(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
}

/// A tenant's salt: derived from the deployment key and the tenant's identity, never supplied by a
/// client. Tenants in the same `share_group` get the same salt.
pub fn tenant_salt(key: &[u8; 32], tenant_or_group: &str) -> [u8; 32] {
    *blake3::Hasher::new_derive_key("cachet-v1 tenant salt")
        .update(key)
        .update(tenant_or_group.as_bytes())
        .finalize()
        .as_bytes()
}
