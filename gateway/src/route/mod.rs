//! Routing: which worker serves a request. Policies behind one trait, one file each:
//! [`round_robin`], [`least_load`], [`prefix`] (exact: the longest cached prefix wins unless that
//! worker is overloaded, cost weighing overlap against load as Dynamo does), [`session`]
//! (rendezvous hash on a session or user key). Every policy returns all healthy workers in
//! order: the first is tried, the rest are the failover order.

pub mod least_load;
pub mod prefix;
pub mod round_robin;
pub mod session;

/// What the router knows of one worker when it decides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerView {
    pub healthy: bool,
    /// Requests the gateway has in flight there.
    pub inflight: usize,
    /// From the worker's last state report.
    pub running: usize,
    pub waiting: usize,
    /// KV blocks in use there, and in all.
    pub kv_used: usize,
    pub kv_total: usize,
    /// Leading blocks of this request's prompt the worker holds (exact, from its KV events).
    pub overlap_blocks: usize,
    /// A stable identity of the member (a hash of its name, set by the pool): what session
    /// affinity hashes, so a session keeps its worker when others join or leave the pool.
    pub id: u64,
}

impl WorkerView {
    /// Requests queued or running there, as the gateway best knows.
    pub fn load(&self) -> usize {
        self.inflight.max(self.running + self.waiting)
    }
}

/// What the router knows of the request.
#[derive(Debug, Clone, Default)]
pub struct RouteRequest<'a> {
    /// Full blocks of the prompt.
    pub prompt_blocks: usize,
    /// A session or user key, for `session` routing.
    pub session_key: Option<&'a str>,
}

/// A routing decision: healthy workers, best first, and why the first was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub order: Vec<usize>,
    pub reason: &'static str,
}

/// A routing policy.
pub trait Policy: Send + Sync {
    fn name(&self) -> &'static str;
    fn route(&self, req: &RouteRequest<'_>, workers: &[WorkerView]) -> Decision;
}

/// Builds a policy by name.
pub fn by_name(name: &str) -> Result<Box<dyn Policy>, cachet_backend::BadValue> {
    Ok(match name {
        "round_robin" => Box::new(round_robin::RoundRobin::default()),
        "least_load" => Box::new(least_load::LeastLoad),
        "prefix" => Box::new(prefix::Prefix::default()),
        "session" => Box::new(session::Session),
        other => {
            return Err(cachet_backend::BadValue::unknown(
                "routing policy",
                other,
                "round_robin, least_load, prefix, session",
            ))
        }
    })
}

/// Indices of the healthy workers.
fn healthy(workers: &[WorkerView]) -> Vec<usize> {
    (0..workers.len()).filter(|&i| workers[i].healthy).collect()
}

#[cfg(test)]
mod tests;
