//! Upstreams: the embedded engine, or a pool of `cachet worker`s the gateway routes among.
//!
//! For each worker the pool keeps, from background tasks: its load and health (`/v1/state`
//! every [`POLL`]), and the exact set of block hashes it holds (`/v1/kv_events`: a snapshot,
//! then every change). A request's prompt is hashed the way the engine hashes it (shared
//! deployment key, the tenant's salt), so each worker's cached-prefix overlap is exact. The
//! routing policy orders the healthy workers; a worker that fails before the first token is
//! skipped for the next one, and one that keeps failing is taken out for [`OPEN_FOR`] (circuit
//! breaker) while its health checks continue.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use cachet_backend::block_hash::{BlockHash, HashContext};
use cachet_backend::engine::{EngineHandle, RequestStream};
use cachet_backend::request::{EngineEvent, EngineRequest};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

pub mod openai;

use crate::route::{Policy, RouteRequest, WorkerView};
use crate::worker::protocol::{parse_hash, GenerateRequest, KvWire, StateReply, WireEvent};

/// A response's whole body.
pub async fn read_body(resp: hyper::Response<Incoming>) -> Result<Bytes, String> {
    resp.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string())
}

/// "STATUS: body" of a failed HTTP response, for error messages.
pub async fn error_text(resp: hyper::Response<Incoming>) -> String {
    let status = resp.status();
    let b = read_body(resp).await.unwrap_or_default();
    format!("{status}: {}", String::from_utf8_lossy(&b))
}

/// How often each worker's state is polled.
pub const POLL: Duration = Duration::from_millis(500);
/// Consecutive failures that open a worker's circuit, and for how long.
pub const TRIP_AFTER: u32 = 3;
pub const OPEN_FOR: Duration = Duration::from_secs(5);

pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

#[derive(Debug, Default)]
struct Health {
    state: Option<StateReply>,
    failures: u32,
    open_until: Option<Instant>,
    key_mismatch: bool,
    /// `Worker::finished` when the poll that brought `state` was sent.
    finished_at_report: usize,
}

/// One `cachet worker`.
/// The HTTP client the gateway talks to its workers with: TCP_NODELAY (a streamed token must not
/// wait for Nagle's algorithm), idle connections kept 30 s.
pub fn http_client() -> Client {
    let mut conn = hyper_util::client::legacy::connect::HttpConnector::new();
    conn.set_nodelay(true);
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}

pub struct Worker {
    pub url: String,
    client: Client,
    token: Option<String>,
    health: Mutex<Health>,
    inflight: AtomicUsize,
    /// Streams of ours the worker accepted that have since ended (monotonic).
    finished: AtomicUsize,
    blocks: RwLock<HashSet<BlockHash>>,
    /// The gateway's own engine, when this member is it (then `url` is [`EMBEDDED`]).
    local: Option<EngineHandle>,
    /// An OpenAI-compatible server (text in), routed to from request history.
    openai: Option<Arc<openai::Target>>,
}

/// The name the embedded engine goes by in the pool (metrics labels, logs).
pub const EMBEDDED: &str = "embedded";

/// A member of the pool.
#[derive(Clone)]
pub enum Member {
    /// A `cachet worker` at this base URL.
    Remote(String),
    /// The gateway's own engine.
    Embedded(EngineHandle),
    /// An OpenAI-compatible server at this base URL (`/v1/completions` is appended).
    OpenAi {
        url: String,
        target: Arc<openai::Target>,
    },
}

