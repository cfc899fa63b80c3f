//! Per-request block tables over the [`BlockPool`]: what the scheduler sees of the KV cache.
//!
//! Four calls: [`KvCacheManager::computed_blocks`] (prefix hit), [`KvCacheManager::allocate_slots`]
//! (`false` → the scheduler must preempt or wait), [`KvCacheManager::free`], and usage. Full blocks
//! are registered in the prefix cache the moment they are scheduled to fill, so a request later in
//! the same step can share them: a step writes every token's K/V before any attention reads it.
//!
//! A model whose every layer attends over a sliding window ([`KvCacheManager::set_window`]) never
//! reads a token again once it is a whole window (and the attention kernels' read margin) behind
//! the next query: such blocks are handed back to the pool as the request moves on — their
//! memory reused, their content still a cached prefix until evicted. Their ids stay in the
//! request's table, at their positions, never read again.

use std::collections::HashMap;

use super::block_pool::{BlockId, BlockPool, KvEvent, Owner, PoolUsage};
use crate::block_hash::BlockHash;

pub type ReqKey = u64;

#[derive(Debug, Default)]
struct ReqBlocks {
    blocks: Vec<BlockId>,
    /// Leading blocks already registered in the prefix cache.
    num_cached: usize,
    /// Leading blocks handed back behind the sliding window (no longer this request's).
    num_dropped: usize,
}

/// Tokens before a query's window that the attention kernels may still read: they start at the
/// key tile (64 keys: `ATT_TK`, `MMA_TK`) holding the window's first key.
pub const WINDOW_READ_TILE: usize = 64;

/// The owner that public-prefix blocks count under (their share: one tenant's).
pub const PUBLIC_OWNER: &str = "(public)";

#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    reqs: HashMap<ReqKey, ReqBlocks>,
    /// Each request's owner, and how many of its leading blocks are public (everyone's).
    owners: HashMap<ReqKey, (Owner, usize)>,
    /// The window every layer attends over, when every layer slides.
    window: Option<usize>,
}

/// A prefix hit: blocks to reuse and how many tokens they hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    pub blocks: Vec<BlockId>,
    pub num_tokens: usize,
}

