//! Every layer of a one-token decode step in one launch (`decode_layers.cu`, `CACHET_DECODE_LAYERS`):
//! a persistent kernel of one block an SM runs each layer's five phases — the QKV GEMV with its
//! norm, the attention, o_proj, gate|up with its norm and SwiGLU, down — separated by grid
//! barriers instead of kernel boundaries. Batch-1 decode of a dense model is bound by its
//! layers' structure as much as by its weights (BENCHMARKS.md §13b: ~27 µs a layer of launches,
//! ramp-ups and drains for the 8B, beside its 29 µs of FP8 weights); this takes the launches out.
//!
//! Taken for steps of one sequence and one new token over a bf16 KV cache, on a model of the plain
//! Llama structure ([`DenseLayer`]) whose projections are all bf16 or all FP8, head_dim 64 or
//! 128, one rank; anything else runs the layers one by one, as does a capture that finds no
//! table (the table of the layers' tensors is made outside captures:
//! [`crate::device::Device::prepare_decode_layers`]).

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

use super::batch::CudaBatch;
use super::kernels::{DL_MAX_GROUP, DL_MAX_HIDDEN, DL_MAX_KV_HEADS, DL_SMEM, DL_THREADS};
use super::tensor::{CudaBuf, CudaKv, CudaTensor, WeightRef};
use super::{op_err, CudaDevice};
use crate::device::{DenseLayer, DenseStep, KvCacheDtype};
use crate::error::DeviceError;

/// Pointers a layer takes in the kernel's table (DlLayer in decode_layers.cu).
const PTRS_PER_LAYER: usize = 12;

