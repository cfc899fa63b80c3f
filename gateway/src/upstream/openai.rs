//! OpenAI-compatible upstreams (vLLM, SGLang, another gateway: anything serving
//! `/v1/completions`): text in, text out. The gateway sends the prompt it rendered and normalized
//! as a raw completion prompt and streams the text back as events.
//!
//! Such a server publishes no cache state, so routing to it is *approximate*: the gateway
//! remembers the block hashes of the prompts it sent there (an LRU sized like the server's KV
//! cache) and takes them for what the server holds — the request-history estimate of llm-d's
//! approximate scorer. It can only be wrong in ways the exact members are not (evictions it did not
//! see, tokenizers that differ); `cachet worker`s are routed on their real KV events. Health comes
//! from `GET /v1/models`; load is the gateway's own requests in flight there.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::block_hash::BlockHash;
use cachet_backend::request::{EngineEvent, FinishReason, RequestTimings, Usage};
use lru::LruCache;

use super::{
    wait_limit, BoxFuture, EventStream, Events, StartError, Tally, TallyGuard, Timeouts, Upstream,
    UpstreamRequest, DOWN_AFTER, POLL,
};
use crate::http::client::{self, Endpoint, Lines};
use crate::route::WorkerView;

#[derive(Debug, Default)]
struct Health {
    seen_up: bool,
    failures: u32,
}

/// How the gateway talks to an OpenAI-compatible server.
#[derive(Debug, Clone)]
pub struct Options {
    /// The model name the server serves.
    pub model: String,
    /// Its API key (sent as a bearer token).
    pub api_key: Option<String>,
    /// Prompt blocks remembered as sent there (about the server's KV cache).
    pub history_blocks: usize,
    /// Send each request's cache salt as vLLM's `cache_salt`.
    pub send_cache_salt: bool,
}

/// An OpenAI-compatible server.
pub struct OpenAi {
    /// Its base URL and API key (sent as a bearer token).
    ep: Endpoint,
    /// The model name the server serves.
    model: String,
    send_cache_salt: bool,
    timeouts: Timeouts,
    /// Consecutive failed health checks, and whether one ever succeeded.
    health: Mutex<Health>,
    /// Block hashes of prompts sent there, most recent first.
    history: Mutex<LruCache<BlockHash, ()>>,
    tally: Arc<Tally>,
}

impl OpenAi {
    /// The server at `url`, reached with `client` (plain HTTP, or TLS with the upstream's roots:
    /// [`client::client_with_ca`]), with its health poller running (call inside a tokio
    /// runtime).
    pub fn start(
        url: &str,
        opts: Options,
        timeouts: Timeouts,
        client: client::Client,
    ) -> Arc<Self> {
        let history_blocks = opts.history_blocks;
        let o = Arc::new(OpenAi {
            ep: Endpoint::new(url, opts.api_key, client),
            model: opts.model,
            send_cache_salt: opts.send_cache_salt,
            timeouts,
            health: Default::default(),
            history: Mutex::new(LruCache::new(
                NonZeroUsize::new(history_blocks.max(1)).expect("at least one"),
            )),
            tally: Default::default(),
        });
        tokio::spawn(o.clone().poll());
        o
    }

    /// Records a prompt sent there.
    fn remember(&self, hashes: &[BlockHash]) {
        let mut h = self.history.lock().expect("history lock");
        for x in hashes {
            h.put(*x, ());
        }
    }

    fn healthy(&self) -> bool {
        let h = self.health.lock().expect("health lock");
        h.seen_up && h.failures < DOWN_AFTER
    }

