//! The CUDA device's [`Instruments`]: per-operation profiles, calibration, timed GEMMs and
//! collectives, and the decode steps' CUDA graphs — each a call into the file that owns it.

use super::*;
use crate::device::Instruments;

impl Instruments for CudaDevice {
    fn set_profiling(&self, on: bool) {
        self.profiling(on)
    }

    fn take_profile(&self) -> Result<Vec<(String, f64, usize)>, DeviceError> {
        self.profile()
    }

    fn calibrate(&self) -> Result<Option<crate::device::Calibration>, DeviceError> {
        self.measure().map(Some)
    }

    fn time_gemms(
        &self,
        shapes: &[(usize, usize, usize)],
        repeat: usize,
    ) -> Result<Option<f64>, DeviceError> {
        self.measure_gemm_sequence(shapes, repeat).map(Some)
    }

    fn time_all_reduce(&self, elems: usize, count: usize) -> Result<Option<f64>, DeviceError> {
        match &self.tp {
            Some(_) => self.measure_all_reduce(elems, count).map(Some),
            None => Ok(None),
        }
    }

    fn capture_decode_graphs(
        &self,
        kv: &mut CudaKv,
        shapes: &crate::device::GraphShapes,
        max_len: usize,
        vocab: usize,
        body: &mut crate::device::ForwardBody<'_, Self>,
    ) -> Result<Option<crate::device::GraphReport>, crate::error::EngineError> {
        self.capture_all(kv, shapes, max_len, vocab, body)
    }

    fn forward_graphed(
        &self,
        kv: &mut CudaKv,
        batch: &ForwardBatch,
        body: &mut crate::device::ForwardBody<'_, Self>,
    ) -> Result<Option<CudaTensor>, crate::error::EngineError> {
        self.replay(kv, batch, body)
    }

    fn set_graphs_enabled(&self, kv: &mut CudaKv, on: bool) -> bool {
        match &mut kv.graphs {
            Some(g) => {
                g.enabled = on;
                true
            }
            None => false,
        }
    }
}
