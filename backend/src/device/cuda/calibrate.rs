//! The device's ceilings, measured in the same run as a benchmark: device-to-device copy
//! bandwidth and the cuBLAS bf16 GEMM rate.

use super::{op_err, CudaDevice};
use crate::device::{Calibration, Device};
use crate::error::DeviceError;

/// Median of `reps` timed runs of `f` after `warm` untimed ones, the device synchronised around
/// each.
fn median_secs(
    dev: &CudaDevice,
    warm: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<(), DeviceError>,
) -> Result<f64, DeviceError> {
    let mut times = Vec::with_capacity(reps);
    for i in 0..warm + reps {
        dev.synchronize()?;
        let t = std::time::Instant::now();
        f()?;
        dev.synchronize()?;
        if i >= warm {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

impl CudaDevice {
    /// Device-to-device copy bandwidth (bytes read + written per second) over `bytes`.
    pub fn measure_copy_bandwidth(&self, bytes: usize) -> Result<f64, DeviceError> {
        let n = bytes / 4;
        let src = self.random(&[n / 2, 2], 1, 0.0, 1.0)?;
        let src = src.bf16("copy")?;
        let mut dst = self.alloc_bf16(src.len(), "copy")?;
        let secs = median_secs(self, 2, 10, || {
            self.stream
                .memcpy_dtod(src, &mut dst)
                .map_err(op_err("copy"))
        })?;
        Ok(2.0 * (src.len() * 2) as f64 / secs)
    }

    /// cuBLAS bf16 GEMM rate (FLOP/s) at `n`×`n`×`n` on random data.
    pub fn measure_gemm_flops(&self, n: usize) -> Result<f64, DeviceError> {
        let a = self.random(&[n, n], 2, 0.0, 1.0)?;
        let b = self.random(&[n, n], 3, 0.0, 1.0)?;
        let secs = median_secs(self, 3, 10, || self.gemm(&a, &b, false).map(drop))?;
        Ok(2.0 * (n as f64).powi(3) / secs)
    }

    /// Seconds of `repeat` passes over the GEMMs `shapes` ((rows, out, in), bf16 out) back to
    /// back, each shape with its own random weights and activation, as one timed run: median
    /// of 5 after 2; weights scaled as dummy weights are (std 1/√in). (A layer's weights are far
    /// larger than L2, so repeating one layer's GEMMs reads from memory as distinct layers do.)
    pub fn measure_gemm_sequence(
        &self,
        shapes: &[(usize, usize, usize)],
        repeat: usize,
    ) -> Result<f64, DeviceError> {
        let mut operands = Vec::with_capacity(shapes.len());
        for (i, &(rows, out, inp)) in shapes.iter().enumerate() {
            let seed = 10 + 2 * i as u64;
            operands.push((
                self.random(&[rows, inp], seed, 0.0, 1.0)?,
                self.random(&[out, inp], seed + 1, 0.0, 1.0 / (inp as f32).sqrt())?,
            ));
        }
        median_secs(self, 2, 5, || {
            for _ in 0..repeat {
                for (x, w) in &operands {
                    self.gemm(x, w, false)?;
                }
            }
            Ok(())
        })
    }

    /// Seconds of `count` NCCL all-reduces of `elems` bf16 values back to back: median of 5
    /// timed runs after 2 (every rank runs the same, so they pair up).
    pub fn measure_all_reduce(&self, elems: usize, count: usize) -> Result<f64, DeviceError> {
        let mut t = self.random(&[elems], 4, 0.0, 1.0)?;
        median_secs(self, 2, 5, || {
            for _ in 0..count {
                self.tp_all_reduce(&mut t)?;
            }
            Ok(())
        })
    }

    pub(super) fn measure(&self) -> Result<Calibration, DeviceError> {
        Ok(Calibration {
            copy_bytes_per_s: self.measure_copy_bandwidth(4 << 30)?,
            gemm_flops: self.measure_gemm_flops(8192)?,
        })
    }
}
