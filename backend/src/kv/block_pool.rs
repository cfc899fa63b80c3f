//! The KV block pool: every block allocated up front, ref-counted, with a prefix cache.
//!
//! - Free blocks that hold a cached prefix (a hash) sit in an LRU queue per owner — the tenant whose
//!   request computed them (doubly linked over block ids, O(1) push/pop/remove). Eviction takes the
//!   head of the owner furthest over its share of the idle cache (its idle blocks divided by its
//!   share; shares default equal), so one tenant scanning unique prompts evicts its own blocks
//!   before another's hot prefix. One owner: one LRU, as before. A request's blocks are freed
//!   tail-first, so its last block, the least likely to be shared, is evicted first.
//! - Free blocks without a hash sit in a plain stack and are reused before any cached block.
//! - A freed block keeps its hash (and stays findable) until it is reused or the idle-cache cap
//!   (`max_cached_idle` blocks) pushes it out.
//! - Every change to what is cached is recorded as a [`KvEvent`] for exact routing.

use std::collections::HashMap;

use crate::block_hash::BlockHash;

pub type BlockId = u32;
/// An owner of cached blocks (a tenant), interned by the pool; 0 is nobody's.
pub type Owner = u32;
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    in_lru: bool,
    owner: Owner,
}

/// One owner's idle cached blocks: its LRU list and its share.
#[derive(Debug, Clone)]
struct OwnerLru {
    name: String,
    share: f64,
    head: u32,
    tail: u32,
    len: usize,
}

impl OwnerLru {
    fn new(name: &str, share: f64) -> Self {
        OwnerLru {
            name: name.to_string(),
            share,
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

/// What changed in the prefix cache.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KvEvent {
    Stored { hashes: Vec<BlockHash> },
    Removed { hashes: Vec<BlockHash> },
    Cleared,
}

/// Counts of blocks by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct PoolUsage {
    pub total: usize,
    /// Referenced by at least one request.
    pub used: usize,
    /// Free, but holding a cached prefix.
    pub cached_idle: usize,
    /// Free and empty.
    pub free_plain: usize,
}

#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    plain: Vec<BlockId>,
    owners: Vec<OwnerLru>,
    owner_ids: HashMap<String, Owner>,
    /// Evict by owner share (else every block is owner 0's: one LRU).
    by_owner: bool,
    lru_len: usize,
    cached: HashMap<BlockHash, BlockId>,
    max_cached_idle: usize,
    caching: bool,
    events: Vec<KvEvent>,
}

impl BlockPool {
    /// `num_blocks` blocks; idle cached blocks may keep at most `cache_cap` (a share of the pool,
    /// 0..=1) of it. `caching = false` turns the prefix cache off.
    pub fn new(num_blocks: usize, cache_cap: f64, caching: bool) -> Self {
        let blocks = vec![
            Block {
                ref_cnt: 0,
                hash: None,
                prev: NIL,
                next: NIL,
                in_lru: false,
                owner: 0,
            };
            num_blocks
        ];
        BlockPool {
            blocks,
            // Lowest ids first out.
            plain: (0..num_blocks as u32).rev().collect(),
            owners: vec![OwnerLru::new("", 1.0)],
            owner_ids: HashMap::new(),
            by_owner: true,
            lru_len: 0,
            cached: HashMap::new(),
            max_cached_idle: (cache_cap.clamp(0.0, 1.0) * num_blocks as f64).floor() as usize,
            caching,
            events: Vec::new(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }
    pub fn caching(&self) -> bool {
        self.caching
    }
    /// Blocks an allocation can take now (empty plus evictable).
    pub fn num_free(&self) -> usize {
        self.plain.len() + self.lru_len
    }
    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            total: self.blocks.len(),
            used: self.blocks.len() - self.num_free(),
            cached_idle: self.lru_len,
            free_plain: self.plain.len(),
        }
    }
    pub fn ref_cnt(&self, b: BlockId) -> u32 {
        self.blocks[b as usize].ref_cnt
    }
    pub fn hash_of(&self, b: BlockId) -> Option<BlockHash> {
        self.blocks[b as usize].hash
    }
    /// The cached-idle queues, each head (next evicted) first, owners in the order they came.
    pub fn lru_order(&self) -> Vec<BlockId> {
        let mut v = Vec::with_capacity(self.lru_len);
        for o in &self.owners {
            let mut cur = o.head;
            while cur != NIL {
                v.push(cur);
                cur = self.blocks[cur as usize].next;
            }
        }
        v
    }

    /// Evicts by one LRU for everyone (`false`) instead of by owner share.
    pub fn set_by_owner(&mut self, on: bool) {
        self.by_owner = on;
    }

    /// The owner id of tenant `name`, whose share of the idle cache is `share` (a weight).
    pub fn owner(&mut self, name: &str, share: f32) -> Owner {
        if !self.by_owner {
            return 0;
        }
        let share = (share as f64).max(1e-3);
        if let Some(&id) = self.owner_ids.get(name) {
            self.owners[id as usize].share = share;
            return id;
        }
        let id = self.owners.len() as Owner;
        self.owners.push(OwnerLru::new(name, share));
        self.owner_ids.insert(name.to_string(), id);
        id
    }

