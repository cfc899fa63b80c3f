//! Per-operation timing (`cachet bench forward --profile`): device events around each operation
//! while profiling is on, summed per operation when asked.

use std::cell::{Cell, RefCell};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;

use super::{op_err, CudaDevice};
use crate::error::DeviceError;

/// Events recorded while profiling.
#[derive(Default)]
pub struct Profiler {
    on: Cell<bool>,
    events: RefCell<Vec<(&'static str, CudaEvent, CudaEvent)>>,
    /// Labels made at run time ([`CudaDevice::label`]), each made once.
    labels: RefCell<std::collections::HashMap<String, &'static str>>,
}

impl CudaDevice {
    /// Runs `f`, bracketed by timing events when profiling.
    pub(super) fn timed<T>(
        &self,
        op: &'static str,
        f: impl FnOnce() -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        if !self.profiler.on.get() {
            return f();
        }
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(flags).map_err(op_err("event"))?;
        let out = f()?;
        let end = self.stream.record_event(flags).map_err(op_err("event"))?;
        self.profiler.events.borrow_mut().push((op, start, end));
        Ok(out)
    }

    /// A profile label made at run time (an operation's shape), kept for the process: each
    /// distinct label is allocated once, and only while profiling.
    pub(super) fn label(&self, text: String) -> &'static str {
        self.profiler
            .labels
            .borrow_mut()
            .entry(text)
            .or_insert_with_key(|k| Box::leak(k.clone().into_boxed_str()))
    }

    pub(super) fn profiling_on(&self) -> bool {
        self.profiler.on.get()
    }

    /// Turns profiling off for a while (graph capture and replay); what it was.
    pub(super) fn pause_profiling(&self) -> bool {
        self.profiler.on.replace(false)
    }

    pub(super) fn resume_profiling(&self, was: bool) {
        self.profiler.on.set(was);
    }

    pub(super) fn profiling(&self, on: bool) {
        self.profiler.on.set(on);
        self.profiler.events.borrow_mut().clear();
    }

    /// Time per operation since the last call: (operation, total ms, calls), largest first.
    pub(super) fn profile(&self) -> Result<Vec<(String, f64, usize)>, DeviceError> {
        self.stream.synchronize().map_err(op_err("synchronize"))?;
        let mut by_op: std::collections::BTreeMap<&'static str, (f64, usize)> = Default::default();
        for (op, start, end) in self.profiler.events.borrow_mut().drain(..) {
            let ms = start.elapsed_ms(&end).map_err(op_err("event timing"))? as f64;
            let e = by_op.entry(op).or_default();
            e.0 += ms;
            e.1 += 1;
        }
        let mut v: Vec<(String, f64, usize)> = by_op
            .into_iter()
            .map(|(k, (ms, n))| (k.to_string(), ms, n))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(v)
    }
}
