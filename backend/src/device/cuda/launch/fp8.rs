//! The FP8 kernels' launches (fp8.cu): row quantization (alone and fused with the norm),
//! dequantization and the GEMM epilogues that apply the scales; each as safe as the launches
//! of [`super`].

use super::{norm_config, rows_config, short_buffers};
use crate::config::Activation;
use crate::device::cuda::{op_err, CudaDevice};
use crate::error::DeviceError;
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};

/// The bf16 FP8 epilogues' grid (`fp8_scale_bf16_bf16*`, `fp8_scale_{act}_bf16`): eight columns
/// a thread, 256 threads a block (gemv.cu's FP8_SCALE_THREADS), a row of blocks per token.
fn fp8_scale_config(n: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (cols.div_ceil(8 * 256) as u32, n as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaDevice {
    /// `fp8_scale_{silu|gelu_tanh}_bf16(bf16 d[n, 2i], f32 w_scale[2i], f32 x_scale[n],
    /// bf16 out[n, i], int n, int i)`: the FP8 gate|up product scaled and gated in one pass.
    pub(in crate::device::cuda) fn launch_fp8_scale_glu(
        &self,
        act: Activation,
        d: &CudaSlice<u16>,
        (w_scale, x_scale): (&CudaSlice<f32>, &CudaSlice<f32>),
        out: &mut CudaSlice<u16>,
        (n, i): (usize, usize),
    ) -> Result<(), DeviceError> {
        if d.len() < n * 2 * i || w_scale.len() < 2 * i || x_scale.len() < n || out.len() < n * i {
            return Err(short_buffers("fp8_scale_glu", n, 2 * i));
        }
        if !i.is_multiple_of(8) || n > 65535 {
            return Err(DeviceError::Op {
                device: crate::device::cuda::DEV,
                op: "fp8_scale_glu",
                msg: format!("{n} rows of {i}: at most 65,535 rows of a multiple of 8"),
            });
        }
        let (ni, ii) = (n as i32, i as i32);
        let mut l = self
            .stream
            .launch_builder(&self.k.fp8_scale_glu[act as usize]);
        l.arg(d)
            .arg(w_scale)
            .arg(x_scale)
            .arg(out)
            .arg(&ni)
            .arg(&ii);
        let cfg = fp8_scale_config(n, i);
        // SAFETY: d holds n rows of 2i, out n rows of i, the scales 2i and n (checked above),
        // i a multiple of 8 for the 16-byte accesses (fresh allocations, 16-byte aligned);
        // threads past i return.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("fp8_scale_glu"))?;
        Ok(())
    }

    /// `quantize_rows_e4m3` / `quantize_act_rows_e4m3(bf16 w[n, k], e4m3 codes[n, k], f32
    /// scale[n], int n, int k)`, one block per row: `exact` (weights, the CPU's arithmetic) or
    /// a GEMM's input rows, each read once (k a multiple of 8).
    pub(in crate::device::cuda) fn launch_quantize_rows_e4m3(
        &self,
        exact: bool,
        w: &CudaSlice<u16>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        (n, k): (usize, usize),
    ) -> Result<(), DeviceError> {
        let (name, f) = if exact {
            ("quantize_rows_e4m3", &self.k.quantize_rows_e4m3)
        } else {
            ("quantize_act_rows_e4m3", &self.k.quantize_act_rows_e4m3)
        };
        if w.len() < n * k
            || codes.len() < n * k
            || scales.len() < n
            || !(exact || k.is_multiple_of(8))
        {
            return Err(short_buffers(name, n, k));
        }
        let (ni, ki) = (n as i32, k as i32);
        let mut l = self.stream.launch_builder(f);
        l.arg(w).arg(codes).arg(scales).arg(&ni).arg(&ki);
        // SAFETY: w and codes hold n·k elements and scales n (checked above); for the
        // vectorized kernel k is a multiple of 8, so every row starts 16-byte aligned in both
        // (allocations are); one block of 256 threads (its ACT_Q_THREADS) per row.
        unsafe { self.enqueue(&mut l, rows_config(n, 256)) }.map_err(op_err(name))?;
        Ok(())
    }

    /// `rms_norm_e4m3(f32 residual[rows, cols], bf16 delta[rows, cols] or null, bf16 delta_w[cols]
    /// or null, bf16 w[cols], e4m3 codes[rows, cols], f32 scale[rows], int cols, float eps)`: a
    /// sub-layer's norm (adding `delta` into the residual when given) into the FP8 GEMM's input.
    /// Rows of at most 8 · 1024 columns (held in registers: the caller checks
    /// [`crate::device::cuda::gemm::FP8_NORM_MAX_COLS`]).
    pub(in crate::device::cuda) fn launch_rms_norm_e4m3(
        &self,
        residual: &mut CudaSlice<f32>,
        delta: Option<crate::device::cuda::gemv::DeltaSlices<'_>>,
        w: &CudaSlice<u16>,
        (codes, scale): (&mut CudaSlice<u8>, &mut CudaSlice<f32>),
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<(), DeviceError> {
        let short = residual.len() < rows * cols
            || delta.is_some_and(|d| d.short(rows, cols))
            || w.len() < cols
            || codes.len() < rows * cols
            || scale.len() < rows;
        if short || cols > crate::device::cuda::gemm::FP8_NORM_MAX_COLS {
            return Err(short_buffers("rms_norm_e4m3", rows, cols));
        }
        let c = cols as i32;
        let null = 0u64;
        let mut l = self.stream.launch_builder(&self.k.rms_norm_e4m3);
        l.arg(residual);
        match delta {
            Some(d) => {
                l.arg(d.x);
                match d.norm {
                    Some(n) => l.arg(n),
                    None => l.arg(&null),
                };
            }
            None => {
                l.arg(&null).arg(&null);
            }
        }
        l.arg(w).arg(codes).arg(scale).arg(&c).arg(&eps);
        match delta.and_then(|d| d.scales) {
            Some((ws, xs)) => l.arg(ws).arg(xs),
            None => l.arg(&null).arg(&null),
        };
        // SAFETY: the buffers hold what the kernel reads and writes (checked above); each block
        // reads and writes its own row; cols ≤ 8 · 1024, so norm_config's threads hold a row in
        // registers.
        unsafe { self.enqueue(&mut l, norm_config(rows, cols)) }
            .map_err(op_err("rms_norm_e4m3"))?;
        Ok(())
    }

    /// `dequantize_rows_e4m3(e4m3 codes[n, k], f32 scale[n], bf16 w[n, k], int n, int k)`: the
    /// codes and scales may be views into a larger weight (an expert's block of rows).
    pub(in crate::device::cuda) fn launch_dequantize_rows_e4m3(
        &self,
        codes: &CudaView<'_, u8>,
        scales: &CudaView<'_, f32>,
        w: &mut CudaSlice<u16>,
        (n, k): (usize, usize),
    ) -> Result<(), DeviceError> {
        if w.len() < n * k || codes.len() < n * k || scales.len() < n {
            return Err(short_buffers("dequantize_rows_e4m3", n, k));
        }
        let (ni, ki) = (n as i32, k as i32);
        let mut l = self.stream.launch_builder(&self.k.dequantize_rows_e4m3);
        l.arg(codes).arg(scales).arg(w).arg(&ni).arg(&ki);
        let cfg = LaunchConfig {
            grid_dim: ((self.sms * 4) as u32, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every buffer holds what n rows of k take (checked above); grid-stride loop.
        // With k % 16 == 0 the kernel's 16-byte loads start at row boundaries of a whole
        // allocation (views are taken at whole rows), so they are aligned.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("dequantize_rows_e4m3"))?;
        Ok(())
    }

    /// `fp8_scale_bf16_bf16_rows(bf16 d[n, m], f32 w_scale[..], u32 w_first[n], f32
    /// x_scale[n], bf16 out[n, m], int n, int m)`: row t scaled by `w_scale[w_first[t]..][..m]`
    /// and `x_scale[t]` (a mixture's sorted rows, each by its expert's weight rows); `w_first`
    /// is checked here and uploaded.
    pub(in crate::device::cuda) fn launch_fp8_scale_rows(
        &self,
        d: &CudaSlice<u16>,
        (w_scale, w_first, x_scale): (&CudaSlice<f32>, &[u32], &CudaSlice<f32>),
        out: &mut CudaSlice<u16>,
        (n, m): (usize, usize),
    ) -> Result<(), DeviceError> {
        let scales_fit = w_first
            .iter()
            .all(|&f| f.is_multiple_of(4) && f as usize + m <= w_scale.len());
        if d.len() < n * m
            || w_first.len() < n
            || !scales_fit
            || x_scale.len() < n
            || out.len() < n * m
            || !m.is_multiple_of(8)
            || n > 65535
        {
            return Err(short_buffers("fp8_scale_bf16_bf16_rows", n, m));
        }
        let w_first = self.htod_u32(w_first)?;
        let (ni, mi) = (n as i32, m as i32);
        let mut l = self.stream.launch_builder(&self.k.fp8_scale_rows);
        l.arg(d)
            .arg(w_scale)
            .arg(&w_first)
            .arg(x_scale)
            .arg(out)
            .arg(&ni)
            .arg(&mi);
        let cfg = fp8_scale_config(n, m);
        // SAFETY: d and out hold n·m elements, w_first and x_scale n, and every row's m weight
        // scales lie inside w_scale from a multiple of 4 (checked above), so the scales'
        // 16-byte loads are aligned; m % 8 == 0 for the 16-byte accesses of d and out.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("fp8_scale_bf16_bf16_rows"))?;
        Ok(())
    }

    /// `fp8_scale_out_{bf16|f32}(f32 d[n, m], f32 w_scale[m], f32 x_scale[n], out[n, m], int n,
    /// int m)`: the FP8 GEMM's product scaled by its weight rows' and tokens' scales.
    pub(in crate::device::cuda) fn launch_fp8_scale_out(
        &self,
        d: crate::device::cuda::gemm_fp8::Fp8Product<'_>,
        (w_scale, x_scale): (&CudaSlice<f32>, &CudaSlice<f32>),
        out: crate::device::cuda::gemm_fp8::Fp8Out<'_>,
        (n, m): (usize, usize),
    ) -> Result<(), DeviceError> {
        use crate::device::cuda::gemm_fp8::{Fp8Out, Fp8Product};
        let out_len = match &out {
            Fp8Out::Bf16(o) => o.len(),
            Fp8Out::F32(o) => o.len(),
        };
        let d_len = match &d {
            Fp8Product::F32(d) => d.len(),
            Fp8Product::Bf16(d) => d.len(),
        };
        if d_len < n * m
            || w_scale.len() < m
            || x_scale.len() < n
            || out_len < n * m
            || !m.is_multiple_of(4)
        {
            return Err(short_buffers("fp8_scale_out", n, m));
        }
        let (ni, mi) = (n as i32, m as i32);
        let cfg = match &d {
            // m is a multiple of 16 (the FP8 GEMM's condition).
            Fp8Product::Bf16(_) if m.is_multiple_of(8) && n <= 65535 => fp8_scale_config(n, m),
            Fp8Product::Bf16(_) => {
                return Err(DeviceError::Op {
                    device: crate::device::cuda::DEV,
                    op: "fp8_scale_bf16_bf16",
                    msg: format!("{n} rows of {m}: at most 65,535 rows of a multiple of 8"),
                })
            }
            Fp8Product::F32(_) => LaunchConfig {
                grid_dim: ((self.sms * 4) as u32, 1, 1),
                block_dim: (512, 1, 1),
                shared_mem_bytes: 0,
            },
        };
        let mut l = self.stream.launch_builder(match (&d, &out) {
            (Fp8Product::F32(_), Fp8Out::Bf16(_)) => &self.k.fp8_scale_out[0],
            (Fp8Product::F32(_), Fp8Out::F32(_)) => &self.k.fp8_scale_out[1],
            (Fp8Product::Bf16(_), Fp8Out::Bf16(_)) => &self.k.fp8_scale_out[2],
            (Fp8Product::Bf16(_), Fp8Out::F32(_)) => {
                return Err(DeviceError::Op {
                    device: crate::device::cuda::DEV,
                    op: "fp8_scale_out",
                    msg: "a bf16 product is scaled into bf16 only".into(),
                })
            }
        });
        match d {
            Fp8Product::F32(d) => l.arg(d),
            Fp8Product::Bf16(d) => l.arg(d),
        };
        l.arg(w_scale).arg(x_scale);
        match out {
            Fp8Out::Bf16(o) => l.arg(o),
            Fp8Out::F32(o) => l.arg(o),
        };
        l.arg(&ni).arg(&mi);
        // SAFETY: d and out hold n·m elements (out a buffer of its own), the scales m and n, m a
        // multiple of four — of eight for the bf16 product's 16-byte accesses — (checked above;
        // fresh allocations, 16-byte aligned); a grid-stride loop, or a thread per eight
        // columns of one row with the threads past m returning.
        unsafe { self.enqueue(&mut l, cfg) }.map_err(op_err("fp8_scale_out"))?;
        Ok(())
    }
}
