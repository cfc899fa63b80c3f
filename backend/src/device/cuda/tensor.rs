//! Device memory: tensors (bf16 or f32, row-major 2-D; projection weights also FP8 with a scale
//! per row), the paged KV cache, and the allocation
//! helpers every operation uses. Output buffers are left uninitialised: every kernel and GEMM
//! that writes one covers all of it (no memset on the hot path).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use half::bf16;

use super::graphs::DecodeGraphs;
use super::{op_err, CudaDevice, DEV};
use crate::device::{KvCacheDtype, KvLayout};
use crate::error::DeviceError;
use crate::tensor::HostTensor;

/// Device memory of a tensor.
pub enum CudaBuf {
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
    /// A projection's weights in FP8 (`--quantization fp8`): e4m3fn codes `[rows, cols]` and one
    /// f32 scale per row (`w[j, :] ≈ e4m3(codes[j, :]) · scales[j]`; shared with the
    /// [`CudaBuf::Fp8Unscaled`] products of the weight).
    E4m3 {
        codes: CudaSlice<u8>,
        scales: Arc<CudaSlice<f32>>,
    },
    /// A bf16 activation still to be scaled: cuBLASLt's bf16 product of an FP8 weight's codes and
    /// the rows' codes (`product`, its rows padded as the product ran), whose value is
    /// `bf16(product[t, j] · w_scale[j] · x_scale[t])` — `fp8_scale_bf16_bf16`'s arithmetic. A
    /// sub-layer's output (o_proj, down) stays so until the next norm adds it to the residual
    /// and applies the scales on the way ([`crate::device::Device::linear_delta`]), which saves
    /// the scales' launch; anything else settles it first (`CudaDevice::settle`).
    Fp8Unscaled {
        product: CudaSlice<u16>,
        w_scale: Arc<CudaSlice<f32>>,
        x_scale: CudaSlice<f32>,
    },
}

/// A projection's weights as the GEMV kernels take them.
#[derive(Clone, Copy)]
pub enum WeightRef<'a> {
    Bf16(&'a CudaSlice<u16>),
    E4m3 {
        codes: &'a CudaSlice<u8>,
        scales: &'a CudaSlice<f32>,
    },
}

impl WeightRef<'_> {
    /// Index of the weight format in the kernel tables (bf16 0, e4m3 1).
    pub fn format(&self) -> usize {
        match self {
            WeightRef::Bf16(_) => 0,
            WeightRef::E4m3 { .. } => 1,
        }
    }
    /// Elements a row's length must be a multiple of (one 16-byte load).
    pub fn k_multiple(&self) -> usize {
        match self {
            WeightRef::Bf16(_) => 8,
            WeightRef::E4m3 { .. } => 16,
        }
    }
}

pub struct CudaTensor {
    pub rows: usize,
    pub cols: usize,
    pub buf: CudaBuf,
}