impl Worker {
    fn request(&self, method: &str, path: &str, body: Bytes) -> hyper::Request<Full<Bytes>> {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(t) = &self.token {
            b = b.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        b.body(Full::new(body)).expect("valid request parts")
    }

    fn healthy(&self) -> bool {
        let h = self.health.lock().expect("health lock");
        h.state.is_some() && h.open_until.is_none_or(|t| Instant::now() >= t)
    }

    fn failed(&self) {
        let mut h = self.health.lock().expect("health lock");
        h.failures += 1;
        if h.failures >= TRIP_AFTER {
            if h.open_until.is_none_or(|t| Instant::now() >= t) {
                tracing::warn!(worker = %self.url, failures = h.failures, "circuit open");
            }
            h.open_until = Some(Instant::now() + OPEN_FOR);
        }
    }

    fn succeeded(&self) {
        let mut h = self.health.lock().expect("health lock");
        h.failures = 0;
        h.open_until = None;
    }

    /// Leading blocks of `hashes` this worker holds.
    fn overlap(&self, hashes: &[BlockHash]) -> usize {
        let blocks = self.blocks.read().expect("blocks lock");
        hashes.iter().take_while(|h| blocks.contains(h)).count()
    }

    fn view(&self, hashes: &[BlockHash]) -> WorkerView {
        let h = self.health.lock().expect("health lock");
        let s = h.state.clone().unwrap_or(StateReply {
            model: String::new(),
            block_size: 0,
            max_model_len: 0,
            key_id: String::new(),
            running: 0,
            waiting: 0,
            kv_total: 0,
            kv_used: 0,
            cached_blocks: 0,
        });
        let mismatch = h.key_mismatch;
        // The report counted our requests that were there when it was taken; those that have
        // finished since are gone (without this, the worker that just served a prefix looks
        // busy until the next poll, and the prefix's next request is sent elsewhere).
        let gone = self
            .finished
            .load(Ordering::Relaxed)
            .saturating_sub(h.finished_at_report);
        drop(h);
        let waiting = s.waiting.saturating_sub(gone);
        let running = s.running.saturating_sub(gone - (s.waiting - waiting));
        WorkerView {
            healthy: self.healthy(),
            inflight: self.inflight.load(Ordering::Relaxed),
            running,
            waiting,
            kv_used: s.kv_used,
            kv_total: s.kv_total,
            overlap_blocks: match &self.openai {
                Some(t) => t.overlap(hashes),
                None if mismatch => 0,
                None => self.overlap(hashes),
            },
        }
    }

    /// Reads the embedded engine's load for ever (it is healthy while the gateway runs).
    async fn poll_local(self: Arc<Self>, engine: EngineHandle, key_id: String) {
        loop {
            let mark = self.finished.load(Ordering::Relaxed);
            let st = engine.stats();
            {
                let mut h = self.health.lock().expect("health lock");
                h.state = Some(StateReply {
                    model: String::new(),
                    block_size: st.block_size,
                    max_model_len: engine.max_model_len(),
                    key_id: key_id.clone(),
                    running: st.running,
                    waiting: st.waiting,
                    kv_total: st.kv.total,
                    kv_used: st.kv.used,
                    cached_blocks: self.blocks.read().expect("blocks lock").len(),
                });
                h.finished_at_report = mark;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Follows the embedded engine's KV events for ever (subscribed before its first request).
    async fn follow_local(
        self: Arc<Self>,
        mut rx: tokio::sync::broadcast::Receiver<Vec<cachet_backend::kv::KvEvent>>,
    ) {
        use cachet_backend::kv::KvEvent;
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match rx.recv().await {
                Ok(batch) => {
                    let mut blocks = self.blocks.write().expect("blocks lock");
                    for ev in batch {
                        match ev {
                            KvEvent::Stored { hashes } => blocks.extend(hashes),
                            KvEvent::Removed { hashes } => {
                                for h in hashes {
                                    blocks.remove(&h);
                                }
                            }
                            KvEvent::Cleared => blocks.clear(),
                        }
                    }
                }
                // Missed changes: forget everything (routing then under-, never over-estimates
                // what is cached here).
                Err(RecvError::Lagged(_)) => self.blocks.write().expect("blocks lock").clear(),
                Err(RecvError::Closed) => return,
            }
        }
    }

    /// Polls `/v1/state` for ever (health and load).
    async fn poll(self: Arc<Self>, key_id: String) {
        loop {
            let mark = self.finished.load(Ordering::Relaxed);
            let got = async {
                let resp = tokio::time::timeout(
                    Duration::from_secs(2),
                    self.client
                        .request(self.request("GET", "/v1/state", Bytes::new())),
                )
                .await
                .map_err(|_| "timed out".to_string())?
                .map_err(|e| e.to_string())?;
                if !resp.status().is_success() {
                    return Err(format!("status {}", resp.status()));
                }
                let body = read_body(resp).await?;
                serde_json::from_slice::<StateReply>(&body).map_err(|e| e.to_string())
            }
            .await;
            match got {
                Ok(s) => {
                    let mut h = self.health.lock().expect("health lock");
                    if s.key_id != key_id && !h.key_mismatch {
                        tracing::error!(worker = %self.url, "the worker's hash key differs from the gateway's (--hash-key-file): its cache is invisible to prefix routing");
                    }
                    h.key_mismatch = s.key_id != key_id;
                    let was_down = h.state.is_none() || h.failures > 0;
                    h.state = Some(s);
                    h.finished_at_report = mark;
                    h.failures = 0;
                    if was_down {
                        tracing::info!(worker = %self.url, "worker up");
                    }
                }
                Err(e) => {
                    let first = self.health.lock().expect("health lock").failures == 0;
                    if first {
                        tracing::warn!(worker = %self.url, error = %e, "health check failed");
                    }
                    self.failed();
                    if self.health.lock().expect("health lock").failures >= TRIP_AFTER {
                        self.health.lock().expect("health lock").state = None;
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Follows `/v1/kv_events` for ever, reconnecting (with a fresh snapshot) on failure.
    async fn follow(self: Arc<Self>) {
        loop {
            let _ = self.follow_once().await;
            self.blocks.write().expect("blocks lock").clear();
            tokio::time::sleep(POLL).await;
        }
    }

    async fn follow_once(&self) -> Result<(), String> {
        let resp = self
            .client
            .request(self.request("GET", "/v1/kv_events", Bytes::new()))
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("status {}", resp.status()));
        }
        let mut lines = Lines::new(resp.into_body());
        while let Some(line) = lines.next().await? {
            let ev: KvWire = serde_json::from_slice(&line).map_err(|e| e.to_string())?;
            let mut blocks = self.blocks.write().expect("blocks lock");
            let parse =
                |v: &Vec<String>| v.iter().filter_map(|s| parse_hash(s)).collect::<Vec<_>>();
            match ev {
                KvWire::Snapshot { blocks: b, .. } => {
                    blocks.clear();
                    blocks.extend(parse(&b));
                }
                KvWire::Stored { blocks: b, .. } => blocks.extend(parse(&b)),
                KvWire::Removed { blocks: b, .. } => {
                    for h in parse(&b) {
                        blocks.remove(&h);
                    }
                }
                KvWire::Cleared { .. } => blocks.clear(),
            }
        }
        Ok(())
    }
}

/// NDJSON lines of a response body.
struct Lines {
    body: Incoming,
    buf: BytesMut,
}

impl Lines {
    fn new(body: Incoming) -> Self {
        Lines {
            body,
            buf: BytesMut::new(),
        }
    }
    async fn next(&mut self) -> Result<Option<Bytes>, String> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line = self.buf.split_to(i + 1).freeze();
                return Ok(Some(line.slice(..i)));
            }
            match self.body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(d.chunk());
                    }
                }
                Some(Err(e)) => return Err(e.to_string()),
                None => return Ok(None),
            }
        }
    }
}

