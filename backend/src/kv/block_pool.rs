//! The KV block pool: every block allocated up front, ref-counted, with a prefix cache.
//!
//! - Free blocks that hold a cached prefix (a hash) sit in an LRU queue (doubly linked over block
//!   ids, O(1) push/pop/remove); eviction takes the head. A request's blocks are freed tail-first, so
//!   its last block, the least likely to be shared, is evicted first.
//! - Free blocks without a hash sit in a plain stack and are reused before any cached block.
//! - A freed block keeps its hash (and stays findable) until it is reused or the idle-cache cap
//!   (`max_cached_idle` blocks) pushes it out.
//! - Every change to what is cached is recorded as a [`KvEvent`] for exact routing.

use std::collections::HashMap;

use crate::block_hash::BlockHash;

pub type BlockId = u32;
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    in_lru: bool,
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
    lru_head: u32,
    lru_tail: u32,
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
                in_lru: false
            };
            num_blocks
        ];
        BlockPool {
            blocks,
            // Lowest ids first out.
            plain: (0..num_blocks as u32).rev().collect(),
            lru_head: NIL,
            lru_tail: NIL,
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
    /// The cached-idle queue, head (next evicted) first.
    pub fn lru_order(&self) -> Vec<BlockId> {
        let mut v = Vec::with_capacity(self.lru_len);
        let mut cur = self.lru_head;
        while cur != NIL {
            v.push(cur);
            cur = self.blocks[cur as usize].next;
        }
        v
    }
    pub fn lookup(&self, h: &BlockHash) -> Option<BlockId> {
        self.cached.get(h).copied()
    }
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    fn lru_remove(&mut self, b: BlockId) {
        let Block { prev, next, .. } = self.blocks[b as usize];
        if prev == NIL {
            self.lru_head = next
        } else {
            self.blocks[prev as usize].next = next
        }
        if next == NIL {
            self.lru_tail = prev
        } else {
            self.blocks[next as usize].prev = prev
        }
        let blk = &mut self.blocks[b as usize];
        blk.prev = NIL;
        blk.next = NIL;
        blk.in_lru = false;
        self.lru_len -= 1;
    }

    fn lru_push_tail(&mut self, b: BlockId) {
        let tail = self.lru_tail;
        {
            let blk = &mut self.blocks[b as usize];
            blk.prev = tail;
            blk.next = NIL;
            blk.in_lru = true;
        }
        if tail == NIL {
            self.lru_head = b
        } else {
            self.blocks[tail as usize].next = b
        }
        self.lru_tail = b;
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
                None => {
                    let b = self.lru_head;
                    self.lru_remove(b);
                    self.uncache(b);
                    b
                }
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
        if !self.caching || self.blocks[b as usize].hash.is_some() {
            return;
        }
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
            debug_assert!(blk.ref_cnt > 0, "double free of block {b}");
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
            let b = self.lru_head;
            self.lru_remove(b);
            self.uncache(b);
            self.plain.push(b);
        }
    }

    /// Forgets every cached prefix (blocks in use keep their data, but no hash).
    pub fn clear_cache(&mut self) {
        while self.lru_head != NIL {
            let b = self.lru_head;
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
