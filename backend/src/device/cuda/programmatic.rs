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
//! After a capture, every edge from a kernel node into one of *our* kernels (a function of the
//! module compiled from `kernels/`; cuBLAS's kernels and copies keep their edges) is replaced by
//! a programmatic one, from the upstream kernel's launch-order port (the dependent may launch
//! once every block of the upstream has started: [`Pdl::Early`]) or its programmatic port (once
//! every block has exited, as our kernels never trigger early: [`Pdl::Late`]).

use std::ptr;

use cudarc::driver::sys::{
    self, CUgraph, CUgraphDependencyType, CUgraphEdgeData, CUgraphNode, CUgraphNodeType, CUmodule,
    CUDA_KERNEL_NODE_PARAMS,
};
use cudarc::driver::{CudaFunction, DriverError};

/// How decode graphs launch our kernels (`CACHET_PDL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdl {
    /// Plain edges: each kernel launched when the one before it has finished.
    Off,
    /// Launched once every block of the kernel before it has exited (before its completion is
    /// processed and the next launch would start).
    Late,
    /// Launched once every block of the kernel before it has started; its blocks wait on the
    /// device.
    Early,
}

impl Pdl {
    fn port(self) -> Option<u8> {
        match self {
            Pdl::Off => None,
            Pdl::Late => Some(sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8),
            Pdl::Early => Some(sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER as u8),
        }
    }
}

/// The module `f` was loaded from.
pub(super) fn module_of(f: &CudaFunction) -> Result<CUmodule, DriverError> {
    let mut m: CUmodule = ptr::null_mut();
    // SAFETY: `f` is a live function of a loaded module.
    unsafe { sys::cuFuncGetModule(&mut m, f.cu_function()) }.result()?;
    Ok(m)
}

/// Replaces every plain edge of `graph` from a kernel node into a kernel of `ours` with a
/// programmatic one as `mode` says; returns how many edges were replaced.
///
/// # Safety
/// `graph` is a valid graph not being instantiated or launched elsewhere, and every kernel of
/// `ours` starts with `wait_for_prior_kernels()`.
pub(super) unsafe fn make_programmatic(
    graph: CUgraph,
    ours: CUmodule,
    mode: Pdl,
) -> Result<usize, DriverError> {
    let Some(port) = mode.port() else {
        return Ok(0);
    };
    // SAFETY: the caller's graph; every pointer is to a live local of the stated length.
    unsafe {
        let mut n = 0usize;
        sys::cuGraphGetEdges_v2(
            graph,
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            &mut n,
        )
        .result()?;
        let mut from: Vec<CUgraphNode> = vec![ptr::null_mut(); n];
        let mut to: Vec<CUgraphNode> = vec![ptr::null_mut(); n];
        let mut data = vec![edge(0, CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT); n];
        sys::cuGraphGetEdges_v2(
            graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut n,
        )
        .result()?;
        // A node with several incoming edges (none in a one-stream capture) keeps plain ones.
        let incoming = |node: CUgraphNode| to[..n].iter().filter(|&&t| t == node).count();
        let mut replaced = 0;
        for i in 0..n {
            let plain = data[i].type_
                == CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8
                && data[i].from_port == 0;
            if !plain || !is_kernel(from[i])? || !is_ours(to[i], ours)? || incoming(to[i]) != 1 {
                continue;
            }
            sys::cuGraphRemoveDependencies_v2(graph, &from[i], &to[i], &data[i], 1).result()?;
            let programmatic = edge(
                port,
                CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC,
            );
            sys::cuGraphAddDependencies_v2(graph, &from[i], &to[i], &programmatic, 1).result()?;
            replaced += 1;
        }
        Ok(replaced)
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
unsafe fn is_kernel(node: CUgraphNode) -> Result<bool, DriverError> {
    let mut t = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: the caller's node.
    unsafe { sys::cuGraphNodeGetType(node, &mut t) }.result()?;
    Ok(t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL)
}

/// # Safety
/// `node` is a node of a live graph.
unsafe fn is_ours(node: CUgraphNode, ours: CUmodule) -> Result<bool, DriverError> {
    // SAFETY: the caller's node; the parameters are plain data (pointers and sizes), for
    // which all zeros is a valid value.
    unsafe {
        if !is_kernel(node)? {
            return Ok(false);
        }
        let mut p: CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        sys::cuGraphKernelNodeGetParams_v2(node, &mut p).result()?;
        // Library kernels (cuBLAS) may come as a CUkernel with no module function.
        if p.func.is_null() {
            return Ok(false);
        }
        let mut m: CUmodule = ptr::null_mut();
        sys::cuFuncGetModule(&mut m, p.func).result()?;
        Ok(m == ours)
    }
}
