//! Decode graphs' activations from a memory pool of their own, so a captured step is a chain
//! of kernels with no allocation nodes in it (`CACHET_GRAPH_MEMORY=pool`).
//!
//! Captured the plain way, each op's `cuMemAllocAsync` of its output and `cuMemFreeAsync` of its
//! inputs become allocation and free nodes of the graph: they stand between most pairs of
//! kernels, so only ~20% of a step's edges can be programmatic (programmatic.rs), and the driver
//! refuses to rewrite the edges afterwards while the graph holds such nodes.
//!
//! Here, while a graph is captured, an activation is allocated from this pool on a *side*
//! stream that is never captured, and freed there when the op drops it. Both happen at once
//! (the side stream has no work), so nothing enters the graph but the kernels and copies, and
//! the pool hands a freed buffer to the next allocation in stream order: the graph's scratch is
//! reused as the step goes, as the allocation nodes' was. Kernels see only addresses.
//!
//! Why reuse is safe: the captured step is one stream, so its kernels run in order, and each of
//! ours waits in `wait_for_prior_kernels()` for the one before it to finish before touching
//! memory (programmatic edges move launches, not effects). A buffer a later op reuses has no
//! reader left when that op runs.
//!
//! Why no one else writes it: only captures allocate from this pool; every graph runs on the
//! device's one stream, one replay at a time, and none keeps an activation across replays (a
//! graph's logits are copied into the static buffer inside it). The pool keeps what it has
//! reserved (release threshold: never), so an address baked into a graph should stay mapped.
//!
//! Opt-in, not the default, and never used with FP8 weights (`capture_pool`), because of a
//! failure not yet understood (H200, `benchmarks/results/graph-pool-h200/5-fp8-diag/` and
//! `6-fp8-bisect/`): the Llama-3-8B shape with FP8 weights hits an illegal address replaying its
//! decode graphs (PDL on or off, at 80% or 90% of the memory). What was measured:
//! - 256-row graphs alone, contexts up to 8,192: fails; up to 1,024: passes. Graphs of up to 64
//!   rows, SmolLM2 with FP8 weights (the FP8 graph test included), the 8B with an FP8 cache and
//!   every bf16 model pass, and so do the CUDA engine, MoE and KV-cache tests.
//! - Every pool address is 256-byte aligned. With no reuse at all (frees on a second stream the
//!   pool may not reuse from) it passes, holding 16.8 GB of graph memory.
//! - Reuse is the trigger, and cuBLASLt's FP8 product the buffer: holding that product's three
//!   buffers (activation codes, their scales, the f32 product) until the graph is captured
//!   passes, and so does taking only the f32 product out of the pool — for the 256-row case.
//!   With every graph size captured it still faults, so that was not all of it.
//! - cuBLAS's and cuBLASLt's kernels are the only ones of a step that are not ours (ours wait
//!   for the kernel before them before touching memory; the libraries' launches are their own).
//!   Captured with the pool, cuBLASLt's FP8 product follows our quantize kernel directly,
//!   except the gate|up shape's, which follows a memset of the library's own. The library
//!   joins its own split launches with programmatic edges. Giving it device scale pointers
//!   changes nothing (`6-fp8-bisect/`, calls 4 and 5).
//! - compute-sanitizer flags the first kernel's write to its pool buffer, which it counts as
//!   freed memory by design here, so it does not tell. Capturing in the strict thread-local
//!   mode is not possible (the side stream's allocation is refused); strict only around the
//!   cuBLAS/cuBLASLt calls still failed.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUmemPool_attribute, CUmemoryPool};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, DriverError};

/// How decode graphs get their activations (`CACHET_GRAPH_MEMORY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphMemory {
    /// Allocation and free nodes inside the graph (the capture's stream-ordered allocations).
    Nodes,
    /// This module's pool: no allocation nodes, kernels joined directly.
    Pool,
}

pub(super) struct GraphPool {
    pool: CUmemoryPool,
    /// Never captured: allocations and frees made on it during a capture take effect at once.
    side: Arc<CudaStream>,
}

impl super::CudaDevice {
    /// The pool captures take their activations from: none unless `CACHET_GRAPH_MEMORY=pool`,
    /// and none with FP8 weights (their cuBLASLt products are loaded once FP8 weights are, and
    /// with them a replay can fault; see the module's note).
    pub(super) fn capture_pool(&self) -> Option<&GraphPool> {
        self.graph_pool
            .as_ref()
            .filter(|_| self.fp8_gemm.get().is_none())
    }
}

impl GraphPool {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        let side = ctx.new_stream()?;
        // SAFETY: plain-data properties (all zeros is "no handle types, default usage");
        // the pool is created for this context's device and kept until the device is dropped.
        unsafe {
            let mut props: sys::CUmemPoolProps = std::mem::zeroed();
            props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
            props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
            props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = ctx.ordinal() as i32;
            let mut pool: CUmemoryPool = std::ptr::null_mut();
            sys::cuMemPoolCreate(&mut pool, &props).result()?;
            // Never give reserved memory back: graphs hold its addresses.
            let mut keep = u64::MAX;
            let set = sys::cuMemPoolSetAttribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
            .result();
            if let Err(e) = set {
                let _ = sys::cuMemPoolDestroy(pool);
                return Err(e);
            }
            Ok(GraphPool { pool, side })
        }
    }

    /// `n` uninitialised elements of `T` for a graph being captured; dropping the slice frees
    /// them on the side stream (back to this pool at once).
    ///
    /// # Safety
    /// Called only while a decode graph is captured, for a buffer the step fully writes before
    /// reading (as `alloc_out`'s callers do) and does not keep past the capture.
    pub(super) unsafe fn alloc<T: DeviceRepr>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, DriverError> {
        let bytes = n.max(1) * std::mem::size_of::<T>();
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a live pool and stream of this context; the out-pointer is a local.
        unsafe {
            sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.pool, self.side.cu_stream())
                .result()?;
            // The slice's stream is the side stream, so its drop frees the buffer there.
            Ok(self.side.upgrade_device_ptr(ptr, n.max(1)))
        }
    }
}

impl Drop for GraphPool {
    fn drop(&mut self) {
        // SAFETY: the pool this made. A buffer still out is released when it is freed (the
        // driver defers the destruction until then).
        unsafe {
            let _ = sys::cuMemPoolDestroy(self.pool);
        }
    }
}
