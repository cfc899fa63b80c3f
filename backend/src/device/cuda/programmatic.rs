//! Programmatic dependent launch in decode graphs (Hopper and later).
//!
//! A captured decode step is a chain of a few hundred kernels; between two of them the GPU
//! drains the first (its last blocks, its writes), then launches the second and ramps its
//! memory pipe up again — a few microseconds each, which on a small or sparse model (Qwen3-30B-A3B:
//! ~430 kernels a step around 1.5 ms of bytes) is as much as the bytes themselves. A
//! *programmatic* edge lets the second kernel be launched early: its blocks become resident
//! while the first still runs and wait in `wait_for_prior_kernels()` (common.cuh: every kernel's
//! first statement, checked by a unit test) until the first has finished and its writes are
//! visible. The order of effects is the one the plain edge gave; only the launch moves earlier.
//!
//! While a decode graph is captured, right before each of our kernels is enqueued
//! ([`programmatic_edge`], called by every launch in launch.rs): when the capture's one pending
//! dependency is another of our kernels (a function of the module compiled from `kernels/`;
//! cuBLAS's kernels, copies and the capture's allocations keep plain edges), the edge the launch
//! will get is made programmatic from the upstream kernel's launch-order port: the dependent may
//! launch once every block of the upstream has started. Edges cannot be rewritten after the
//! capture: the driver refuses to remove dependencies from a graph holding allocation nodes
//! (`CUDA_ERROR_NOT_SUPPORTED`, measured).
//!
//! What it reaches, measured on the H200 (BENCHMARKS-HISTORY.md): with the capture's own allocations,
//! allocation and free nodes stand between most pairs of kernels and only ~20% of the edges can
//! be programmatic: Qwen3-30B-A3B batch-1 decode 3.30 → 3.22 ms, the 8B and SmolLM2 within
//! noise. Launching from the upstream's programmatic port instead (once its blocks exit), a
//! pool of graph memory of our own (a chain of kernels, ~75% programmatic: the 8B slower), and
//! a rule mixing both were measured and dropped (BENCHMARKS-HISTORY.md).

use std::ptr;

use cudarc::driver::sys::{
    self, CUgraph, CUgraphDependencyType, CUgraphEdgeData, CUgraphNode, CUgraphNodeType, CUmodule,
    CUDA_KERNEL_NODE_PARAMS,
};
use cudarc::driver::{CudaFunction, DriverError};

/// Whether this driver has the capture calls [`programmatic_edge`] makes (CUDA 12.3 and
/// later): each is called once on `stream` while it is not capturing, where it changes
/// nothing. (cudarc resolves a symbol at its first call and panics if it is missing.)
pub(super) fn supported(stream: sys::CUstream) -> bool {
    std::panic::catch_unwind(|| {
        // SAFETY: a live stream. Not capturing: the update is refused
        // (CUDA_ERROR_ILLEGAL_STATE) without effect.
        unsafe {
            capture_info(stream).is_ok_and(|c| {
                c.status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
            }) && {
                let _ = sys::cuStreamUpdateCaptureDependencies_v2(
                    stream,
                    ptr::null_mut(),
                    ptr::null(),
                    0,
                    0,
                );
                true
            }
        }
    })
    .unwrap_or(false)
}

/// A stream's capture status and pending dependencies; the arrays are the driver's, valid
/// until the next call on the stream.
struct CaptureInfo {
    status: sys::CUstreamCaptureStatus,
    deps: *const CUgraphNode,
    data: *const CUgraphEdgeData,
    n: usize,
}

/// # Safety
/// `stream` is a live stream of the current context.
unsafe fn capture_info(stream: sys::CUstream) -> Result<CaptureInfo, DriverError> {
    let mut c = CaptureInfo {
        status: sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        deps: ptr::null(),
        data: ptr::null(),
        n: 0,
    };
    let (mut id, mut graph): (u64, CUgraph) = (0, ptr::null_mut());
    // SAFETY: the caller's stream; out-pointers to locals.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream,
            &mut c.status,
            &mut id,
            &mut graph,
            &mut c.deps,
            &mut c.data,
            &mut c.n,
        )
    }
    .result()?;
    Ok(c)
}

