//! Round robin over the healthy workers.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{healthy, Decision, Policy, RouteRequest, WorkerView};

#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }
    fn route(&self, _req: &RouteRequest<'_>, workers: &[WorkerView]) -> Decision {
        let mut order = healthy(workers);
        if !order.is_empty() {
            let k = self.next.fetch_add(1, Ordering::Relaxed) % order.len();
            order.rotate_left(k);
        }
        Decision {
            order,
            reason: "turn",
        }
    }
}
