//! The collectives of CPU tensor-parallel ranks ([`crate::model::tensor_parallel`]), in shared
//! memory.

use std::sync::{Arc, Condvar, Mutex};

use crate::error::DeviceError;

/// The CPU ranks' collectives: each rank puts its tensor in its slot, all meet, each reads every
/// slot in rank order (so every rank computes the same sums), all meet again before the slots
/// are reused. A rank that fails aborts the group, and the others' collectives return an error
/// instead of waiting for it forever.
#[derive(Debug)]
pub struct CpuComm {
    n: usize,
    slots: Vec<Mutex<Vec<f32>>>,
    meet: Mutex<Meet>,
    turn: Condvar,
}

#[derive(Debug)]
struct Meet {
    arrived: usize,
    generation: u64,
    aborted: bool,
}

fn aborted() -> DeviceError {
    DeviceError::Op {
        device: "cpu",
        op: "tensor-parallel collective",
        msg: "another rank failed".into(),
    }
}

impl CpuComm {
    pub fn new(n: usize) -> Arc<CpuComm> {
        Arc::new(CpuComm {
            n,
            slots: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            meet: Mutex::new(Meet {
                arrived: 0,
                generation: 0,
                aborted: false,
            }),
            turn: Condvar::new(),
        })
    }

    pub fn size(&self) -> usize {
        self.n
    }

    /// Waits until every rank has arrived.
    fn barrier(&self) -> Result<(), DeviceError> {
        let mut m = self.meet.lock().unwrap_or_else(|e| e.into_inner());
        if m.aborted {
            return Err(aborted());
        }
        m.arrived += 1;
        if m.arrived == self.n {
            m.arrived = 0;
            m.generation += 1;
            self.turn.notify_all();
            return Ok(());
        }
        let generation = m.generation;
        while m.generation == generation && !m.aborted {
            m = self.turn.wait(m).unwrap_or_else(|e| e.into_inner());
        }
        if m.aborted {
            Err(aborted())
        } else {
            Ok(())
        }
    }

    /// Ends every collective in flight and to come with an error (a rank failed).
    pub fn abort(&self) {
        self.meet.lock().unwrap_or_else(|e| e.into_inner()).aborted = true;
        self.turn.notify_all();
    }

    /// Makes the group usable again after an abort, once no rank is inside a collective (the
    /// caller knows: every rank has returned from the failed step).
    pub fn reset(&self) {
        let mut m = self.meet.lock().unwrap_or_else(|e| e.into_inner());
        m.aborted = false;
        m.arrived = 0;
    }

    fn put(&self, rank: usize, data: &[f32]) {
        let mut s = self.slots[rank].lock().unwrap_or_else(|e| e.into_inner());
        s.clear();
        s.extend_from_slice(data);
    }

    /// `data` summed over the ranks, in place.
    pub fn all_reduce_sum(&self, rank: usize, data: &mut [f32]) -> Result<(), DeviceError> {
        self.put(rank, data);
        self.barrier()?;
        data.fill(0.0);
        for slot in &self.slots {
            let s = slot.lock().unwrap_or_else(|e| e.into_inner());
            for (d, v) in data.iter_mut().zip(s.iter()) {
                *d += v;
            }
        }
        self.barrier()
    }

    /// The ranks' `[rows, cols_r]` blocks side by side: `[rows, Σ cols_r]`, in rank order.
    pub fn all_gather_cols(
        &self,
        rank: usize,
        data: &[f32],
        rows: usize,
    ) -> Result<(Vec<f32>, usize), DeviceError> {
        self.put(rank, data);
        self.barrier()?;
        let blocks: Vec<Vec<f32>> = self
            .slots
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect();
        self.barrier()?;
        let widths: Vec<usize> = blocks.iter().map(|b| b.len() / rows.max(1)).collect();
        let cols: usize = widths.iter().sum();
        let mut out = Vec::with_capacity(rows * cols);
        for row in 0..rows {
            for (b, &w) in blocks.iter().zip(&widths) {
                out.extend_from_slice(&b[row * w..(row + 1) * w]);
            }
        }
        Ok((out, cols))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_sum_and_gather_in_rank_order_and_a_failed_rank_ends_them() {
        let comm = CpuComm::new(3);
        let handles: Vec<_> = (0..3)
            .map(|r| {
                let comm = comm.clone();
                std::thread::spawn(move || {
                    let mut v = vec![r as f32, 10.0 * r as f32];
                    comm.all_reduce_sum(r, &mut v).unwrap();
                    // Rank r's block is r + 1 columns wide, 2 rows.
                    let block: Vec<f32> = (0..2 * (r + 1)).map(|i| (100 * r + i) as f32).collect();
                    let (g, cols) = comm.all_gather_cols(r, &block, 2).unwrap();
                    (v, g, cols)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for (v, g, cols) in &results {
            assert_eq!(v, &vec![3.0, 30.0]);
            assert_eq!(*cols, 6);
            assert_eq!(
                g,
                &vec![
                    0.0, 100.0, 101.0, 200.0, 201.0, 202.0, 1.0, 102.0, 103.0, 203.0, 204.0, 205.0
                ]
            );
        }
        let comm = CpuComm::new(2);
        let waiter = {
            let comm = comm.clone();
            std::thread::spawn(move || comm.all_reduce_sum(0, &mut [1.0]))
        };
        comm.abort();
        assert!(
            waiter.join().unwrap().is_err(),
            "the waiting rank gets an error"
        );
        // Once every rank is back, the group serves the next step.
        comm.reset();
        let other = {
            let comm = comm.clone();
            std::thread::spawn(move || {
                let mut v = [1.0];
                comm.all_reduce_sum(1, &mut v).map(|()| v[0])
            })
        };
        let mut v = [2.0];
        comm.all_reduce_sum(0, &mut v).unwrap();
        assert_eq!((v[0], other.join().unwrap().unwrap()), (3.0, 3.0));
    }
}
