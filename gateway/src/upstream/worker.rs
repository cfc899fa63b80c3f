//! A `cachet worker` as an upstream, over HTTP. Two background tasks keep what the gateway knows
//! of it: its load and health (`/v1/state` every [`POLL`]) and the exact set of block hashes it
//! holds (`/v1/kv_events`: a snapshot, then every change). Requests go to `/v1/generate` as
//! token ids and come back as NDJSON events; closing the connection cancels them there.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::block_hash::BlockHash;
use cachet_backend::request::EngineEvent;

use super::blocks::BlockSet;
use super::{
    broken, wait_limit, BoxFuture, EventStream, Events, StartError, Tally, TallyGuard, Timeouts,
    Upstream, UpstreamRequest, DOWN_AFTER, POLL,
};
use crate::http::client::{self, ClientError, Endpoint, Lines};
use crate::protocol::{hex, GenerateRequest, KvWire, StateReply, WireEvent};
use crate::route::WorkerView;

/// What the polls found.
#[derive(Debug, Default)]
struct Health {
    state: Option<StateReply>,
    /// Consecutive failed polls.
    failures: u32,
    key_mismatch: bool,
    /// `Tally::finished` when the poll that brought `state` was sent.
    finished_at_report: usize,
}

pub struct Worker {
    ep: Endpoint,
    timeouts: Timeouts,
    health: Mutex<Health>,
    blocks: BlockSet,
    tally: Arc<Tally>,
    /// Turns true when it leaves the pool: its poller and event follower end.
    stopped: tokio::sync::watch::Sender<bool>,
}

impl Worker {
    /// A worker at `url` (its base URL), with its health poller and KV-event follower running
    /// (call inside a tokio runtime). `key_id` is the gateway's deployment key's id: a worker
    /// with another key is told apart (its hashes cannot match). `client` reaches it (plain HTTP,
    /// or TLS with the upstream's roots: [`client::client_with_ca`]).
    pub fn start(
        url: &str,
        token: Option<String>,
        key_id: String,
        timeouts: Timeouts,
        client: client::Client,
    ) -> Arc<Self> {
        let w = Arc::new(Worker {
            ep: Endpoint::new(url, token, client),
            timeouts,
            health: Default::default(),
            blocks: Default::default(),
            tally: Default::default(),
            stopped: tokio::sync::watch::channel(false).0,
        });
        tokio::spawn(w.clone().poll(key_id));
        tokio::spawn(w.clone().follow());
        w
    }

