//! Upstreams: where a request runs. Every kind is an [`Upstream`] — submit a request, get its
//! event stream; report load, health and how much of a prompt it holds — one file each:
//!
//! - [`embedded`]: the gateway's own engine, in-process (exact prefix state from its KV events);
//! - [`worker`]: a `cachet worker` over HTTP (exact prefix state from its `/v1/kv_events`);
//! - [`openai`]: any OpenAI-compatible server (text in, prefix state estimated from the prompts
//!   sent there).
//!
//! [`pool::Pool`] owns what is common to all of them: the order the routing policy gives,
//! failover before a request's first event, and a circuit breaker per member. A gateway always
//! routes through a pool, a pool of one when it serves alone.

pub mod blocks;
pub mod config;
pub mod discovery;
pub mod embedded;
pub mod openai;
pub mod pool;
pub mod worker;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cachet_backend::block_hash::BlockHash;
use cachet_backend::request::{EngineEvent, EngineRequest, FinishReason};

pub use pool::{MemberLoad, Pool, Routed};

use crate::route::WorkerView;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How often remote upstreams' health and load are polled.
pub const POLL: Duration = Duration::from_millis(500);
/// Consecutive failed polls after which a remote upstream counts as down.
pub const DOWN_AFTER: u32 = 3;

/// Time limits on talking to remote upstreams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To open a connection.
    pub connect: Duration,
    /// From sending a request to the response head: a live server answers at once (its events
    /// stream after), so a frozen one is found out in seconds and skipped for the next member.
    pub response: Duration,
    /// From the response head to the first event (the first token, after any queueing): a
    /// member that takes longer is skipped for the next.
    pub first_event: Duration,
    /// Between two events of a stream: a stream silent for longer ends with an error.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(5),
            first_event: Duration::from_secs(120),
            idle: Duration::from_secs(30),
        }
    }
}

/// What an upstream is asked to run.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamRequest<'a> {
    /// Token ids, sampling, the tenant's salt, priority and the deadline.
    pub engine: &'a EngineRequest,
    /// The rendered prompt as text (what text-in upstreams are sent).
    pub text: &'a str,
    /// The prompt's block hashes under the tenant's salt.
    pub hashes: &'a [BlockHash],
}

/// A running request's events. Dropping it cancels the request where it runs.
pub trait EventStream: Send {
    /// The next event; `None` after `Finished`. A stream that breaks ends with an error
    /// `Finished` that says where and why.
    fn next(&mut self) -> BoxFuture<'_, Option<EngineEvent>>;
}

pub type Events = Box<dyn EventStream>;

/// Why an upstream did not start a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// The request itself was refused (a 4xx other than 429): no other member would do better.
    #[error("refused the request ({status}): {message}")]
    Rejected { status: u16, message: String },
    /// The engine found the request invalid (too long, bad token ids, …).
    #[error("{0}")]
    Invalid(String),
    /// Full right now (engine queue bounds, 429/503): the next member may take it.
    #[error("{0}")]
    Busy(String),
    /// Broken: unreachable, a 5xx, a timeout, a bad or empty stream. Counts against the member's
    /// circuit breaker.
    #[error("{0}")]
    Failed(String),
}

/// A member's name with what it answered, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub upstream: String,
    pub error: StartError,
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.upstream, self.error)
    }
}

/// The attempts, one after another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempts(pub Vec<Attempt>);

impl Attempts {
    /// What the attempts answered, without the members' names (internal addresses are never
    /// shown to clients; the pool logs them): the one answer of a pool of one as it was.
    pub fn summary(&self) -> String {
        match &self.0[..] {
            [one] => one.error.to_string(),
            all => all
                .iter()
                .enumerate()
                .map(|(i, a)| format!("upstream {}: {}", i + 1, a.error))
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

impl std::fmt::Display for Attempts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

/// Why no upstream took a request. The messages are what clients see: they never name an
/// upstream (the fields keep the names for the logs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("no healthy upstream (all {0} are down or their circuits open)")]
    NoUpstream(usize),
    /// Every member was full: retry later.
    #[error("{}", .0.summary())]
    Busy(Attempts),
    #[error("every upstream refused or failed: {}", .0.summary())]
    AllFailed(Attempts),
    #[error("the upstream refused the request ({status}): {message}")]
    Rejected {
        upstream: String,
        status: u16,
        message: String,
    },
    #[error("{0}")]
    InvalidRequest(String),
}

/// One member of a pool.
pub trait Upstream: Send + Sync {
    /// Its name in metrics and logs: a base URL, or `embedded`.
    fn name(&self) -> &str;
    /// What the router needs to know of it for a prompt with these block hashes: health, load,
    /// and how many leading blocks it holds.
    fn view(&self, hashes: &[BlockHash]) -> WorkerView;
    /// Starts `req`; resolves once the first event is in, so a member that fails before it is
    /// skipped for the next.
    fn submit<'a>(&'a self, req: UpstreamRequest<'a>) -> BoxFuture<'a, Result<Events, StartError>>;
    /// Block hashes the gateway knows it holds (or, for an estimated member, remembers sending).
    fn cached_blocks(&self) -> usize;
    /// Requests of this gateway in flight there.
    fn inflight(&self) -> usize;
    /// It has left the pool: its background work (health polls, event streams) ends. Requests
    /// running there are not touched.
    fn stop(&self) {}
}

/// A member's count of this gateway's requests: in flight, and accepted then ended (which lets
/// a load report taken earlier be corrected for the requests that have left since).
#[derive(Debug, Default)]
pub struct Tally {
    inflight: AtomicUsize,
    finished: AtomicUsize,
}

impl Tally {
    /// Counts a request as in flight until the guard drops.
    pub fn start(self: &Arc<Self>) -> TallyGuard {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        TallyGuard {
            tally: self.clone(),
            accepted: false,
        }
    }
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }
    /// Accepted requests that have ended (monotonic).
    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::Relaxed)
    }
}

/// One request in a [`Tally`].
#[derive(Debug)]
pub struct TallyGuard {
    tally: Arc<Tally>,
    accepted: bool,
}

impl TallyGuard {
    /// The upstream took the request: when it ends it counts as finished there.
    pub fn accepted(&mut self) {
        self.accepted = true;
    }
}

impl Drop for TallyGuard {
    fn drop(&mut self) {
        self.tally.inflight.fetch_sub(1, Ordering::Relaxed);
        if self.accepted {
            self.tally.finished.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The `Finished` event of a stream that broke: the client is told what broke, the log also
/// where.
pub fn broken(upstream: &str, why: impl std::fmt::Display) -> EngineEvent {
    tracing::warn!(%upstream, error = %why, "upstream stream broke");
    EngineEvent::Finished {
        reason: FinishReason::Error,
        usage: Default::default(),
        timings: Default::default(),
        error: Some(format!("the upstream failed mid-stream: {why}")),
        text: String::new(),
        stop_sequence: None,
    }
}

/// The time left until `deadline` (the request's), bounded by `idle`.
pub fn wait_limit(deadline: Option<std::time::Instant>, idle: Duration) -> Duration {
    match deadline {
        Some(d) => d
            .saturating_duration_since(std::time::Instant::now())
            .min(idle),
        None => idle,
    }
}