impl KvCacheManager {
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        cache_cap: f64,
        enable_prefix_caching: bool,
    ) -> Self {
        KvCacheManager {
            pool: BlockPool::new(num_blocks, cache_cap, enable_prefix_caching),
            block_size,
            reqs: HashMap::new(),
            owners: HashMap::new(),
            window: None,
        }
    }

    /// Every layer attends over at most `window` keys (a model whose layers all slide): blocks
    /// behind it are handed back as requests move on. `None`: a request keeps all its blocks.
    pub fn set_window(&mut self, window: Option<usize>) {
        self.window = window;
    }

    /// The blocks `req` caches count in tenant `tenant`'s share (`share`) of the idle cache,
    /// except its first `public_blocks`, which are everyone's (the public prefix's owner).
    pub fn set_owner(&mut self, req: ReqKey, tenant: &str, share: f32, public_blocks: usize) {
        let o = self.pool.owner(tenant, share);
        self.owners.insert(req, (o, public_blocks));
    }

    /// `req` is gone for good (not preempted): forgets its owner.
    pub fn forget(&mut self, req: ReqKey) {
        self.owners.remove(&req);
    }

    /// Evicts by one LRU for everyone (`false`) instead of by tenant share.
    pub fn set_cache_shares(&mut self, on: bool) {
        self.pool.set_by_owner(on);
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    pub fn usage(&self) -> PoolUsage {
        self.pool.usage()
    }
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.pool.take_events()
    }
    pub fn block_table(&self, req: ReqKey) -> &[BlockId] {
        self.reqs.get(&req).map_or(&[], |r| &r.blocks)
    }

    /// The longest cached prefix of a request with `num_tokens` tokens and these full-block
    /// hashes. At least one token is always left to compute (its logits are needed).
    pub fn computed_blocks(&self, hashes: &[BlockHash], num_tokens: usize) -> ComputedBlocks {
        if !self.pool.caching() || num_tokens == 0 {
            return ComputedBlocks::default();
        }
        let max_blocks = (num_tokens - 1) / self.block_size;
        let blocks: Vec<BlockId> = hashes
            .iter()
            .take(max_blocks)
            .map_while(|h| self.pool.lookup(h))
            .collect();
        ComputedBlocks {
            num_tokens: blocks.len() * self.block_size,
            blocks,
        }
    }

    /// Makes room for `num_new` more tokens after `num_computed` (which include `hit`, the prefix
    /// hit taken on a request's first allocation). Registers every full block whose hash is known.
    /// Returns `false`, changing nothing, if the pool has too few free blocks.
    pub fn allocate_slots(
        &mut self,
        req: ReqKey,
        hit: &ComputedBlocks,
        num_computed: usize,
        num_new: usize,
        hashes: &[BlockHash],
    ) -> bool {
        let have = self.reqs.get(&req).map_or(0, |r| r.blocks.len()) + hit.blocks.len();
        let need = (num_computed + num_new)
            .div_ceil(self.block_size)
            .saturating_sub(have);
        // Touching a hit block that sits idle in the cache takes it out of the free count too.
        let idle_hits = hit
            .blocks
            .iter()
            .filter(|&&b| self.pool.ref_cnt(b) == 0)
            .count();
        if need + idle_hits > self.pool.num_free() {
            return false;
        }
        self.pool.touch(&hit.blocks);
        let new = self.pool.allocate(need).expect("free count checked");
        let entry = self.reqs.entry(req).or_default();
        if entry.blocks.is_empty() {
            entry.num_cached = hit.blocks.len();
        }
        entry.blocks.extend_from_slice(&hit.blocks);
        entry.blocks.extend(new);
        let full = ((num_computed + num_new) / self.block_size).min(hashes.len());
        let start = entry.num_cached.min(full);
        let (owner, public_blocks) = self.owners.get(&req).copied().unwrap_or((0, 0));
        let public = if public_blocks > start {
            self.pool.owner(PUBLIC_OWNER, 1.0)
        } else {
            owner
        };
        for (i, (&b, &h)) in entry.blocks[start..full]
            .iter()
            .zip(&hashes[start..full])
            .enumerate()
        {
            let owner = if start + i < public_blocks {
                public
            } else {
                owner
            };
            self.pool.cache_block_for(b, h, owner);
        }
        entry.num_cached = entry.num_cached.max(full);
        // Queries from `num_computed` on read keys from the kernel tile holding their window's
        // start: the blocks wholly before it are never read again.
        if let Some(w) = self.window {
            let read_from =
                (num_computed + 1).saturating_sub(w) / WINDOW_READ_TILE * WINDOW_READ_TILE;
            let behind = (read_from / self.block_size).min(entry.blocks.len());
            if behind > entry.num_dropped {
                let gone = entry.blocks[entry.num_dropped..behind].to_vec();
                entry.num_dropped = behind;
                self.pool.free(gone.into_iter().rev());
            }
        }
        true
    }

    /// Returns a request's blocks to the pool, last block first.
    pub fn free(&mut self, req: ReqKey) {
        if let Some(r) = self.reqs.remove(&req) {
            self.pool
                .free(r.blocks.into_iter().skip(r.num_dropped).rev());
        }
    }

    /// Blocks `req` holds (those handed back behind a sliding window not counted).
    pub fn num_held(&self, req: ReqKey) -> usize {
        self.reqs
            .get(&req)
            .map_or(0, |r| r.blocks.len() - r.num_dropped)
    }

    /// Drops the blocks past `num_tokens` (rolled-back speculative slots).
    pub fn truncate(&mut self, req: ReqKey, num_tokens: usize) {
        if let Some(r) = self.reqs.get_mut(&req) {
            let keep = num_tokens.div_ceil(self.block_size).max(r.num_dropped);
            if r.blocks.len() > keep {
                let extra: Vec<BlockId> = r.blocks.drain(keep..).collect();
                self.pool.free(extra.into_iter().rev());
            }
        }
    }

    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }
}
