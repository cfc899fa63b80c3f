//! [`KvTracker`]: the set of block hashes the worker's engine holds, kept current from its KV
//! events, with a sequence number per change and a channel of changes for `/v1/kv_events`.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use cachet_backend::block_hash::BlockHash;
use cachet_backend::engine::EngineHandle;
use cachet_backend::kv::KvEvent;
use tokio::sync::broadcast;

use crate::protocol::{hex_hash, KvWire};

/// The set of block hashes the engine holds, kept current from its KV events, with a sequence
/// number per change and a channel of changes for `/v1/kv_events` streams.
pub struct KvTracker {
    state: RwLock<(u64, HashSet<BlockHash>)>,
    pub(super) changes: broadcast::Sender<(u64, KvWire)>,
}

impl KvTracker {
    /// Follows `engine`'s KV events from now on (call before the first request).
    pub fn follow(engine: &EngineHandle) -> Arc<KvTracker> {
        let (changes, _) = broadcast::channel(4096);
        let t = Arc::new(KvTracker {
            state: RwLock::new((0, HashSet::new())),
            changes,
        });
        let mut rx = engine.subscribe_kv_events();
        let t2 = t.clone();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(batch) => {
                        for ev in batch {
                            t2.apply(ev);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        // Missed changes: forget everything (routing then under-, never
                        // over-estimates what is cached here) and tell the streams.
                        tracing::warn!(missed = n, "KV event tracker lagged; clearing");
                        t2.apply(KvEvent::Cleared);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        t
    }

    fn apply(&self, ev: KvEvent) {
        let mut st = self.state.write().expect("tracker lock");
        st.0 += 1;
        let wire = match ev {
            KvEvent::Stored { hashes } => {
                st.1.extend(hashes.iter().copied());
                KvWire::Stored {
                    seq: st.0,
                    blocks: hashes.iter().map(hex_hash).collect(),
                }
            }
            KvEvent::Removed { hashes } => {
                for h in &hashes {
                    st.1.remove(h);
                }
                KvWire::Removed {
                    seq: st.0,
                    blocks: hashes.iter().map(hex_hash).collect(),
                }
            }
            KvEvent::Cleared => {
                st.1.clear();
                KvWire::Cleared { seq: st.0 }
            }
        };
        let _ = self.changes.send((st.0, wire));
    }

    /// The current set, as a snapshot event.
    pub fn snapshot(&self) -> KvWire {
        let st = self.state.read().expect("tracker lock");
        KvWire::Snapshot {
            seq: st.0,
            blocks: st.1.iter().map(hex_hash).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.state.read().expect("tracker lock").1.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