impl CudaDevice {
    /// The raw address of a device buffer.
    fn addr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(&self.stream);
        p
    }

    /// A weight's codes (or bf16 values) and row scales (0: none), and its
    /// [`WeightRef::format`].
    fn weight_addrs(&self, w: &CudaTensor) -> Option<(u64, u64, usize)> {
        let w = w.weight("decode layers").ok()?;
        let (values, scales) = match w {
            WeightRef::Bf16(b) => (self.addr(b), 0),
            WeightRef::E4m3 { codes, scales } => (self.addr(codes), self.addr(scales)),
        };
        Some((values, scales, w.format()))
    }

    /// Whether the persistent kernel is on and loaded (its shared memory could be had).
    fn decode_layers_on(&self) -> bool {
        self.options.decode_layers_fused && self.k.decode_layers.is_some()
    }

    /// The kernel's table of `layers` over `kv` (DlLayer: 12 pointers a layer) and the weights'
    /// format, if every projection has the same format and every norm is bf16.
    fn layer_table(
        &self,
        layers: &[DenseLayer<'_, CudaTensor>],
        kv: &CudaKv,
    ) -> Option<(Vec<u64>, usize)> {
        let mut table = Vec::with_capacity(layers.len() * PTRS_PER_LAYER);
        let mut format = None;
        for (l, layer) in layers.iter().enumerate() {
            let norm = |t: &CudaTensor| t.bf16("decode layers").ok().map(|b| self.addr(b));
            let mut proj = |t: &CudaTensor| {
                let (w, s, f) = self.weight_addrs(t)?;
                (*format.get_or_insert(f) == f).then_some([w, s])
            };
            let [qkv, qkv_s] = proj(layer.qkv)?;
            let [o, o_s] = proj(layer.o_proj)?;
            let [gu, gu_s] = proj(layer.gate_up)?;
            let [down, down_s] = proj(layer.down)?;
            let (k, v) = (kv.k.get(l)?, kv.v.get(l)?);
            table.extend([
                norm(layer.attn_norm)?,
                qkv,
                qkv_s,
                o,
                o_s,
                norm(layer.mlp_norm)?,
                gu,
                gu_s,
                down,
                down_s,
                self.addr(k),
                self.addr(v),
            ]);
        }
        Some((table, format?))
    }

    /// Writes `kv`'s table of `layers` to the device where it is missing or stale (never during
    /// a capture, which cannot copy from the host); whether `kv` now holds it. A table is
    /// rewritten in place, so graphs captured over it keep reading it.
    fn ensure_layer_table(&self, table: &[u64], kv: &mut CudaKv) -> Result<bool, DeviceError> {
        match &mut kv.layer_table {
            Some((host, _)) if host.as_slice() == table => Ok(true),
            _ if self.capturing.get() => Ok(false),
            Some((host, dev)) if host.len() == table.len() => {
                self.stream
                    .memcpy_htod(table, dev)
                    .map_err(op_err("decode layers table"))?;
                host.copy_from_slice(table);
                Ok(true)
            }
            slot => {
                let dev = self
                    .stream
                    .clone_htod(table)
                    .map_err(op_err("decode layers table"))?;
                *slot = Some((table.to_vec(), dev));
                Ok(true)
            }
        }
    }

    /// Whether the persistent kernel takes this model and step; its grid when it does.
    fn decode_layers_grid(
        &self,
        residual: &CudaTensor,
        kv: &CudaKv,
        b: &CudaBatch,
        step: &DenseStep<'_, CudaTensor>,
    ) -> Option<usize> {
        let p = &step.attn;
        let hidden = residual.cols;
        let (d, heads, kv_heads) = (p.head_dim, p.num_heads, p.num_kv_heads);
        let q_dim = heads * d;
        let widest = hidden.max(q_dim).max(step.intermediate);
        let fits = self.decode_layers_on()
            && self.tp.is_none()
            && b.n == 1
            && b.num_tiles == 1
            && kv.layout.dtype == KvCacheDtype::Auto
            && matches!(residual.buf, CudaBuf::F32(_))
            && residual.rows == 1
            && matches!(d, 64 | 128)
            && kv_heads > 0
            && heads.is_multiple_of(kv_heads)
            && heads / kv_heads <= DL_MAX_GROUP
            && kv_heads <= DL_MAX_KV_HEADS.min(self.sms)
            && p.window.is_none()
            && hidden <= DL_MAX_HIDDEN
            && hidden.is_multiple_of(16)
            && q_dim.is_multiple_of(16)
            && step.intermediate.is_multiple_of(16)
            && widest * 2 <= DL_SMEM;
        fits.then_some(self.sms)
    }

    /// [`crate::device::Device::prepare_decode_layers`] on this device.
    pub(super) fn prepare_layers_table(
        &self,
        layers: &[DenseLayer<'_, CudaTensor>],
        kv: &mut CudaKv,
    ) -> Result<(), DeviceError> {
        if !self.decode_layers_on() {
            return Ok(());
        }
        if let Some((table, _)) = self.layer_table(layers, kv) {
            self.ensure_layer_table(&table, kv)?;
        }
        Ok(())
    }

    /// [`crate::device::Device::decode_layers`] on this device.
    pub(super) fn run_decode_layers(
        &self,
        residual: &mut CudaTensor,
        layers: &[DenseLayer<'_, CudaTensor>],
        kv: &mut CudaKv,
        b: &CudaBatch,
        step: &DenseStep<'_, CudaTensor>,
    ) -> Result<Option<CudaTensor>, DeviceError> {
        if layers.is_empty() {
            return Ok(None);
        }
        let hidden = residual.cols;
        let Some(grid) = self.decode_layers_grid(residual, kv, b, step) else {
            return Ok(None);
        };
        let Some((table, format)) = self.layer_table(layers, kv) else {
            return Ok(None);
        };
        if !self.ensure_layer_table(&table, kv)? {
            return Ok(None);
        }
        let Some(kernels) = &self.k.decode_layers else {
            return Ok(None);
        };
        let p = &step.attn;
        let d = p.head_dim;
        let func = &kernels[format][usize::from(d == 128)];
        let (heads, kv_heads, inter) = (p.num_heads, p.num_kv_heads, step.intermediate);
        let qkv_n = (heads + 2 * kv_heads) * d;
        let blocks_per_head = grid / kv_heads;
        self.timed("decode layers", || {
            let CudaBuf::F32(res_a) = &mut residual.buf else {
                unreachable!("checked by decode_layers_grid");
            };
            let mut res_b = self.alloc_f32(hidden, "decode layers")?;
            let mut qkv = self.alloc_bf16(qkv_n, "decode layers")?;
            let mut attn = self.alloc_bf16(heads * d, "decode layers")?;
            let mut o_out = self.alloc_bf16(hidden, "decode layers")?;
            let mut act = self.alloc_bf16(inter, "decode layers")?;
            let mut down = self.alloc_bf16(hidden, "decode layers")?;
            let mut part = self.alloc_f32(heads * blocks_per_head * (d + 2), "decode layers")?;
            let (_, dev_table) = kv.layer_table.as_ref().expect("ensured above");
            let ints = [
                layers.len() as i32,
                hidden as i32,
                inter as i32,
                heads as i32,
                kv_heads as i32,
            ];
            let bs = b.block_size as i32;
            let mut l = self.stream.launch_builder(func);
            l.arg(dev_table);
            for i in &ints {
                l.arg(i);
            }
            l.arg(&mut *res_a)
                .arg(&mut res_b)
                .arg(&mut qkv)
                .arg(&mut attn)
                .arg(&mut o_out)
                .arg(&mut act)
                .arg(&mut down)
                .arg(&mut part)
                .arg(&self.dl_sync)
                .arg(step.rope.f32("decode layers")?)
                .arg(&b.pos)
                .arg(&b.slots)
                .arg(&b.block_tables)
                .arg(&bs)
                .arg(&p.scale)
                .arg(&step.eps);
            let cfg = LaunchConfig {
                grid_dim: (grid as u32, 1, 1),
                block_dim: (DL_THREADS, 1, 1),
                shared_mem_bytes: DL_SMEM as u32,
            };
            // SAFETY: the arguments follow decode_layers.cu's signature; the grid is one block an
            // SM with DL_SMEM each (more than half an SM's, so every block is resident at once),
            // the shapes are within the kernel's limits (decode_layers_grid), the table holds
            // every layer's tensors and this cache's buffers, the sync words are zero between
            // launches, and the batch is one sequence of one token whose block table covers its
            // context.
            unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("decode layers"))?;
            // 2 · layers − 1 residual updates, each into the other buffer: it ends in res_b.
            residual.buf = CudaBuf::F32(res_b);
            Ok(Some(CudaTensor::new_bf16(1, hidden, down)))
        })
    }
}
