//! Block bookkeeping for the paged KV cache.

pub mod simple;

pub use simple::SimpleAllocator;