/// A request's events from wherever it runs.
pub enum TokenStream {
    Local(RequestStream),
    Remote(RemoteStream),
    /// The embedded engine as a member of the pool.
    Member(MemberStream),
    /// An OpenAI-compatible server.
    OpenAi(openai::OpenAiStream),
}

/// A stream of the embedded engine taken through the pool: counted as its load until dropped.
pub struct MemberStream {
    stream: RequestStream,
    worker: Arc<Worker>,
}

impl Drop for MemberStream {
    fn drop(&mut self) {
        self.worker.inflight.fetch_sub(1, Ordering::Relaxed);
        self.worker.finished.fetch_add(1, Ordering::Relaxed);
    }
}

/// Events from a worker; dropping it closes the connection, which cancels the request there.
pub struct RemoteStream {
    pub id: u64,
    lines: Lines,
    first: Option<EngineEvent>,
    done: bool,
    worker: Arc<Worker>,
}

impl Drop for RemoteStream {
    fn drop(&mut self) {
        self.worker.inflight.fetch_sub(1, Ordering::Relaxed);
        self.worker.finished.fetch_add(1, Ordering::Relaxed);
    }
}

fn to_event(w: WireEvent) -> EngineEvent {
    match w {
        WireEvent::Token { id, text } => EngineEvent::Token {
            id,
            text,
            at: Instant::now(),
        },
        WireEvent::Finished {
            reason,
            usage,
            timings,
            error,
            text,
        } => EngineEvent::Finished {
            reason,
            usage,
            timings,
            error,
            text,
        },
    }
}