    /// Idle cached blocks per owner (tenant), for metrics; owners with none are left out.
    pub fn cached_idle_by_owner(&self) -> Vec<(String, usize)> {
        self.owners
            .iter()
            .filter(|o| o.len > 0)
            .map(|o| (o.name.clone(), o.len))
            .collect()
    }

    /// The owner whose idle cached block goes next: the one furthest over its share.
    fn eviction_owner(&self) -> usize {
        (0..self.owners.len())
            .filter(|&i| self.owners[i].len > 0)
            .max_by(|&a, &b| {
                let r = |i: usize| self.owners[i].len as f64 / self.owners[i].share;
                r(a).total_cmp(&r(b))
            })
            .expect("an idle cached block")
    }

    /// Takes the next idle cached block out of the cache (its hash dropped).
    fn evict_one(&mut self) -> BlockId {
        let o = self.eviction_owner();
        let b = self.owners[o].head;
        self.lru_remove(b);
        self.uncache(b);
        b
    }
    pub fn lookup(&self, h: &BlockHash) -> Option<BlockId> {
        self.cached.get(h).copied()
    }
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    fn lru_remove(&mut self, b: BlockId) {
        let Block {
            prev, next, owner, ..
        } = self.blocks[b as usize];
        let o = owner as usize;
        if prev == NIL {
            self.owners[o].head = next
        } else {
            self.blocks[prev as usize].next = next
        }
        if next == NIL {
            self.owners[o].tail = prev
        } else {
            self.blocks[next as usize].prev = prev
        }
        let blk = &mut self.blocks[b as usize];
        blk.prev = NIL;
        blk.next = NIL;
        blk.in_lru = false;
        self.owners[o].len -= 1;
        self.lru_len -= 1;
    }

    fn lru_push_tail(&mut self, b: BlockId) {
        let o = self.blocks[b as usize].owner as usize;
        let tail = self.owners[o].tail;
        {
            let blk = &mut self.blocks[b as usize];
            blk.prev = tail;
            blk.next = NIL;
            blk.in_lru = true;
        }
        if tail == NIL {
            self.owners[o].head = b
        } else {
            self.blocks[tail as usize].next = b
        }
        self.owners[o].tail = b;
        self.owners[o].len += 1;
        self.lru_len += 1;
    }

    /// Drops a block's hash (its K/V are about to be overwritten or it fell out of the cap).
    fn uncache(&mut self, b: BlockId) {
        if let Some(h) = self.blocks[b as usize].hash.take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
                self.events.push(KvEvent::Removed { hashes: vec![h] });
            }
        }
    }

    /// Takes `n` blocks for new K/V (ref count 1), empty ones first, then evicting the least
    /// recently used cached blocks. `None` (and nothing taken) if fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let b = match self.plain.pop() {
                Some(b) => b,
                None => self.evict_one(),
            };
            self.blocks[b as usize].ref_cnt = 1;
            out.push(b);
        }
        Some(out)
    }

    /// Takes a reference on cached blocks found by a prefix hit.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            if self.blocks[b as usize].in_lru {
                self.lru_remove(b);
            }
            self.blocks[b as usize].ref_cnt += 1;
        }
    }

    /// Registers a full block's hash, so later requests (even in the same step) can reuse it. If
    /// another block already holds this hash, the map keeps the older one.
    pub fn cache_block(&mut self, b: BlockId, h: BlockHash) {
        self.cache_block_for(b, h, 0);
    }

    /// [`BlockPool::cache_block`] for `owner`, whose share of the idle cache the block counts in.
    pub fn cache_block_for(&mut self, b: BlockId, h: BlockHash, owner: Owner) {
        if !self.caching || self.blocks[b as usize].hash.is_some() {
            return;
        }
        self.blocks[b as usize].owner = owner;
        self.blocks[b as usize].hash = Some(h);
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(h) {
            e.insert(b);
            self.events.push(KvEvent::Stored { hashes: vec![h] });
        }
    }

    /// Releases one reference on each block, in the order given (pass a request's blocks
    /// tail-first). Blocks reaching zero become free: cached ones join the LRU tail, others the
    /// plain stack; then the idle-cache cap is enforced from the LRU head.
    pub fn free(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        for b in blocks {
            let blk = &mut self.blocks[b as usize];
            assert!(blk.ref_cnt > 0, "double free of block {b}");
            blk.ref_cnt -= 1;
            if blk.ref_cnt > 0 {
                continue;
            }
            let is_cached = blk.hash.is_some_and(|h| self.cached.get(&h) == Some(&b));
            if is_cached {
                self.lru_push_tail(b);
            } else {
                self.blocks[b as usize].hash = None;
                self.plain.push(b);
            }
        }
        while self.lru_len > self.max_cached_idle {
            let b = self.evict_one();
            self.plain.push(b);
        }
    }

    /// Forgets every cached prefix (blocks in use keep their data, but no hash).
    pub fn clear_cache(&mut self) {
        while self.lru_len > 0 {
            let o = self.eviction_owner();
            let b = self.owners[o].head;
            self.lru_remove(b);
            self.blocks[b as usize].hash = None;
            self.plain.push(b);
        }
        for blk in &mut self.blocks {
            blk.hash = None;
        }
        self.cached.clear();
        self.events.push(KvEvent::Cleared);
    }
}
