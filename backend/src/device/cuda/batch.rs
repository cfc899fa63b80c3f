//! One step's batch metadata in device memory: token ids, positions, KV slots, block tables,
//! logits rows, and the attention query tiles (up to ATT_TQ consecutive tokens of one sequence
//! each) the attention kernels walk.

use cudarc::driver::CudaSlice;

use super::kernels::ATT_TQ;
use super::CudaDevice;
use crate::device::ForwardBatch;
use crate::error::DeviceError;

/// A step's batch on the device.
pub struct CudaBatch {
    pub(super) n: usize,
    pub(super) ids: CudaSlice<u32>,
    pub(super) pos: CudaSlice<u32>,
    pub(super) slots: CudaSlice<u32>,
    pub(super) block_tables: CudaSlice<u32>,
    pub(super) max_blocks: usize,
    pub(super) logit_rows: CudaSlice<u32>,
    pub(super) num_logit_rows: usize,
    pub(super) block_size: usize,
    /// Attention query tiles: up to ATT_TQ consecutive tokens of one sequence each.
    pub(super) tile_seq: CudaSlice<u32>,
    pub(super) tile_start: CudaSlice<u32>,
    pub(super) tile_len: CudaSlice<u32>,
    pub(super) num_tiles: usize,
    pub(super) tile_lens: Vec<u32>,
    /// Longest context any tile attends over.
    pub(super) max_ctx: usize,
}

impl CudaBatch {
    /// Tokens of the longest attention tile (0 for an empty batch).
    pub(super) fn longest_tile(&self) -> usize {
        self.tile_lens.iter().copied().max().unwrap_or(0) as usize
    }
}

/// The attention query tiles of a batch, on the host.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Tiles {
    pub seq: Vec<u32>,
    pub start: Vec<u32>,
    pub len: Vec<u32>,
}

/// Cuts each sequence's new tokens into tiles of at most ATT_TQ tokens.
pub(super) fn tiles(batch: &ForwardBatch) -> Tiles {
    let mut t = Tiles::default();
    for (i, s) in batch.seqs.iter().enumerate() {
        let mut off = 0;
        while off < s.query_len {
            let len = (s.query_len - off).min(ATT_TQ);
            t.seq.push(i as u32);
            t.start.push((s.query_start + off) as u32);
            t.len.push(len as u32);
            off += len;
        }
    }
    t
}

impl CudaDevice {
    pub(super) fn upload_batch(&self, batch: &ForwardBatch) -> Result<CudaBatch, DeviceError> {
        let max_blocks = batch
            .seqs
            .iter()
            .map(|s| s.block_table.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let mut tables = vec![0u32; batch.seqs.len().max(1) * max_blocks];
        for (i, s) in batch.seqs.iter().enumerate() {
            tables[i * max_blocks..i * max_blocks + s.block_table.len()]
                .copy_from_slice(&s.block_table);
        }
        let t = tiles(batch);
        Ok(CudaBatch {
            tile_seq: self.htod_u32(&t.seq)?,
            tile_start: self.htod_u32(&t.start)?,
            tile_len: self.htod_u32(&t.len)?,
            num_tiles: t.seq.len(),
            tile_lens: t.len,
            max_ctx: batch.seqs.iter().map(|s| s.context_len).max().unwrap_or(0),
            n: batch.num_tokens(),
            ids: self.htod_u32(&batch.token_ids)?,
            pos: self.htod_u32(&batch.positions)?,
            slots: self.htod_u32(&batch.slot_mapping)?,
            block_tables: self.htod_u32(&tables)?,
            max_blocks,
            logit_rows: self.htod_u32(&batch.logit_rows)?,
            num_logit_rows: batch.logit_rows.len(),
            block_size: self.block_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_chunks_are_cut_into_query_tiles_and_decode_rows_are_one_each() {
        let mut b = ForwardBatch::default();
        let table: Vec<u32> = (0..8).collect();
        b.push_seq(&[1; 70], 0, &table, 16, true);
        b.push_seq(&[2], 40, &table, 16, true);
        let t = tiles(&b);
        assert_eq!(t.seq, vec![0, 0, 0, 1]);
        assert_eq!(t.start, vec![0, 32, 64, 70]);
        assert_eq!(t.len, vec![32, 32, 6, 1]);
    }
}
