//! The least loaded healthy worker first (requests there, then KV use).

use super::{healthy, Decision, Policy, RouteRequest, WorkerView};

#[derive(Debug, Default)]
pub struct LeastLoad;

impl Policy for LeastLoad {
    fn name(&self) -> &'static str {
        "least_load"
    }
    fn route(&self, _req: &RouteRequest<'_>, workers: &[WorkerView]) -> Decision {
        let mut order = healthy(workers);
        order.sort_by_key(|&i| (workers[i].load(), workers[i].kv_used, i));
        Decision {
            order,
            reason: "least_load",
        }
    }
}
