//! Block bookkeeping for the paged KV cache.
//!
//! - [`block_pool`]: blocks, ref counts, the LRU prefix cache, KV events.
//! - [`manager`]: per-request block tables over the pool; prefix hits; slot allocation.
//! - [`simple`]: a plain allocator for single-sequence runs.

pub mod block_pool;
pub mod manager;
pub mod simple;

pub use block_pool::{BlockId, BlockPool, KvEvent, PoolUsage};
pub use manager::KvCacheManager;
pub use simple::SimpleAllocator;

#[cfg(test)]
mod tests;
