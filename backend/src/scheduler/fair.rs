//! Token-fair sharing between tenants: a virtual token counter per tenant (VTC, after Sheng et al.,
//! "Fairness in Serving Large Language Models", OSDI '24). Every token a step computes for a
//! tenant's request adds its cost divided by the tenant's share to the tenant's counter: a prompt
//! token costs 1, a generated (sampled) token [`DECODE_WEIGHT`]. The waiting tenant with the
//! least counter is admitted first and the running tenant with the most is preempted first;
//! inside one tenant the scheduler's policy (priority class, shortest-first, arrival) still
//! orders its requests.
//!
//! A tenant that had nothing in the engine and sends again starts at the least counter of the
//! tenants with requests: idle time earns no credit to flood with later, and a tenant that used
//! more than its share keeps that debt while others are served.

use std::collections::HashMap;

/// A generated token costs this many prompt tokens (the paper's w_q / w_p).
pub const DECODE_WEIGHT: f64 = 2.0;

/// The tenants' virtual token counters.
#[derive(Debug, Default, Clone)]
pub struct FairShare {
    counters: HashMap<String, f64>,
}

impl FairShare {
    /// Tenant `t`'s counter (0 for one never seen).
    pub fn counter(&self, t: &str) -> f64 {
        self.counters.get(t).copied().unwrap_or(0.0)
    }

    /// Tenant `t` sends a request while it has none in the engine; `active` are the counters of
    /// the tenants that do. It starts no lower than the least of them.
    pub fn activate(&mut self, t: &str, active: impl Iterator<Item = f64>) {
        let Some(floor) = active.min_by(f64::total_cmp) else {
            return;
        };
        let c = self.counters.entry(t.to_string()).or_insert(0.0);
        *c = c.max(floor);
    }

    /// Charges `prompt` prompt tokens and `generated` sampled positions to `t`, whose share is
    /// `share` (> 0).
    pub fn charge(&mut self, t: &str, prompt: usize, generated: usize, share: f32) {
        let cost = prompt as f64 + generated as f64 * DECODE_WEIGHT;
        *self.counters.entry(t.to_string()).or_insert(0.0) += cost / share.max(1e-3) as f64;
    }

    /// Forgets the idle tenants (not in `active`) whose counter is at or below every active
    /// one's: activation would lift them anyway. Keeps the map as small as the tenants that
    /// matter.
    pub fn prune<'a>(&mut self, active: impl Iterator<Item = &'a str> + Clone) {
        let floor = active
            .clone()
            .map(|t| self.counter(t))
            .min_by(f64::total_cmp);
        let keep: std::collections::HashSet<&str> = active.collect();
        self.counters
            .retain(|t, c| keep.contains(t.as_str()) || floor.is_some_and(|f| *c > f));
    }

    /// Every tenant's counter (for metrics and tests).
    pub fn counters(&self) -> impl Iterator<Item = (&str, f64)> {
        self.counters.iter().map(|(t, c)| (t.as_str(), *c))
    }
}
