//! Session affinity: rendezvous (highest-random-weight) hashing of the session key over the
//! healthy workers, so a session stays on its worker and only the sessions of a worker that
//! goes away move. Without a key, the least loaded worker first.

use super::{healthy, least_load::LeastLoad, Decision, Policy, RouteRequest, WorkerView};

#[derive(Debug, Default)]
pub struct Session;

/// The rendezvous weight of a session key on the member whose identity is `member`
/// ([`WorkerView::id`]: its name's hash, not its position, which shifts when members come and go).
fn weight(key: &str, member: u64) -> u64 {
    let h = blake3::Hasher::new()
        .update(b"cachet session")
        .update(key.as_bytes())
        .update(&member.to_le_bytes())
        .finalize();
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

impl Policy for Session {
    fn name(&self) -> &'static str {
        "session"
    }
    fn route(&self, req: &RouteRequest<'_>, workers: &[WorkerView]) -> Decision {
        let Some(key) = req.session_key else {
            let mut d = LeastLoad.route(req, workers);
            d.reason = "no_session_key";
            return d;
        };
        let mut order = healthy(workers);
        order.sort_by_key(|&i| std::cmp::Reverse(weight(key, workers[i].id)));
        Decision {
            order,
            reason: "session",
        }
    }
}