impl RemoteStream {
    async fn read(&mut self) -> Result<Option<EngineEvent>, String> {
        match self.lines.next().await? {
            Some(line) => serde_json::from_slice::<WireEvent>(&line)
                .map(|w| Some(to_event(w)))
                .map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }
}

impl TokenStream {
    pub fn id(&self) -> u64 {
        match self {
            TokenStream::Local(s) => s.id,
            TokenStream::Remote(r) => r.id,
            TokenStream::Member(m) => m.stream.id,
            TokenStream::OpenAi(o) => o.id,
        }
    }

    /// The next event; `None` after `Finished`. A worker that goes away mid-stream ends the
    /// stream with an error `Finished`.
    pub async fn next(&mut self) -> Option<EngineEvent> {
        match self {
            TokenStream::Local(s) => s.next().await,
            TokenStream::Member(m) => m.stream.next().await,
            TokenStream::OpenAi(o) => o.next().await,
            TokenStream::Remote(r) => {
                if r.done {
                    return None;
                }
                let ev = match r.first.take() {
                    Some(ev) => Some(ev),
                    None => match r.read().await {
                        Ok(ev) => ev,
                        Err(e) => Some(lost(&r.worker.url, &e)),
                    },
                };
                let ev = ev.unwrap_or_else(|| lost(&r.worker.url, "the stream ended early"));
                if matches!(ev, EngineEvent::Finished { .. }) {
                    r.done = true;
                }
                Some(ev)
            }
        }
    }
}

fn lost(url: &str, why: &str) -> EngineEvent {
    EngineEvent::Finished {
        reason: cachet_backend::request::FinishReason::Error,
        usage: Default::default(),
        timings: Default::default(),
        error: Some(format!("worker {url} failed mid-stream: {why}")),
        text: String::new(),
    }
}

/// Why no worker took a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpstreamError {
    #[error("no healthy worker (all {0} are down or their circuits open)")]
    NoWorker(usize),
    #[error("every worker refused or failed: {0}")]
    AllFailed(String),
    #[error("the worker refused the request: {0}")]
    Rejected(String),
}

/// How a request was routed.
#[derive(Debug, Clone)]
pub struct Routed {
    pub worker: usize,
    pub reason: &'static str,
    pub predicted_cached_tokens: usize,
    pub attempts: usize,
}

/// The workers and the policy.
pub struct Pool {
    pub workers: Vec<Arc<Worker>>,
    pub policy: Box<dyn Policy>,
    hasher: HashContext,
    next_id: AtomicU64,
}

impl Pool {
    /// A pool over `urls`, with background health, load and KV-event followers (call inside a
    /// tokio runtime). `key` and `model_id` must be the workers' (checked through `key_id`).
    pub fn start(
        members: &[Member],
        token: Option<String>,
        policy: Box<dyn Policy>,
        key: [u8; 32],
        model_id: &str,
        block_size: usize,
    ) -> Arc<Pool> {
        let client: Client = http_client();
        let key_id = crate::worker::key_id(&key);
        let mut workers: Vec<Arc<Worker>> = Vec::new();
        for m in members {
            let (url, local, target) = match m {
                Member::Remote(u) => (u.trim_end_matches('/').to_string(), None, None),
                Member::Embedded(e) => (EMBEDDED.to_string(), Some(e.clone()), None),
                Member::OpenAi { url, target } => (
                    url.trim_end_matches('/').to_string(),
                    None,
                    Some(target.clone()),
                ),
            };
            let w = Arc::new(Worker {
                url,
                client: client.clone(),
                token: token.clone(),
                health: Default::default(),
                inflight: AtomicUsize::new(0),
                finished: AtomicUsize::new(0),
                blocks: Default::default(),
                local: local.clone(),
                openai: target.clone(),
            });
            if let Some(t) = target {
                tokio::spawn(openai::poll(w.clone(), t, key_id.clone()));
                workers.push(w);
                continue;
            }
            match local {
                Some(engine) => {
                    tokio::spawn(w.clone().follow_local(engine.subscribe_kv_events()));
                    tokio::spawn(w.clone().poll_local(engine, key_id.clone()));
                }
                None => {
                    tokio::spawn(w.clone().poll(key_id.clone()));
                    tokio::spawn(w.clone().follow());
                }
            }
            workers.push(w);
        }
        Arc::new(Pool {
            workers,
            policy,
            hasher: HashContext::new(key, [0; 32], model_id, block_size),
            next_id: AtomicU64::new(1),
        })
    }