impl CudaTensor {
    pub fn bf16(&self, op: &'static str) -> Result<&CudaSlice<u16>, DeviceError> {
        match &self.buf {
            CudaBuf::Bf16(b) => Ok(b),
            _ => Err(wrong_type(op, "bf16")),
        }
    }
    pub fn f32(&self, op: &'static str) -> Result<&CudaSlice<f32>, DeviceError> {
        match &self.buf {
            CudaBuf::F32(b) => Ok(b),
            _ => Err(wrong_type(op, "f32")),
        }
    }
    pub fn bf16_mut(&mut self, op: &'static str) -> Result<&mut CudaSlice<u16>, DeviceError> {
        match &mut self.buf {
            CudaBuf::Bf16(b) => Ok(b),
            _ => Err(wrong_type(op, "bf16")),
        }
    }
    pub fn f32_mut(&mut self, op: &'static str) -> Result<&mut CudaSlice<f32>, DeviceError> {
        match &mut self.buf {
            CudaBuf::F32(b) => Ok(b),
            _ => Err(wrong_type(op, "f32")),
        }
    }
    /// The tensor as projection weights: bf16 or FP8.
    pub fn weight(&self, op: &'static str) -> Result<WeightRef<'_>, DeviceError> {
        match &self.buf {
            CudaBuf::Bf16(b) => Ok(WeightRef::Bf16(b)),
            CudaBuf::E4m3 { codes, scales } => Ok(WeightRef::E4m3 { codes, scales }),
            CudaBuf::F32(_) | CudaBuf::Fp8Unscaled { .. } => Err(wrong_type(op, "bf16 or FP8")),
        }
    }
    pub fn new_bf16(rows: usize, cols: usize, buf: CudaSlice<u16>) -> Self {
        CudaTensor {
            rows,
            cols,
            buf: CudaBuf::Bf16(buf),
        }
    }
    pub fn new_f32(rows: usize, cols: usize, buf: CudaSlice<f32>) -> Self {
        CudaTensor {
            rows,
            cols,
            buf: CudaBuf::F32(buf),
        }
    }
}

fn wrong_type(op: &'static str, want: &str) -> DeviceError {
    DeviceError::Op {
        device: DEV,
        op,
        msg: format!("expected a {want} tensor"),
    }
}

impl CudaTensor {
    /// An FP8 product whose scales are still to apply ([`CudaBuf::Fp8Unscaled`]).
    pub fn is_unscaled(&self) -> bool {
        matches!(self.buf, CudaBuf::Fp8Unscaled { .. })
    }
}

/// The paged KV cache: per layer, K and V of `[num_slots, n_kv, d]`, bf16 (as raw bytes) or e4m3
/// codes with f32 scales of `[num_slots, n_kv]` (one-element placeholders for bf16).
pub struct CudaKv {
    pub layout: KvLayout,
    pub(super) k: Vec<CudaSlice<u8>>,
    pub(super) v: Vec<CudaSlice<u8>>,
    pub(super) k_scale: Vec<CudaSlice<f32>>,
    pub(super) v_scale: Vec<CudaSlice<f32>>,
    /// INT8: each layer's table ([`crate::device::kv_int8::KvInt8Table::layer`]); other dtypes:
    /// one unread element per layer.
    pub(super) int8_table: Vec<CudaSlice<f32>>,
    /// Decode graphs captured over this cache.
    pub(super) graphs: Option<DecodeGraphs>,
}

/// bf16 bits of a host tensor.
pub fn host_bf16(t: &HostTensor) -> Vec<u16> {
    use rayon::prelude::*;
    // On rayon's threads: a model's weights go through here as they load.
    t.data
        .par_iter()
        .with_min_len(1 << 16)
        .map(|&x| bf16::from_f32(x).to_bits())
        .collect()
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>, DeviceError> {
    stream
        .alloc_zeros::<T>(n.max(1))
        .map_err(|e| DeviceError::OutOfMemory {
            device: DEV,
            bytes: n * std::mem::size_of::<T>(),
            what: format!("KV cache ({e:?})"),
        })
}

impl CudaDevice {
    /// An uninitialised output buffer of `n` elements of `T` (a plain number type: every bit
    /// pattern is a value).
    pub(super) fn alloc_out<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
        what: &str,
    ) -> Result<CudaSlice<T>, DeviceError> {
        // SAFETY: T is a plain number type (ValidAsZeroBits: no invalid bit patterns); callers
        // fully write the buffer before reading it.
        let buf = unsafe { self.stream.alloc::<T>(n.max(1)) };
        buf.map_err(|e| DeviceError::OutOfMemory {
            device: DEV,
            bytes: n * std::mem::size_of::<T>(),
            what: format!("{what} ({e:?})"),
        })
    }

    /// An uninitialised bf16 output buffer of `n` elements.
    pub(super) fn alloc_bf16(&self, n: usize, what: &str) -> Result<CudaSlice<u16>, DeviceError> {
        self.alloc_out(n, what)
    }

    /// An uninitialised f32 output buffer of `n` elements.
    pub(super) fn alloc_f32(&self, n: usize, what: &str) -> Result<CudaSlice<f32>, DeviceError> {
        self.alloc_out(n, what)
    }

    /// `v` in device memory (one zero for an empty slice: kernels never get a null pointer).
    pub(super) fn htod_u32(&self, v: &[u32]) -> Result<CudaSlice<u32>, DeviceError> {
        let v = if v.is_empty() { &[0u32][..] } else { v };
        self.stream.clone_htod(v).map_err(op_err("upload batch"))
    }

    /// The paged KV cache of `layout`, zeroed, with its INT8 table where it is one.
    pub(super) fn alloc_kv_cache(
        &self,
        layout: &KvLayout,
        int8: Option<&crate::device::kv_int8::KvInt8Table>,
    ) -> Result<CudaKv, DeviceError> {
        let int8 = crate::device::kv_int8::check_table(DEV, layout, int8)?;
        let heads = layout.num_slots() * layout.num_kv_heads;
        let n = heads * layout.head_dim;
        // FP8 and INT8 take the same buffers: a byte per value and 4 per token-head.
        let coded = layout.dtype != KvCacheDtype::Auto;
        if coded && !layout.head_dim.is_multiple_of(8) {
            return Err(DeviceError::Op {
                device: DEV,
                op: "alloc_kv",
                msg: format!(
                    "an {} KV cache needs head_dim divisible by 8 (got {})",
                    layout.dtype, layout.head_dim
                ),
            });
        }
        let (bytes, scales) = if coded { (n, heads) } else { (2 * n, 1) };
        let mut kv = CudaKv {
            layout: *layout,
            k: Vec::with_capacity(layout.num_layers),
            v: Vec::with_capacity(layout.num_layers),
            k_scale: Vec::with_capacity(layout.num_layers),
            v_scale: Vec::with_capacity(layout.num_layers),
            int8_table: Vec::with_capacity(layout.num_layers),
            graphs: None,
        };
        for layer in 0..layout.num_layers {
            kv.k.push(zeros(&self.stream, bytes)?);
            kv.v.push(zeros(&self.stream, bytes)?);
            kv.k_scale.push(zeros(&self.stream, scales)?);
            kv.v_scale.push(zeros(&self.stream, scales)?);
            kv.int8_table.push(match int8 {
                Some(t) => self
                    .stream
                    .clone_htod(t.layer(layer))
                    .map_err(super::op_err("upload"))?,
                None => zeros(&self.stream, 1)?,
            });
        }
        Ok(kv)
    }
}
