//! A plain free-list block allocator for single-sequence runs (`cachet generate`, `logits`):
//! no sharing, no prefix cache. The serving engine uses the prefix-caching block pool instead.

use crate::error::EngineError;

#[derive(Debug)]
pub struct SimpleAllocator {
    free: Vec<u32>,
    block_size: usize,
}

impl SimpleAllocator {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        SimpleAllocator {
            free: (0..num_blocks as u32).rev().collect(),
            block_size,
        }
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Grows `table` so it covers `num_tokens` tokens.
    pub fn ensure(&mut self, table: &mut Vec<u32>, num_tokens: usize) -> Result<(), EngineError> {
        let need = num_tokens
            .div_ceil(self.block_size)
            .saturating_sub(table.len());
        if need > self.free.len() {
            return Err(EngineError::KvCacheFull {
                needed: need,
                free: self.free.len(),
            });
        }
        for _ in 0..need {
            table.push(self.free.pop().expect("checked"));
        }
        Ok(())
    }

    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.free.extend(table.drain(..).rev());
    }
}
