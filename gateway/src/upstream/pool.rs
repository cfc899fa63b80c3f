//! The pool: the members a gateway routes among, in the order its routing policy gives, with
//! failover and a circuit breaker. A request's prompt is hashed the way the engines hash it
//! (shared deployment key, the tenant's salt), so each member's cached-prefix overlap is exact
//! (or, for OpenAI-compatible servers, estimated). A member that fails before the first event is
//! skipped for the next; one that keeps failing is taken out for [`OPEN_FOR`] while its health
//! checks go on.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cachet_backend::block_hash::HashContext;
use cachet_backend::request::EngineRequest;

use super::{Attempt, Attempts, Events, StartError, Upstream, UpstreamError, UpstreamRequest};
use crate::route::{Policy, RouteRequest, WorkerView};

/// Consecutive failed requests that open a member's circuit, and for how long.
pub const TRIP_AFTER: u32 = 3;
pub const OPEN_FOR: Duration = Duration::from_secs(5);

/// A member's circuit breaker.
#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    fn closed(&self, now: Instant) -> bool {
        self.open_until.is_none_or(|t| now >= t)
    }
}

struct Member {
    upstream: Arc<dyn Upstream>,
    breaker: Mutex<Breaker>,
    /// A hash of the upstream's name ([`WorkerView::id`]).
    id: u64,
}

impl Member {
    fn new(upstream: Arc<dyn Upstream>) -> Self {
        let h = blake3::hash(upstream.name().as_bytes());
        Member {
            id: u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes")),
            upstream,
            breaker: Default::default(),
        }
    }
}

impl Member {
    fn failed(&self) {
        let mut b = self.breaker.lock().expect("breaker lock");
        b.failures += 1;
        if b.failures >= TRIP_AFTER {
            let now = Instant::now();
            if b.closed(now) {
                tracing::warn!(upstream = %self.upstream.name(), failures = b.failures, "circuit open");
            }
            b.open_until = Some(now + OPEN_FOR);
        }
    }

    fn succeeded(&self) {
        let mut b = self.breaker.lock().expect("breaker lock");
        b.failures = 0;
        b.open_until = None;
    }

    fn view(&self, hashes: &[cachet_backend::block_hash::BlockHash]) -> WorkerView {
        let mut v = self.upstream.view(hashes);
        v.id = self.id;
        v.healthy &= self
            .breaker
            .lock()
            .expect("breaker lock")
            .closed(Instant::now());
        v
    }
}

/// How a request was routed.
#[derive(Debug, Clone)]
pub struct Routed {
    /// The member's index and name.
    pub member: usize,
    pub upstream: String,
    pub reason: &'static str,
    pub predicted_cached_tokens: usize,
    pub attempts: usize,
}

/// One member's load, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLoad {
    pub name: String,
    pub inflight: usize,
    /// Block hashes the gateway knows it holds (or remembers sending, for an estimated member).
    pub cached_blocks: usize,
}

/// The members and the policy. Members come and go (upstreams named by DNS): each request
/// routes over the set as it was when it arrived.
pub struct Pool {
    members: RwLock<Arc<Vec<Arc<Member>>>>,
    policy: Box<dyn Policy>,
    /// Block hashing as the engines do it (the tenant's salt is set per request).
    hasher: HashContext,
}

impl Pool {
    /// A pool of `upstreams` ordered by `policy`; `hasher` is the deployment's block hashing.
    pub fn new(
        upstreams: Vec<Arc<dyn Upstream>>,
        policy: Box<dyn Policy>,
        hasher: HashContext,
    ) -> Self {
        Pool {
            members: RwLock::new(Arc::new(
                upstreams
                    .into_iter()
                    .map(|upstream| Arc::new(Member::new(upstream)))
                    .collect(),
            )),
            policy,
            hasher,
        }
    }

    /// The members now.
    fn members(&self) -> Arc<Vec<Arc<Member>>> {
        self.members.read().expect("members lock").clone()
    }

    /// Adds a member (a worker found by DNS whose health check answered).
    pub fn add(&self, upstream: Arc<dyn Upstream>) {
        let mut m = self.members.write().expect("members lock");
        let mut next = m.as_ref().clone();
        next.push(Arc::new(Member::new(upstream)));
        *m = Arc::new(next);
    }

    /// Takes the member `name` out: no new request goes there, the ones running there run out,
    /// its background work (health polls, event streams) stops. Whether it was a member.
    pub fn remove(&self, name: &str) -> bool {
        let mut m = self.members.write().expect("members lock");
        let Some(i) = m.iter().position(|x| x.upstream.name() == name) else {
            return false;
        };
        let mut next = m.as_ref().clone();
        let gone = next.remove(i);
        *m = Arc::new(next);
        gone.upstream.stop();
        true
    }