    async fn state(&self) -> Result<StateReply, ClientError> {
        let resp = self
            .ep
            .send("GET", "/v1/state", Bytes::new(), Duration::from_secs(2))
            .await?;
        if !resp.status().is_success() {
            return Err(client::status_error(resp).await);
        }
        let body = client::read_body(resp).await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Polls `/v1/state` until stopped: health and load.
    async fn poll(self: Arc<Self>, key_id: String) {
        let mut stopped = self.stopped.subscribe();
        while !*stopped.borrow() {
            let mark = self.tally.finished();
            match self.state().await {
                Ok(s) => {
                    let mut h = self.health.lock().expect("health lock");
                    if s.key_id != key_id && !h.key_mismatch {
                        tracing::error!(worker = %self.ep.url, "the worker's hash key differs from the gateway's (--hash-key-file): its cache is invisible to prefix routing");
                    }
                    h.key_mismatch = s.key_id != key_id;
                    if h.state.is_none() || h.failures > 0 {
                        tracing::info!(worker = %self.ep.url, "worker up");
                    }
                    h.state = Some(s);
                    h.finished_at_report = mark;
                    h.failures = 0;
                }
                Err(e) => {
                    let mut h = self.health.lock().expect("health lock");
                    if h.failures == 0 {
                        tracing::warn!(worker = %self.ep.url, error = %e, "health check failed");
                    }
                    h.failures += 1;
                    if h.failures >= DOWN_AFTER {
                        h.state = None;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = stopped.changed() => {}
            }
        }
    }

    /// Follows `/v1/kv_events` until stopped, reconnecting (with a fresh snapshot) on failure.
    async fn follow(self: Arc<Self>) {
        let mut stopped = self.stopped.subscribe();
        while !*stopped.borrow() {
            tokio::select! {
                r = self.follow_once() => {
                    if let Err(e) = r {
                        tracing::debug!(worker = %self.ep.url, error = %e, "KV event stream ended");
                    }
                }
                _ = stopped.changed() => break,
            }
            self.blocks.clear();
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = stopped.changed() => {}
            }
        }
    }

    async fn follow_once(&self) -> Result<(), ClientError> {
        let resp = self
            .ep
            .send(
                "GET",
                "/v1/kv_events",
                Bytes::new(),
                self.timeouts.first_event,
            )
            .await?;
        if !resp.status().is_success() {
            return Err(client::status_error(resp).await);
        }
        let mut lines = Lines::new(resp.into_body());
        while let Some(line) = lines.next().await? {
            let ev: KvWire =
                serde_json::from_slice(&line).map_err(|e| ClientError::Protocol(e.to_string()))?;
            self.blocks.apply_wire(ev);
        }
        Ok(())
    }
}

/// Events from a worker; dropping it closes the connection, which cancels the request there.
struct Stream {
    url: String,
    lines: Lines,
    first: Option<EngineEvent>,
    done: bool,
    idle: Duration,
    deadline: Option<Instant>,
    _tally: TallyGuard,
}

impl Stream {
    /// The next event off the wire within `limit`; `None` at the end of the body.
    async fn read(&mut self, limit: Duration) -> Result<Option<EngineEvent>, ClientError> {
        let Some(line) = self.lines.next_within(limit).await? else {
            return Ok(None);
        };
        let w: WireEvent =
            serde_json::from_slice(&line).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(Some(w.into_event(Instant::now())))
    }
}

impl EventStream for Stream {
    fn next(&mut self) -> BoxFuture<'_, Option<EngineEvent>> {
        Box::pin(async move {
            if self.done {
                return None;
            }
            let ev = match self.first.take() {
                Some(ev) => ev,
                None => match self.read(wait_limit(self.deadline, self.idle)).await {
                    Ok(Some(ev)) => ev,
                    Ok(None) => broken(&self.url, "the stream ended early"),
                    Err(e) => broken(&self.url, e),
                },
            };
            if matches!(ev, EngineEvent::Finished { .. }) {
                self.done = true;
            }
            Some(ev)
        })
    }
}

impl Upstream for Worker {
    fn name(&self) -> &str {
        &self.ep.url
    }

    fn view(&self, hashes: &[BlockHash]) -> WorkerView {
        let h = self.health.lock().expect("health lock");
        let Some(s) = &h.state else {
            return WorkerView {
                inflight: self.tally.inflight(),
                ..Default::default()
            };
        };
        // The report counted our requests that were there when it was taken; those that have
        // finished since are gone (without this, the worker that just served a prefix looks
        // busy until the next poll, and the prefix's next request is sent elsewhere).
        let gone = self.tally.finished().saturating_sub(h.finished_at_report);
        let waiting = s.waiting.saturating_sub(gone);
        let running = s.running.saturating_sub(gone - (s.waiting - waiting));
        WorkerView {
            healthy: true,
            inflight: self.tally.inflight(),
            running,
            waiting,
            kv_used: s.kv_used,
            kv_total: s.kv_total,
            overlap_blocks: if h.key_mismatch {
                0
            } else {
                self.blocks.overlap(hashes)
            },
            ..Default::default()
        }
    }

