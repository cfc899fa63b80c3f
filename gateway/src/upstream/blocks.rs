//! [`BlockSet`]: the block hashes an upstream holds, kept current from its KV events (the
//! embedded engine's, or a worker's `/v1/kv_events` stream). Missed changes clear it: routing
//! then under-, never over-estimates what is cached there.

use std::collections::HashSet;
use std::sync::RwLock;

use cachet_backend::block_hash::BlockHash;
use cachet_backend::kv::KvEvent;

use crate::protocol::{parse_hash, KvWire};

#[derive(Debug, Default)]
pub struct BlockSet {
    set: RwLock<HashSet<BlockHash>>,
}

impl BlockSet {
    /// Leading blocks of `hashes` held.
    pub fn overlap(&self, hashes: &[BlockHash]) -> usize {
        let set = self.set.read().expect("blocks lock");
        hashes.iter().take_while(|h| set.contains(h)).count()
    }

    pub fn len(&self) -> usize {
        self.set.read().expect("blocks lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&self) {
        self.set.write().expect("blocks lock").clear();
    }

    /// Applies one step's events of an in-process engine.
    pub fn apply_events(&self, batch: Vec<KvEvent>) {
        let mut set = self.set.write().expect("blocks lock");
        for ev in batch {
            match ev {
                KvEvent::Stored { hashes } => set.extend(hashes),
                KvEvent::Removed { hashes } => {
                    for h in hashes {
                        set.remove(&h);
                    }
                }
                KvEvent::Cleared => set.clear(),
            }
        }
    }

    /// Applies one line of a worker's `/v1/kv_events` stream (a snapshot replaces the set).
    pub fn apply_wire(&self, ev: KvWire) {
        let parse = |v: Vec<String>| v.iter().filter_map(|s| parse_hash(s)).collect::<Vec<_>>();
        let mut set = self.set.write().expect("blocks lock");
        match ev {
            KvWire::Snapshot { blocks, .. } => {
                set.clear();
                set.extend(parse(blocks));
            }
            KvWire::Stored { blocks, .. } => set.extend(parse(blocks)),
            KvWire::Removed { blocks, .. } => {
                for h in parse(blocks) {
                    set.remove(&h);
                }
            }
            KvWire::Cleared { .. } => set.clear(),
        }
    }
}
