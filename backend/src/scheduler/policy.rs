//! How requests are ordered: the waiting queue's policy (FCFS, priority class, shortest-first with
//! aging) and which running request is preempted when blocks run out.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::seq::Seq;

/// How the waiting queue is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulingPolicy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// By the request's priority class (lower first), then arrival.
    Priority,
    /// Fewest remaining prompt tokens first; waiting earns credit (aging) so nothing starves.
    ShortestFirst,
}

impl std::str::FromStr for SchedulingPolicy {
    type Err = crate::error::BadValue;
    fn from_str(s: &str) -> Result<Self, crate::error::BadValue> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "priority" => Ok(Self::Priority),
            "shortest-first" | "shortest_first" | "sjf" => Ok(Self::ShortestFirst),
            o => Err(crate::error::BadValue::unknown(
                "scheduling policy",
                o,
                "fcfs, priority, shortest-first",
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub enable_chunked_prefill: bool,
    pub policy: SchedulingPolicy,
    /// Shortest-first aging: prompt tokens of credit per second waited.
    pub aging_tokens_per_sec: f64,
    pub max_model_len: usize,
    /// Token-fair sharing between tenants ([`super::fair`]); `policy` orders requests inside a
    /// tenant.
    #[serde(default)]
    pub fair_share: bool,
    /// Under fair sharing, most prompt tokens per step for the tenants holding more sequence
    /// slots than their share while another tenant has requests (0: no cap). Short steps while
    /// a flood prefills keep a light tenant's wait for the step in flight short; the light
    /// tenant's own prefill is not capped.
    #[serde(default)]
    pub fair_prefill_cap: usize,
    /// Target seconds per step (0: none): each step's token budget is sized from a running fit
    /// of step time against tokens ([`super::step_time`]) so a step is expected to take at most
    /// this long — never below its decodes plus one KV block of prompt tokens, never above
    /// `max_num_batched_tokens`.
    #[serde(default)]
    pub max_step_secs: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            enable_chunked_prefill: true,
            policy: SchedulingPolicy::Fcfs,
            aging_tokens_per_sec: 100.0,
            max_model_len: 4096,
            fair_share: false,
            fair_prefill_cap: 0,
            max_step_secs: 0.0,
        }
    }
}

/// Ordering key of a waiting request under the policy (smaller runs first).
pub fn waiting_key(config: &SchedulerConfig, s: &Seq, now: Instant) -> (i64, i64, u64) {
    match config.policy {
        SchedulingPolicy::Fcfs => (0, 0, s.seq_no),
        SchedulingPolicy::Priority => (s.req.priority as i64, 0, s.seq_no),
        SchedulingPolicy::ShortestFirst => {
            let remaining = (s.tokens.len() - s.num_computed) as f64;
            let waited = now.saturating_duration_since(s.arrival).as_secs_f64();
            (
                0,
                (remaining - waited * config.aging_tokens_per_sec) as i64,
                s.seq_no,
            )
        }
    }
}

/// The running request to preempt: under fair sharing, one of the tenant furthest above its
/// share (the largest counter); then the lowest priority (under the priority policy), then the
/// newest.
pub fn victim(config: &SchedulerConfig, running: &[Seq], fair: &super::fair::FairShare) -> usize {
    let key = |s: &Seq| {
        let p = if config.policy == SchedulingPolicy::Priority {
            s.req.priority
        } else {
            0
        };
        (p, s.seq_no)
    };
    let counter = |s: &Seq| {
        if config.fair_share {
            fair.counter(&s.req.tag)
        } else {
            0.0
        }
    };
    (0..running.len())
        .max_by(|&a, &b| {
            counter(&running[a])
                .total_cmp(&counter(&running[b]))
                .then_with(|| key(&running[a]).cmp(&key(&running[b])))
        })
        .expect("running is non-empty")
}