/// The module `f` was loaded from.
pub(super) fn module_of(f: &CudaFunction) -> Result<CUmodule, DriverError> {
    let mut m: CUmodule = ptr::null_mut();
    // SAFETY: `f` is a live function of a loaded module.
    unsafe { sys::cuFuncGetModule(&mut m, f.cu_function()) }.result()?;
    Ok(m)
}

/// A driver call that failed, named.
#[derive(Debug)]
pub(super) struct Failed(pub &'static str, pub DriverError);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0, self.1)
    }
}

trait Named {
    fn named(self, call: &'static str) -> Result<(), Failed>;
}

impl Named for sys::CUresult {
    fn named(self, call: &'static str) -> Result<(), Failed> {
        self.result().map_err(|e| Failed(call, e))
    }
}

/// Right before one of our kernels is enqueued on `stream`: if the stream is capturing and its
/// one pending dependency is a kernel of `ours` joined by a plain edge, makes that edge
/// programmatic from the upstream's launch-order port (the dependent launches once every block
/// of the upstream has started). Returns whether it did.
///
/// # Safety
/// `stream` is a live stream of the current context, and the kernel about to be launched on
/// it starts with `wait_for_prior_kernels()`, as every kernel of `ours` does.
pub(super) unsafe fn programmatic_edge(
    stream: sys::CUstream,
    ours: CUmodule,
) -> Result<bool, Failed> {
    let port = sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER as u8;
    // SAFETY: the caller's stream; the returned arrays are read before the next call on it.
    unsafe {
        let c = capture_info(stream).map_err(|e| Failed("cuStreamGetCaptureInfo_v3", e))?;
        let (deps, data) = (c.deps, c.data);
        if c.status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
            || c.n != 1
            || deps.is_null()
        {
            return Ok(false);
        }
        let plain = edge(0, CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
        let mut node = *deps;
        if (!data.is_null() && *data != plain) || !is_ours(node, ours)? {
            return Ok(false);
        }
        let programmatic = edge(
            port,
            CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC,
        );
        sys::cuStreamUpdateCaptureDependencies_v2(
            stream,
            &mut node,
            &programmatic,
            1,
            sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32,
        )
        .named("cuStreamUpdateCaptureDependencies_v2")?;
        Ok(true)
    }
}

fn edge(from_port: u8, kind: CUgraphDependencyType) -> CUgraphEdgeData {
    CUgraphEdgeData {
        from_port,
        to_port: 0,
        type_: kind as u8,
        reserved: [0; 5],
    }
}

/// # Safety
/// `node` is a node of a live graph.
unsafe fn is_kernel(node: CUgraphNode) -> Result<bool, Failed> {
    let mut t = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: the caller's node.
    unsafe { sys::cuGraphNodeGetType(node, &mut t) }.named("cuGraphNodeGetType")?;
    Ok(t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL)
}

/// # Safety
/// `node` is a node of a live graph.
unsafe fn is_ours(node: CUgraphNode, ours: CUmodule) -> Result<bool, Failed> {
    // SAFETY: the caller's node; the parameters are plain data (pointers and sizes), for
    // which all zeros is a valid value.
    unsafe {
        if !is_kernel(node)? {
            return Ok(false);
        }
        let mut p: CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        sys::cuGraphKernelNodeGetParams_v2(node, &mut p).named("cuGraphKernelNodeGetParams_v2")?;
        // Library kernels (cuBLAS) may come as a CUkernel with no module function.
        if p.func.is_null() {
            return Ok(false);
        }
        let mut m: CUmodule = ptr::null_mut();
        sys::cuFuncGetModule(&mut m, p.func).named("cuFuncGetModule")?;
        Ok(m == ours)
    }
}
