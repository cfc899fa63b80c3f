//! NCCL for tensor-parallel CUDA ranks: one communicator per GPU of the group, made together by
//! `ncclCommInitAll` (one process drives every rank), and the two collectives the decoder asks
//! for — the row-parallel projections' all-reduce and the vocabulary-parallel LM head's gather —
//! enqueued on the rank's stream, so they run in order with its kernels and are captured into
//! its decode graphs like them.
//!
//! The library is loaded at run time, as cudarc loads the rest of CUDA; its own loader looks for
//! `libnccl.so` and versioned names of CUDA's (`.so.13`, `.so.12`…) but not NCCL's soname,
//! `libnccl.so.2`, which is all a system without NCCL's development package has. So the few
//! entry points used here are resolved by this module: `CACHET_NCCL_LIBRARY` (a path) if set,
//! else `libnccl.so.2`, else `libnccl.so`. Their signatures are NCCL's stable C ABI (nccl.h).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{cuMemcpy2DAsync_v2, CUmemorytype, CUDA_MEMCPY2D};
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::{op_err, CudaBuf, CudaTensor, DEV};
use crate::error::DeviceError;

type Comm = *mut c_void;

/// nccl.h's `ncclDataType_t` values used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum DataType {
    Float32 = 7,
    Bfloat16 = 9,
}

/// nccl.h's `ncclSum`.
const SUM: c_int = 0;
/// nccl.h's `ncclSuccess` and `ncclInProgress`.
const SUCCESS: c_int = 0;
const IN_PROGRESS: c_int = 7;

struct Api {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(Comm) -> c_int,
    comm_abort: unsafe extern "C" fn(Comm) -> c_int,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> c_int,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_last_error: unsafe extern "C" fn(Comm) -> *const c_char,
    /// The library stays loaded for the process (the pointers above point into it).
    _lib: libloading::Library,
}

fn unavailable(msg: String) -> DeviceError {
    DeviceError::Unavailable("cuda".into(), msg)
}

/// The loaded library, or why it could not be loaded (tried once per process).
fn api(path: Option<&Path>) -> Result<&'static Api, DeviceError> {
    static API: OnceLock<Result<Api, NcclMissing>> = OnceLock::new();
    API.get_or_init(|| load(path))
        .as_ref()
        .map_err(|e| unavailable(e.to_string()))
}

/// Why NCCL could not be loaded: no library (each name tried, with the loader's words), or one
/// without a function this needs.
#[derive(Debug, thiserror::Error)]
enum NcclMissing {
    #[error("tensor parallelism on CUDA needs NCCL and it was not found ({}); install it (libnccl2) or point CACHET_NCCL_LIBRARY at libnccl.so.2", tried.join("; "))]
    Library { tried: Vec<String> },
    #[error("NCCL has no {name}: {reason} (NCCL 2.13 or later is needed)")]
    Symbol { name: &'static str, reason: String },
}

fn load(path: Option<&Path>) -> Result<Api, NcclMissing> {
    let names: Vec<String> = match path {
        Some(p) => vec![p.display().to_string()],
        None => vec!["libnccl.so.2".into(), "libnccl.so".into()],
    };
    let mut tried = Vec::new();
    let lib = names
        .iter()
        .find_map(|n| {
            // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
            match unsafe { libloading::Library::new(n) } {
                Ok(l) => Some(l),
                Err(e) => {
                    tried.push(format!("{n}: {e}"));
                    None
                }
            }
        })
        .ok_or_else(|| NcclMissing::Library {
            tried: tried.clone(),
        })?;
    // SAFETY: each symbol is NCCL's exported function of that name, whose C signature (nccl.h,
    // stable since NCCL 2.0; ncclGetLastError since 2.13) is the field's type.
    unsafe {
        macro_rules! sym {
            ($name:literal) => {
                *lib.get(concat!($name, "\0").as_bytes())
                    .map_err(|e| NcclMissing::Symbol {
                        name: $name,
                        reason: e.to_string(),
                    })?
            };
        }
        Ok(Api {
            get_version: sym!("ncclGetVersion"),
            comm_init_all: sym!("ncclCommInitAll"),
            comm_destroy: sym!("ncclCommDestroy"),
            comm_abort: sym!("ncclCommAbort"),
            all_reduce: sym!("ncclAllReduce"),
            all_gather: sym!("ncclAllGather"),
            get_error_string: sym!("ncclGetErrorString"),
            get_last_error: sym!("ncclGetLastError"),
            _lib: lib,
        })
    }
}

/// The communicators of one tensor-parallel group, rank `r` on GPU `ordinals[r]`.
pub struct NcclGroup {
    api: &'static Api,
    comms: Vec<Comm>,
    aborted: AtomicBool,
    /// NCCL's version, e.g. 22803 for 2.28.3.
    pub version: i32,
}

// SAFETY: a communicator is used by one rank's thread at a time (its device's stream); abort and
// destroy are the calls NCCL allows from any thread.
unsafe impl Send for NcclGroup {}
unsafe impl Sync for NcclGroup {}

impl NcclGroup {
    /// One communicator per GPU of `ordinals` (the caller has made each GPU's primary context;
    /// NCCL's runtime calls use the same one).
    pub fn new(ordinals: &[usize], library: Option<&Path>) -> Result<Arc<Self>, DeviceError> {
        let api = api(library)?;
        let mut version = 0;
        // SAFETY: `version` is a valid out-pointer.
        check(
            api,
            None,
            unsafe { (api.get_version)(&mut version) },
            "version",
        )?;
        let devs: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        let mut comms = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for one communicator per device of `devs`.
        let r =
            unsafe { (api.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) };
        check(api, None, r, "communicator setup (ncclCommInitAll)")?;
        tracing::info!(
            ranks = devs.len(),
            nccl = %format!("{}.{}.{}", version / 10000, version / 100 % 100, version % 100),
            "NCCL communicators ready"
        );
        Ok(Arc::new(NcclGroup {
            api,
            comms,
            aborted: AtomicBool::new(false),
            version,
        }))
    }

