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
//! into sharing everything share a salt (`cache_share_group`). `extra` carries anything else that
//! changes a block's K/V (e.g. a LoRA id); empty by default. Checked against
//! `tests/fixtures/block_hash_vectors.json`, computed by an independent blake3 (Python `blake3`).
//!
//! **Public prefixes.** A request whose first `P` blocks lie wholly inside an operator-declared
//! public prefix (`public_blocks` = P > 0) hashes them under the deployment's *public* salt
//! (derived from the key, never a tenant's), so every tenant hits them; block P — the first that
//! holds anything else — mixes the tenant's salt back in, and every block after chains from it:
//!
//! ```text
//! hP = blake3_keyed(key, h(P-1)[32] ‖ u32(n) ‖ tokens ‖ u32(len extra) ‖ extra ‖ salt[32])
//! ```
//!
//! so nothing past the public part is ever shared, and no tenant can probe another's suffix.

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
    /// Leading blocks hashed under the public salt (wholly inside a declared public prefix).
    pub public_blocks: usize,
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
            public_blocks: 0,
        }
    }

    /// Hash of the first block (under the tenant's salt).
    pub fn first(&self, tokens: &[u32]) -> BlockHash {
        self.first_under(&self.salt, tokens)
    }

    fn first_under(&self, salt: &[u8; 32], tokens: &[u32]) -> BlockHash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(TAG);
        h.update(salt);
        h.update(&(self.model_id.len() as u32).to_le_bytes());
        h.update(self.model_id.as_bytes());
        put_tokens(&mut h, tokens);
        BlockHash(*h.finalize().as_bytes())
    }

    /// Hash of a block after `parent`.
    pub fn next(&self, parent: &BlockHash, tokens: &[u32]) -> BlockHash {
        self.next_hasher(parent, tokens).finalize().into()
    }

    /// Hash of the first block after a public prefix: the tenant's salt joins the chain again.
    fn next_salted(&self, parent: &BlockHash, tokens: &[u32]) -> BlockHash {
        self.next_hasher(parent, tokens)
            .update(&self.salt)
            .finalize()
            .into()
    }

    fn next_hasher(&self, parent: &BlockHash, tokens: &[u32]) -> blake3::Hasher {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&parent.0);
        put_tokens(&mut h, tokens);
        h.update(&(self.extra.len() as u32).to_le_bytes());
        h.update(&self.extra);
        h
    }

    /// Extends `hashes` (the chain of `tokens`' first `hashes.len()` full blocks) to every full
    /// block of `tokens`.
    pub fn extend(&self, hashes: &mut Vec<BlockHash>, tokens: &[u32]) {
        let bs = self.block_size;
        while (hashes.len() + 1) * bs <= tokens.len() {
            let i = hashes.len();
            let blk = &tokens[i * bs..(i + 1) * bs];
            let h = match hashes.last() {
                None if self.public_blocks > 0 => self.first_under(&public_salt(&self.key), blk),
                None => self.first(blk),
                Some(p) if i == self.public_blocks => self.next_salted(p, blk),
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

impl From<blake3::Hash> for BlockHash {
    fn from(h: blake3::Hash) -> Self {
        BlockHash(*h.as_bytes())
    }
}

/// The salt of public-prefix blocks: derived from the deployment key under its own context, so
/// it equals no tenant's salt.
pub fn public_salt(key: &[u8; 32]) -> [u8; 32] {
    *blake3::Hasher::new_derive_key("cachet-v1 public prefix salt")
        .update(key)
        .finalize()
        .as_bytes()
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
