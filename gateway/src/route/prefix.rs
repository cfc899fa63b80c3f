//! Exact prefix routing. Each worker's cost is the prefill it would still have to do plus the
//! load it already carries, in blocks:
//!
//! ```text
//! cost = overlap_weight × (prompt_blocks − overlap_blocks) + load_weight × requests there
//! ```
//!
//! (Dynamo's KV router weighs new prefill blocks against active blocks the same way; here a
//! request in flight counts as `load_weight` blocks of work, 8 by default.) Before
//! that, the imbalance gate: a worker carrying more than `max(min_load × imbalance, min_load +
//! slack)` requests is not a candidate for the prefix preference, however much it holds, so a
//! popular prefix cannot pile everything onto one worker. Gated workers stay in the failover
//! order, after the others.

use super::{healthy, Decision, Policy, RouteRequest, WorkerView};

#[derive(Debug, Clone)]
pub struct Prefix {
    pub overlap_weight: f64,
    /// Blocks of work one request in flight stands for.
    pub load_weight: f64,
    /// A worker is overloaded beyond this multiple of the least load ...
    pub imbalance: f64,
    /// ... and beyond this many requests over it.
    pub slack: usize,
}

impl Default for Prefix {
    fn default() -> Self {
        Prefix {
            overlap_weight: 1.0,
            load_weight: 8.0,
            imbalance: 1.5,
            slack: 4,
        }
    }
}

impl Policy for Prefix {
    fn name(&self) -> &'static str {
        "prefix"
    }
    fn route(&self, req: &RouteRequest<'_>, workers: &[WorkerView]) -> Decision {
        let all = healthy(workers);
        let Some(min_load) = all.iter().map(|&i| workers[i].load()).min() else {
            return Decision {
                order: vec![],
                reason: "no_healthy_worker",
            };
        };
        let limit = ((min_load as f64 * self.imbalance) as usize).max(min_load + self.slack);
        let (open, gated): (Vec<usize>, Vec<usize>) =
            all.iter().partition(|&&i| workers[i].load() <= limit);
        let cost = |i: usize| {
            let w = &workers[i];
            self.overlap_weight * (req.prompt_blocks.saturating_sub(w.overlap_blocks)) as f64
                + self.load_weight * w.load() as f64
        };
        let mut order = open.clone();
        order.sort_by(|&a, &b| cost(a).total_cmp(&cost(b)).then(a.cmp(&b)));
        let mut rest = gated.clone();
        rest.sort_by_key(|&i| (workers[i].load(), i));
        let best_overlap = all
            .iter()
            .map(|&i| workers[i].overlap_blocks)
            .max()
            .unwrap_or(0);
        let reason = match order.first() {
            Some(&i)
                if workers[i].overlap_blocks > 0 && workers[i].overlap_blocks == best_overlap =>
            {
                "prefix_hit"
            }
            Some(&i) if workers[i].overlap_blocks > 0 => "partial_hit_lighter",
            Some(_) if gated.iter().any(|&g| workers[g].overlap_blocks > 0) => "overloaded_holder",
            Some(_) => "no_overlap",
            None => "no_healthy_worker",
        };
        order.extend(rest);
        Decision { order, reason }
    }
}