    pub fn size(&self) -> usize {
        self.comms.len()
    }

    /// Ends every collective in flight on every rank with an error (a rank failed mid-step and
    /// the others would wait for it on the GPU forever). The group cannot be used again.
    pub fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            for &c in &self.comms {
                // SAFETY: `c` is a live communicator, aborted once (the flag).
                unsafe { (self.api.comm_abort)(c) };
            }
        }
    }

    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    fn live(&self, rank: usize) -> Result<Comm, DeviceError> {
        if self.is_aborted() {
            return Err(DeviceError::Op {
                device: "cuda",
                op: "tensor-parallel collective",
                msg: "the NCCL group was aborted after a rank failed; restart the worker".into(),
            });
        }
        Ok(self.comms[rank])
    }

    /// `count` elements at `buf` summed over the ranks, in place, on `stream`.
    ///
    /// # Safety
    /// `buf` holds `count` elements of `dtype` on rank `rank`'s GPU, `stream` is that GPU's,
    /// and every rank enqueues the same collectives in the same order.
    pub unsafe fn all_reduce_sum(
        &self,
        rank: usize,
        buf: u64,
        count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<(), DeviceError> {
        let c = self.live(rank)?;
        let p = buf as *mut c_void;
        // SAFETY: as the caller promises.
        let r = unsafe { (self.api.all_reduce)(p, p, count, dtype as c_int, SUM, c, stream) };
        check(self.api, Some(c), r, "all-reduce")
    }

    /// Every rank's `count` elements at `send`, in rank order, into `recv` (`ranks · count`).
    ///
    /// # Safety
    /// As [`NcclGroup::all_reduce_sum`], with `recv` holding `ranks · count` elements.
    pub unsafe fn all_gather(
        &self,
        rank: usize,
        (send, recv): (u64, u64),
        count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<(), DeviceError> {
        let c = self.live(rank)?;
        // SAFETY: as the caller promises.
        let r = unsafe {
            (self.api.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype as c_int,
                c,
                stream,
            )
        };
        check(self.api, Some(c), r, "all-gather")
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        if !self.is_aborted() {
            for &c in &self.comms {
                // SAFETY: every rank is done with its communicator (the group is dropped last).
                unsafe { (self.api.comm_destroy)(c) };
            }
        }
    }
}

/// NCCL's status `r` as a typed error naming `op`, with the library's own words.
fn check(api: &Api, comm: Option<Comm>, r: c_int, op: &'static str) -> Result<(), DeviceError> {
    if r == SUCCESS || r == IN_PROGRESS {
        return Ok(());
    }
    // SAFETY: both return static NUL-terminated strings (or null).
    let text = |p: *const c_char| {
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let what = text(unsafe { (api.get_error_string)(r) }).unwrap_or_default();
    let last = comm
        .and_then(|c| text(unsafe { (api.get_last_error)(c) }))
        .filter(|s| !s.is_empty());
    Err(DeviceError::Op {
        device: "cuda",
        op,
        msg: match last {
            Some(l) => format!("NCCL error {r} ({what}): {l}"),
            None => format!("NCCL error {r} ({what})"),
        },
    })
}

/// Rank `rank` of a group, as its device holds it.
#[derive(Clone)]
pub struct NcclRank {
    pub group: Arc<NcclGroup>,
    pub rank: usize,
    /// Every rank's share of the vocabulary (its LM head's logits columns, its embedding rows),
    /// in rank order.
    pub gather_widths: Vec<usize>,
}

impl super::CudaDevice {
    /// `t` summed over the group's ranks, in place (bf16 or f32, as the projection wrote it).
    pub(super) fn tp_all_reduce(&self, t: &mut CudaTensor) -> Result<(), DeviceError> {
        let Some(tp) = &self.tp else {
            return Ok(());
        };
        // A group of one still calls NCCL (a copy): it is how one GPU tests this path.
        if t.rows * t.cols == 0 {
            return Ok(());
        }
        // The ranks' partial sums must be whole values before they add up.
        self.settle(t)?;
        self.timed("all_reduce", || {
            self.ctx.bind_to_thread().map_err(op_err("bind context"))?;
            let stream = self.stream.cu_stream() as *mut c_void;
            let count = t.rows * t.cols;
            let (ptr, dtype, _g) = match &mut t.buf {
                CudaBuf::Bf16(b) => {
                    let (p, g) = b.device_ptr_mut(&self.stream);
                    (p, DataType::Bfloat16, g)
                }
                CudaBuf::F32(b) => {
                    let (p, g) = b.device_ptr_mut(&self.stream);
                    (p, DataType::Float32, g)
                }
                CudaBuf::E4m3 { .. } | CudaBuf::Fp8Unscaled { .. } => {
                    return Err(DeviceError::Op {
                        device: DEV,
                        op: "all-reduce",
                        msg: "an FP8 weight is not an activation".into(),
                    })
                }
            };
            // SAFETY: `ptr` holds `count` elements of `dtype` on this device; every rank runs
            // the same decoder over the same batch, so the collectives pair up in order.
            unsafe { tp.group.all_reduce_sum(tp.rank, ptr, count, dtype, stream) }
        })
    }

    /// The ranks' f32 `[rows, cols_r]` logits blocks side by side, in rank order: one NCCL
    /// all-gather of equal blocks (each padded to the widest rank's columns), then one strided
    /// copy per rank into place. Both enqueue on the stream, so decode graphs hold them.
    pub(super) fn tp_all_gather_cols(&self, t: CudaTensor) -> Result<CudaTensor, DeviceError> {
        let Some(tp) = &self.tp else {
            return Ok(t);
        };
        let n = tp.group.size();
        self.timed("all_gather", || {
            self.ctx.bind_to_thread().map_err(op_err("bind context"))?;
            let src = t.f32("all_gather_cols")?;
            let rows = t.rows;
            let widths = &tp.gather_widths;
            if widths.len() != n || t.cols != widths[tp.rank] {
                return Err(DeviceError::Op {
                    device: DEV,
                    op: "all_gather_cols",
                    msg: format!(
                        "rank {} has {} columns where its share of the LM head is {:?}",
                        tp.rank, t.cols, widths
                    ),
                });
            }
            let widest = widths.iter().copied().max().unwrap_or(0);
            let total: usize = widths.iter().sum();
            let mut out = self.alloc_f32(rows * total, "gathered logits")?;
            if rows == 0 {
                return Ok(CudaTensor::new_f32(0, total, out));
            }
            let block = rows * widest;
            let mut padded;
            let send = if t.cols == widest {
                src
            } else {
                padded = self.alloc_f32(block, "logits block")?;
                self.stream
                    .memcpy_dtod(src, &mut padded.slice_mut(0..rows * t.cols))
                    .map_err(op_err("logits block copy"))?;
                &padded
            };
            let mut all = self.alloc_f32(n * block, "all-gathered logits")?;
            let stream = self.stream.cu_stream() as *mut c_void;
            {
                let (sp, _gs) = send.device_ptr(&self.stream);
                let (rp, _gr) = all.device_ptr_mut(&self.stream);
                // SAFETY: `send` holds `block` f32s, `all` n · block; every rank gathers the
                // same block size in the same order.
                unsafe {
                    tp.group
                        .all_gather(tp.rank, (sp, rp), block, DataType::Float32, stream)?
                };
            }
            let ap = all.device_ptr(&self.stream).0;
            let op = out.device_ptr_mut(&self.stream).0;
            let mut col = 0;
            for (q, &w) in widths.iter().enumerate() {
                let copy = CUDA_MEMCPY2D {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    srcHost: std::ptr::null(),
                    srcDevice: ap + (q * block * 4) as u64,
                    srcArray: std::ptr::null_mut(),
                    srcPitch: w * 4,
                    dstXInBytes: 0,
                    dstY: 0,
                    dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    dstHost: std::ptr::null_mut(),
                    dstDevice: op + (col * 4) as u64,
                    dstArray: std::ptr::null_mut(),
                    dstPitch: total * 4,
                    WidthInBytes: w * 4,
                    Height: rows,
                };
                // SAFETY: rank q's block is `rows` rows of `w` f32s from `q · block`; they go to
                // columns `col..col + w` of `out`'s `rows` rows of `total`.
                unsafe { cuMemcpy2DAsync_v2(&copy, self.stream.cu_stream()) }
                    .result()
                    .map_err(op_err("logits scatter"))?;
                col += w;
            }
            Ok(CudaTensor::new_f32(rows, total, out))
        })
    }
}