    /// The members' names, in pool order.
    pub fn names(&self) -> Vec<String> {
        self.members()
            .iter()
            .map(|m| m.upstream.name().to_string())
            .collect()
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    pub fn len(&self) -> usize {
        self.members().len()
    }

    pub fn is_empty(&self) -> bool {
        self.members().is_empty()
    }

    /// How many members are healthy now (their health checks answer, their circuit is closed),
    /// and how many there are.
    pub fn healthy_members(&self) -> (usize, usize) {
        let members = self.members();
        let healthy = members.iter().filter(|m| m.view(&[]).healthy).count();
        (healthy, members.len())
    }

    /// Waits until at least `n` members are healthy, or `timeout`.
    pub async fn wait_healthy(&self, n: usize, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self
                .members()
                .iter()
                .filter(|m| m.view(&[]).healthy)
                .count()
                >= n
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Routes `er` (its prompt also as `text`, for text-in members) and starts it on the first
    /// member that takes it.
    pub async fn submit(
        &self,
        er: &EngineRequest,
        text: &str,
        session_key: Option<&str>,
    ) -> Result<(Events, Routed), UpstreamError> {
        let (mut events, routed) = self
            .submit_group(std::slice::from_ref(er), text, session_key)
            .await?;
        Ok((events.pop().expect("one request, one stream"), routed))
    }

    /// Runs requests that share one prompt (the `n` choices of an API request) on one member,
    /// routed once: they all start there, or none does and the next member is tried.
    pub async fn submit_group(
        &self,
        ers: &[EngineRequest],
        text: &str,
        session_key: Option<&str>,
    ) -> Result<(Vec<Events>, Routed), UpstreamError> {
        let er = ers.first().expect("a group has a request");
        let hashes = HashContext {
            salt: er.salt,
            public_blocks: er.public_blocks,
            ..self.hasher.clone()
        }
        .hash_all(&er.prompt);
        let members = self.members();
        let views: Vec<WorkerView> = members.iter().map(|m| m.view(&hashes)).collect();
        let decision = self.policy.route(
            &RouteRequest {
                prompt_blocks: hashes.len(),
                session_key,
            },
            &views,
        );
        if decision.order.is_empty() {
            return Err(UpstreamError::NoUpstream(members.len()));
        }
        let mut attempts = Vec::new();
        for (n, &i) in decision.order.iter().enumerate() {
            let m = &members[i];
            let name = m.upstream.name().to_string();
            let mut started = Vec::with_capacity(ers.len());
            let mut result = Ok(());
            for er in ers {
                let req = UpstreamRequest {
                    engine: er,
                    text,
                    hashes: &hashes,
                };
                match m.upstream.submit(req).await {
                    Ok(ev) => started.push(ev),
                    Err(e) => {
                        result = Err(e);
                        break; // dropping `started` cancels the group's first requests
                    }
                }
            }
            match result.map(|()| started) {
                Ok(events) => {
                    m.succeeded();
                    return Ok((
                        events,
                        Routed {
                            member: i,
                            upstream: name,
                            reason: if n == 0 { decision.reason } else { "failover" },
                            predicted_cached_tokens: views[i].overlap_blocks
                                * self.hasher.block_size,
                            attempts: n + 1,
                        },
                    ));
                }
                Err(StartError::Rejected { status, message }) => {
                    tracing::info!(upstream = %name, status, %message, "upstream refused a request");
                    return Err(UpstreamError::Rejected {
                        upstream: name,
                        status,
                        message,
                    });
                }
                Err(StartError::Invalid(m)) => return Err(UpstreamError::InvalidRequest(m)),
                Err(error @ StartError::Busy(_)) => attempts.push(Attempt {
                    upstream: name,
                    error,
                }),
                Err(error @ StartError::Failed(_)) => {
                    m.failed();
                    attempts.push(Attempt {
                        upstream: name,
                        error,
                    });
                }
            }
        }
        for a in &attempts {
            tracing::warn!(upstream = %a.upstream, error = %a.error, "upstream did not take a request");
        }
        let all_busy = attempts
            .iter()
            .all(|a| matches!(a.error, StartError::Busy(_)));
        Err(if all_busy {
            UpstreamError::Busy(Attempts(attempts))
        } else {
            UpstreamError::AllFailed(Attempts(attempts))
        })
    }

    /// Each member's load, for metrics.
    pub fn load(&self) -> Vec<MemberLoad> {
        self.members()
            .iter()
            .map(|m| MemberLoad {
                name: m.upstream.name().to_string(),
                inflight: m.upstream.inflight(),
                cached_blocks: m.upstream.cached_blocks(),
            })
            .collect()
    }
}