    /// Waits until at least `n` workers are healthy, or `timeout`.
    pub async fn wait_healthy(&self, n: usize, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self.workers.iter().filter(|w| w.healthy()).count() >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Routes `er` and starts it on the first worker that takes it.
    pub async fn submit(
        &self,
        er: &EngineRequest,
        text: &str,
        session_key: Option<&str>,
    ) -> Result<(TokenStream, Routed), UpstreamError> {
        let hashes = HashContext {
            salt: er.salt,
            ..self.hasher.clone()
        }
        .hash_all(&er.prompt);
        let views: Vec<WorkerView> = self.workers.iter().map(|w| w.view(&hashes)).collect();
        let decision = self.policy.route(
            &RouteRequest {
                prompt_blocks: hashes.len(),
                session_key,
            },
            &views,
        );
        if decision.order.is_empty() {
            return Err(UpstreamError::NoWorker(self.workers.len()));
        }
        let body = Bytes::from(
            serde_json::to_vec(&GenerateRequest {
                prompt: er.prompt.clone(),
                max_tokens: er.max_tokens,
                temperature: er.sampling.temperature,
                top_p: er.sampling.top_p,
                top_k: er.sampling.top_k,
                seed: er.sampling.seed,
                stop: er.stop.clone(),
                stop_token_ids: er.stop_token_ids.clone(),
                ignore_eos: er.ignore_eos,
                salt: crate::tenants::hex(&er.salt),
                priority: er.priority,
                tag: er.tag.clone(),
            })
            .expect("serialises"),
        );
        let mut errors = Vec::new();
        for (attempt, &i) in decision.order.iter().enumerate() {
            let w = &self.workers[i];
            let routed = |attempt: usize| Routed {
                worker: i,
                reason: if attempt == 0 {
                    decision.reason
                } else {
                    "failover"
                },
                predicted_cached_tokens: views[i].overlap_blocks * self.hasher.block_size,
                attempts: attempt + 1,
            };
            if let Some(t) = &w.openai {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                match openai::start(w, t, text, er, id).await {
                    Ok(stream) => {
                        t.remember(&hashes);
                        w.succeeded();
                        return Ok((TokenStream::OpenAi(stream), routed(attempt)));
                    }
                    Err(openai::StartError::Rejected(m)) => return Err(UpstreamError::Rejected(m)),
                    Err(openai::StartError::Failed(m)) => {
                        w.failed();
                        errors.push(m);
                        continue;
                    }
                }
            }
            if let Some(engine) = &w.local {
                match engine.submit(er.clone()) {
                    Ok(s) => {
                        w.inflight.fetch_add(1, Ordering::Relaxed);
                        return Ok((
                            TokenStream::Member(MemberStream {
                                stream: s,
                                worker: w.clone(),
                            }),
                            routed(attempt),
                        ));
                    }
                    Err(e @ cachet_backend::EngineError::Overloaded { .. })
                    | Err(e @ cachet_backend::EngineError::OverloadedTokens { .. }) => {
                        errors.push(format!("{}: {e}", w.url));
                        continue;
                    }
                    Err(e) => return Err(UpstreamError::Rejected(e.to_string())),
                }
            }
            w.inflight.fetch_add(1, Ordering::Relaxed);
            let mut stream = RemoteStream {
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
                lines: match w
                    .client
                    .request(w.request("POST", "/v1/generate", body.clone()))
                    .await
                {
                    Ok(resp) if resp.status().is_success() => Lines::new(resp.into_body()),
                    Ok(resp) if resp.status().is_client_error() => {
                        w.inflight.fetch_sub(1, Ordering::Relaxed);
                        return Err(UpstreamError::Rejected(error_text(resp).await));
                    }
                    Ok(resp) => {
                        w.inflight.fetch_sub(1, Ordering::Relaxed);
                        if resp.status() != hyper::StatusCode::SERVICE_UNAVAILABLE {
                            w.failed();
                        }
                        errors.push(format!("{}: {}", w.url, resp.status()));
                        continue;
                    }
                    Err(e) => {
                        w.inflight.fetch_sub(1, Ordering::Relaxed);
                        w.failed();
                        errors.push(format!("{}: {e}", w.url));
                        continue;
                    }
                },
                first: None,
                done: false,
                worker: w.clone(),
            };
            // Nothing has reached the client yet: a worker that fails before its first event is
            // skipped for the next one.
            match stream.read().await {
                Ok(Some(ev)) => {
                    stream.first = Some(ev);
                    w.succeeded();
                    return Ok((TokenStream::Remote(stream), routed(attempt)));
                }
                Ok(None) => {
                    w.failed();
                    errors.push(format!("{}: empty stream", w.url));
                }
                Err(e) => {
                    w.failed();
                    errors.push(format!("{}: {e}", w.url));
                }
            }
        }
        Err(UpstreamError::AllFailed(errors.join("; ")))
    }

    /// Per worker: (url, requests in flight, block hashes the gateway knows it holds — or, for an
    /// OpenAI-compatible server, remembers sending), for metrics.
    pub fn load(&self) -> Vec<(String, usize, usize)> {
        self.workers
            .iter()
            .map(|w| {
                (
                    w.url.clone(),
                    w.inflight.load(Ordering::Relaxed),
                    match &w.openai {
                        Some(t) => t.remembered(),
                        None => w.blocks.read().expect("blocks lock").len(),
                    },
                )
            })
            .collect()
    }
}

/// Submits to the embedded engine.
pub fn local(
    engine: &EngineHandle,
    er: EngineRequest,
) -> Result<TokenStream, cachet_backend::EngineError> {
    engine.submit(er).map(TokenStream::Local)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Worker {
        Worker {
            url: "http://127.0.0.1:9".into(),
            client: hyper_util::client::legacy::Client::builder(
                hyper_util::rt::TokioExecutor::new(),
            )
            .build_http(),
            token: None,
            health: Default::default(),
            inflight: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            blocks: Default::default(),
            local: None,
            openai: None,
        }
    }

    fn report(w: &Worker, running: usize, waiting: usize) {
        let mut h = w.health.lock().unwrap();
        h.state = Some(StateReply {
            model: "m".into(),
            block_size: 16,
            max_model_len: 2048,
            key_id: String::new(),
            running,
            waiting,
            kv_total: 100,
            kv_used: 0,
            cached_blocks: 0,
        });
        h.finished_at_report = w.finished.load(Ordering::Relaxed);
    }

    #[test]
    fn a_report_taken_before_our_requests_finished_does_not_keep_them_as_load() {
        let w = worker();
        // The report saw our two requests and one of someone else's, waiting.
        w.inflight.store(2, Ordering::Relaxed);
        report(&w, 2, 1);
        assert_eq!(w.view(&[]).load(), 3);
        // Ours finish before the next poll: only the other one is left.
        for _ in 0..2 {
            w.inflight.fetch_sub(1, Ordering::Relaxed);
            w.finished.fetch_add(1, Ordering::Relaxed);
        }
        let v = w.view(&[]);
        assert_eq!((v.running + v.waiting, v.load()), (1, 1));
        // A new report resets the count; our requests in flight are never under-counted.
        w.inflight.store(4, Ordering::Relaxed);
        report(&w, 1, 0);
        assert_eq!(w.view(&[]).load(), 4);
        w.finished.fetch_add(3, Ordering::Relaxed);
        assert_eq!(w.view(&[]).load(), 4);
    }
}