    fn submit<'a>(&'a self, req: UpstreamRequest<'a>) -> BoxFuture<'a, Result<Events, StartError>> {
        Box::pin(async move {
            let er = req.engine;
            let body = GenerateRequest {
                prompt: er.prompt.clone(),
                max_tokens: er.max_tokens,
                sampling: er.sampling.clone(),
                constraint: er.constraint.clone(),
                stop: er.stop.clone(),
                stop_token_ids: er.stop_token_ids.clone(),
                ignore_eos: er.ignore_eos,
                salt: hex(&er.salt),
                public_blocks: er.public_blocks,
                priority: er.priority,
                share: er.share,
                tag: er.tag.clone(),
                timeout_ms: er
                    .deadline
                    .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
            };
            let body = Bytes::from(serde_json::to_vec(&body).expect("serialises"));
            let mut tally = self.tally.start();
            let head = wait_limit(er.deadline, self.timeouts.response);
            let limit = wait_limit(er.deadline, self.timeouts.first_event);
            let resp = self
                .ep
                .send_traced(
                    "POST",
                    "/v1/generate",
                    body,
                    head,
                    er.trace_parent.as_deref(),
                    er.request_id.as_deref(),
                )
                .await
                .map_err(|e| StartError::Failed(e.to_string()))?;
            let status = resp.status();
            if status.is_client_error() && status.as_u16() != 429 {
                return Err(StartError::Rejected {
                    status: status.as_u16(),
                    message: client::error_text(resp).await,
                });
            }
            if !status.is_success() {
                let text = client::error_text(resp).await;
                return Err(if status.as_u16() == 503 || status.as_u16() == 429 {
                    StartError::Busy(text)
                } else {
                    StartError::Failed(text)
                });
            }
            tally.accepted();
            let mut stream = Stream {
                url: self.ep.url.clone(),
                lines: Lines::new(resp.into_body()),
                first: None,
                done: false,
                idle: self.timeouts.idle,
                deadline: er.deadline,
                _tally: tally,
            };
            // Nothing has reached the client yet: a worker that fails before its first event is
            // skipped for the next one.
            match stream.read(limit).await {
                Ok(Some(ev)) => {
                    stream.first = Some(ev);
                    Ok(Box::new(stream) as Events)
                }
                Ok(None) => Err(StartError::Failed("empty stream".into())),
                Err(e) => Err(StartError::Failed(e.to_string())),
            }
        })
    }

    fn cached_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn inflight(&self) -> usize {
        self.tally.inflight()
    }

    fn stop(&self) {
        self.stopped.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Worker {
        Worker {
            ep: Endpoint::new(
                "http://127.0.0.1:9",
                None,
                client::client(Duration::from_secs(1)),
            ),
            timeouts: Timeouts::default(),
            health: Default::default(),
            blocks: Default::default(),
            tally: Default::default(),
            stopped: tokio::sync::watch::channel(false).0,
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
        h.finished_at_report = w.tally.finished();
    }

    #[tokio::test]
    async fn a_report_taken_before_our_requests_finished_does_not_keep_them_as_load() {
        let w = worker();
        // The report saw our two requests and one of someone else's, waiting.
        let mut ours: Vec<TallyGuard> = (0..2).map(|_| w.tally.start()).collect();
        ours.iter_mut().for_each(TallyGuard::accepted);
        report(&w, 2, 1);
        assert_eq!(w.view(&[]).load(), 3);
        // Ours finish before the next poll: only the other one is left.
        ours.clear();
        let v = w.view(&[]);
        assert_eq!((v.running + v.waiting, v.load()), (1, 1));
        // A new report resets the count; our requests in flight are never under-counted.
        let mut ours: Vec<TallyGuard> = (0..4).map(|_| w.tally.start()).collect();
        ours.iter_mut().for_each(TallyGuard::accepted);
        report(&w, 1, 0);
        assert_eq!(w.view(&[]).load(), 4);
        ours.truncate(1);
        assert_eq!(w.view(&[]).load(), 1);
    }
}