    /// Polls `GET /v1/models` for ever.
    async fn poll(self: Arc<Self>) {
        loop {
            let got = async {
                let resp = self
                    .ep
                    .send("GET", "/v1/models", Bytes::new(), Duration::from_secs(2))
                    .await?;
                if resp.status().is_success() {
                    Ok(())
                } else {
                    Err(client::status_error(resp).await)
                }
            }
            .await;
            {
                let mut h = self.health.lock().expect("health lock");
                match got {
                    Ok(()) => {
                        if !h.seen_up || h.failures > 0 {
                            tracing::info!(upstream = %self.ep.url, "OpenAI-compatible upstream up");
                        }
                        h.seen_up = true;
                        h.failures = 0;
                    }
                    Err(e) => {
                        if h.failures == 0 {
                            tracing::warn!(upstream = %self.ep.url, error = %e, "health check failed");
                        }
                        h.failures += 1;
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// A completion streaming from an OpenAI-compatible server.
struct Stream {
    url: String,
    lines: Lines,
    pending: VecDeque<EngineEvent>,
    started: Instant,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    pieces: usize,
    finish: Option<FinishReason>,
    /// The stop string that ended the text, where the server says (vLLM's `stop_reason`).
    stop_sequence: Option<String>,
    usage: Option<Usage>,
    done: bool,
    idle: Duration,
    deadline: Option<Instant>,
    _tally: TallyGuard,
}

fn finish_reason(s: &str) -> FinishReason {
    match s {
        "length" => FinishReason::Length,
        _ => FinishReason::Stop,
    }
}

impl Stream {
    fn finished(&mut self, reason: FinishReason, error: Option<String>) -> EngineEvent {
        self.done = true;
        let now = Instant::now();
        let ttft = self.first_at.map(|f| f - self.started).unwrap_or_default();
        let mean_itl = match (self.first_at, self.last_at) {
            (Some(f), Some(l)) if self.pieces > 1 => (l - f) / (self.pieces as u32 - 1),
            _ => Duration::ZERO,
        };
        EngineEvent::Finished {
            reason,
            usage: self.usage.unwrap_or(Usage {
                prompt_tokens: 0,
                cached_tokens: 0,
                completion_tokens: self.pieces,
            }),
            timings: RequestTimings {
                ttft,
                e2e: now - self.started,
                mean_itl,
                ..Default::default()
            },
            error,
            text: String::new(),
            stop_sequence: self.stop_sequence.take(),
        }
    }

    fn failed(&mut self, why: impl std::fmt::Display) -> EngineEvent {
        tracing::warn!(upstream = %self.url, error = %why, "upstream stream broke");
        self.finished(
            FinishReason::Error,
            Some(format!("the upstream failed mid-stream: {why}")),
        )
    }

    /// Reads SSE lines until an event (or the end) and returns it; `None` after `Finished`.
    async fn next_event(&mut self, limit: Duration) -> Option<EngineEvent> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Some(ev);
            }
            if self.done {
                return None;
            }
            let line = match self.lines.next_within(limit).await {
                Ok(Some(l)) => l,
                Ok(None) => {
                    return Some(match self.finish {
                        // Some servers end without [DONE] once the finish chunk is out.
                        Some(r) => self.finished(r, None),
                        None => self.failed("it ended the stream early"),
                    });
                }
                Err(e) => return Some(self.failed(e)),
            };
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim_end_matches('\r').strip_prefix("data:") else {
                continue; // blank separators, comments, event names
            };
            let data = data.trim();
            if data == "[DONE]" {
                let reason = self.finish.unwrap_or(FinishReason::Stop);
                return Some(self.finished(reason, None));
            }
            let v: serde_json::Value = match serde_json::from_str(data) {
                Ok(v) => v,
                Err(e) => return Some(self.failed(format!("a chunk is not JSON: {e}"))),
            };
            if let Some(err) = v.get("error") {
                let msg = err["message"]
                    .as_str()
                    .unwrap_or("upstream error")
                    .to_string();
                return Some(self.finished(FinishReason::Error, Some(msg)));
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                let n = |k: &str| u[k].as_u64().unwrap_or(0) as usize;
                self.usage = Some(Usage {
                    prompt_tokens: n("prompt_tokens"),
                    completion_tokens: n("completion_tokens"),
                    cached_tokens: u["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0) as usize,
                });
            }
            if let Some(c) = v["choices"].get(0) {
                if let Some(s) = c["stop_reason"].as_str() {
                    self.stop_sequence = Some(s.to_string());
                }
                if let Some(r) = c["finish_reason"].as_str() {
                    self.finish = Some(finish_reason(r));
                }
                let text = c["text"].as_str().unwrap_or("");
                if !text.is_empty() {
                    let at = Instant::now();
                    self.first_at.get_or_insert(at);
                    self.last_at = Some(at);
                    self.pieces += 1;
                    self.pending.push_back(EngineEvent::Token {
                        id: 0,
                        text: text.to_string(),
                        at,
                        logprobs: None,
                    });
                }
            }
        }
    }
}

impl EventStream for Stream {
    fn next(&mut self) -> BoxFuture<'_, Option<EngineEvent>> {
        Box::pin(async move {
            let limit = wait_limit(self.deadline, self.idle);
            self.next_event(limit).await
        })
    }
}

impl Upstream for OpenAi {
    fn name(&self) -> &str {
        &self.ep.url
    }

    fn view(&self, hashes: &[BlockHash]) -> WorkerView {
        let h = self.history.lock().expect("history lock");
        WorkerView {
            healthy: self.healthy(),
            inflight: self.tally.inflight(),
            overlap_blocks: hashes.iter().take_while(|x| h.contains(x)).count(),
            ..Default::default()
        }
    }

    fn submit<'a>(&'a self, req: UpstreamRequest<'a>) -> BoxFuture<'a, Result<Events, StartError>> {
        Box::pin(async move {
            let er = req.engine;
            let p = &er.sampling;
            if p.logprobs.is_some() {
                // Its tokens are its own strings, not ids this gateway could name.
                return Err(StartError::Invalid(
                    "logprobs are not available from an OpenAI-compatible upstream; ask without logprobs or route to a cachet engine".into(),
                ));
            }
            let mut body = serde_json::json!({
                "model": self.model,
                "prompt": req.text,
                "max_tokens": er.max_tokens,
                "temperature": er.sampling.temperature,
                "top_p": er.sampling.top_p,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            if let Some(seed) = p.seed {
                body["seed"] = seed.into();
            }
            // OpenAI's processors, then vLLM's extensions (sent only when used, so a server
            // without them is not sent what it would refuse).
            if p.presence_penalty != 0.0 {
                body["presence_penalty"] = p.presence_penalty.into();
            }
            if p.frequency_penalty != 0.0 {
                body["frequency_penalty"] = p.frequency_penalty.into();
            }
            if !p.logit_bias.is_empty() {
                body["logit_bias"] = p
                    .logit_bias
                    .iter()
                    .map(|(t, b)| (t.to_string(), serde_json::Value::from(*b)))
                    .collect::<serde_json::Map<_, _>>()
                    .into();
            }
            if p.top_k > 0 {
                body["top_k"] = p.top_k.into();
            }
            if p.min_p > 0.0 {
                body["min_p"] = p.min_p.into();
            }
            if p.repetition_penalty != 1.0 {
                body["repetition_penalty"] = p.repetition_penalty.into();
            }
            if p.min_tokens > 0 {
                body["min_tokens"] = p.min_tokens.into();
            }
            if er.ignore_eos {
                body["ignore_eos"] = true.into();
            }
            // Structured outputs: JSON through OpenAI's `response_format`, the rest through
            // vLLM's `structured_outputs`.
            use cachet_backend::grammar::Constraint;
            match &er.constraint {
                None => {}
                Some(Constraint::JsonObject) => {
                    body["response_format"] = serde_json::json!({"type": "json_object"})
                }
                Some(Constraint::JsonSchema(s)) => {
                    body["response_format"] = serde_json::json!({"type": "json_schema",
                        "json_schema": {"name": "output", "schema": s, "strict": true}})
                }
                Some(Constraint::Regex(r)) => {
                    body["structured_outputs"] = serde_json::json!({"regex": r})
                }
                Some(Constraint::Choice(c)) => {
                    body["structured_outputs"] = serde_json::json!({"choice": c})
                }
                Some(Constraint::Lark(g)) => {
                    body["structured_outputs"] = serde_json::json!({"grammar": g})
                }
            }
            if !er.stop.is_empty() {
                body["stop"] = er.stop.clone().into();
            }
            if !er.tag.is_empty() {
                body["user"] = er.tag.clone().into();
            }
            if self.send_cache_salt {
                // The tenant's salt (never a client's alone): the server keeps tenants' cached
                // prefixes apart as the gateway's own engines do.
                body["cache_salt"] = crate::protocol::hex(&er.salt).into();
            }
            let body = Bytes::from(body.to_string());
            let mut tally = self.tally.start();
            let head = wait_limit(er.deadline, self.timeouts.response);
            let limit = wait_limit(er.deadline, self.timeouts.first_event);
            let resp = self
                .ep
                .send_traced(
                    "POST",
                    "/v1/completions",
                    body,
                    head,
                    er.trace_parent.as_deref(),
                )
                .await
                .map_err(|e| StartError::Failed(e.to_string()))?;
            let status = resp.status();
            if !status.is_success() {
                let text = client::error_text(resp).await;
                return Err(match status.as_u16() {
                    429 | 503 => StartError::Busy(text),
                    s if status.is_client_error() => StartError::Rejected {
                        status: s,
                        message: text,
                    },
                    _ => StartError::Failed(text),
                });
            }
            tally.accepted();
            let mut stream = Stream {
                url: self.ep.url.clone(),
                lines: Lines::new(resp.into_body()),
                pending: VecDeque::new(),
                started: Instant::now(),
                first_at: None,
                last_at: None,
                pieces: 0,
                finish: None,
                stop_sequence: None,
                usage: None,
                done: false,
                idle: self.timeouts.idle,
                deadline: er.deadline,
                _tally: tally,
            };
            // Nothing has reached the client yet: a server that fails before its first event is
            // skipped for the next member.
            match stream.next_event(limit).await {
                Some(EngineEvent::Finished {
                    reason: FinishReason::Error,
                    error,
                    ..
                }) => Err(StartError::Failed(error.unwrap_or_default())),
                Some(first) => {
                    stream.pending.push_front(first);
                    self.remember(req.hashes);
                    Ok(Box::new(stream) as Events)
                }
                None => Err(StartError::Failed("empty stream".into())),
            }
        })
    }

    fn cached_blocks(&self) -> usize {
        self.history.lock().expect("history lock").len()
    }

    fn inflight(&self) -> usize {
        self.tally.inflight()
    }
}
