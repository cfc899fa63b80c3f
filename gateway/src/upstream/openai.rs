//! OpenAI-compatible upstreams (vLLM, SGLang, another gateway: anything serving
//! `/v1/completions`): text in, text out. The gateway sends the prompt it rendered and normalized
//! as a raw completion prompt and streams the text back as events.
//!
//! Such a server publishes no cache state, so routing to it is *approximate*: the gateway
//! remembers the block hashes of the prompts it sent there (an LRU sized like the server's KV
//! cache) and takes them for what the server holds — the request-history estimate of llm-d's
//! approximate scorer. It can only be wrong in ways the exact members are not (evictions it did not
//! see, tokenizers that differ); `cachet worker`s are routed on their real KV events.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::block_hash::BlockHash;
use cachet_backend::request::{EngineEvent, EngineRequest, FinishReason, RequestTimings, Usage};
use http_body_util::Full;
use lru::LruCache;

use super::{Lines, Worker};

/// What the gateway knows of an OpenAI-compatible server.
pub struct Target {
    /// The model name the server serves.
    pub model: String,
    /// Its API key (sent as a bearer token).
    pub api_key: Option<String>,
    /// Block hashes of prompts sent there, most recent first.
    history: Mutex<LruCache<BlockHash, ()>>,
}

impl Target {
    pub fn new(model: String, api_key: Option<String>, history_blocks: usize) -> Self {
        Target {
            model,
            api_key,
            history: Mutex::new(LruCache::new(
                NonZeroUsize::new(history_blocks.max(1)).expect("at least one"),
            )),
        }
    }

    /// Leading blocks of `hashes` a prompt sent there earlier had.
    pub fn overlap(&self, hashes: &[BlockHash]) -> usize {
        let h = self.history.lock().expect("history lock");
        hashes.iter().take_while(|x| h.contains(x)).count()
    }

    /// Records a prompt sent there.
    pub fn remember(&self, hashes: &[BlockHash]) {
        let mut h = self.history.lock().expect("history lock");
        for x in hashes {
            h.put(*x, ());
        }
    }

    pub fn remembered(&self) -> usize {
        self.history.lock().expect("history lock").len()
    }

    fn request(
        &self,
        url: &str,
        method: &str,
        path: &str,
        body: Bytes,
    ) -> hyper::Request<Full<Bytes>> {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(format!("{url}{path}"))
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(k) = &self.api_key {
            b = b.header(hyper::header::AUTHORIZATION, format!("Bearer {k}"));
        }
        b.body(Full::new(body)).expect("valid request parts")
    }
}

/// Polls `GET /v1/models` for ever: the server's health (it reports no load; the gateway counts
/// its own requests there).
pub(super) async fn poll(w: Arc<Worker>, t: Arc<Target>, key_id: String) {
    loop {
        let got = async {
            let resp = tokio::time::timeout(
                Duration::from_secs(2),
                w.client
                    .request(t.request(&w.url, "GET", "/v1/models", Bytes::new())),
            )
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
            if resp.status().is_success() {
                Ok(())
            } else {
                Err(format!("status {}", resp.status()))
            }
        }
        .await;
        match got {
            Ok(()) => {
                let mut h = w.health.lock().expect("health lock");
                let was_down = h.state.is_none() || h.failures > 0;
                h.state = Some(crate::worker::protocol::StateReply {
                    model: t.model.clone(),
                    block_size: 0,
                    max_model_len: 0,
                    key_id: key_id.clone(),
                    running: 0,
                    waiting: 0,
                    kv_total: 0,
                    kv_used: 0,
                    cached_blocks: t.remembered(),
                });
                h.failures = 0;
                if was_down {
                    tracing::info!(upstream = %w.url, "OpenAI-compatible upstream up");
                }
            }
            Err(e) => {
                if w.health.lock().expect("health lock").failures == 0 {
                    tracing::warn!(upstream = %w.url, error = %e, "health check failed");
                }
                w.failed();
                let mut h = w.health.lock().expect("health lock");
                if h.failures >= super::TRIP_AFTER {
                    h.state = None;
                }
            }
        }
        tokio::time::sleep(super::POLL).await;
    }
}

/// A completion streaming from an OpenAI-compatible server.
pub struct OpenAiStream {
    pub id: u64,
    lines: Lines,
    pending: VecDeque<EngineEvent>,
    started: Instant,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    pieces: usize,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    done: bool,
    worker: Arc<Worker>,
}

impl Drop for OpenAiStream {
    fn drop(&mut self) {
        self.worker
            .inflight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.worker
            .finished
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn finish_reason(s: &str) -> FinishReason {
    match s {
        "length" => FinishReason::Length,
        _ => FinishReason::Stop,
    }
}

impl OpenAiStream {
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
        }
    }

    /// The next event; `None` after `Finished`.
    pub async fn next(&mut self) -> Option<EngineEvent> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Some(ev);
            }
            if self.done {
                return None;
            }
            let line = match self.lines.next().await {
                Ok(Some(l)) => l,
                Ok(None) => {
                    let reason = self.finish;
                    return Some(match reason {
                        // Some servers end without [DONE] once the finish chunk is out.
                        Some(r) => self.finished(r, None),
                        None => {
                            let url = self.worker.url.clone();
                            self.finished(
                                FinishReason::Error,
                                Some(format!("upstream {url} ended the stream early")),
                            )
                        }
                    });
                }
                Err(e) => {
                    let url = self.worker.url.clone();
                    return Some(self.finished(
                        FinishReason::Error,
                        Some(format!("upstream {url} failed mid-stream: {e}")),
                    ));
                }
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
                Err(e) => {
                    return Some(self.finished(
                        FinishReason::Error,
                        Some(format!("upstream sent a chunk that is not JSON: {e}")),
                    ))
                }
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
                    });
                }
            }
        }
    }
}

/// Why a start failed.
pub(super) enum StartError {
    /// The server refused the request itself (4xx): no other member will do better.
    Rejected(String),
    /// The server failed: try the next member.
    Failed(String),
}

/// Sends `text` as a streaming completion and waits for the first event.
pub(super) async fn start(
    w: &Arc<Worker>,
    t: &Target,
    text: &str,
    er: &EngineRequest,
    id: u64,
) -> Result<OpenAiStream, StartError> {
    let mut body = serde_json::json!({
        "model": t.model,
        "prompt": text,
        "max_tokens": er.max_tokens,
        "temperature": er.sampling.temperature,
        "top_p": er.sampling.top_p,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(seed) = er.sampling.seed {
        body["seed"] = seed.into();
    }
    if !er.stop.is_empty() {
        body["stop"] = er.stop.clone().into();
    }
    if !er.tag.is_empty() {
        body["user"] = er.tag.clone().into();
    }
    let req = t.request(
        &w.url,
        "POST",
        "/v1/completions",
        Bytes::from(body.to_string()),
    );
    w.inflight
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut stream = OpenAiStream {
        id,
        lines: match w.client.request(req).await {
            Ok(resp) if resp.status().is_success() => Lines::new(resp.into_body()),
            Ok(resp) => {
                w.inflight
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                let status = resp.status();
                let msg = format!("{}: {}", w.url, super::error_text(resp).await);
                return Err(
                    if status.is_client_error() && status != hyper::StatusCode::TOO_MANY_REQUESTS {
                        StartError::Rejected(msg)
                    } else {
                        StartError::Failed(msg)
                    },
                );
            }
            Err(e) => {
                w.inflight
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                return Err(StartError::Failed(format!("{}: {e}", w.url)));
            }
        },
        pending: VecDeque::new(),
        started: Instant::now(),
        first_at: None,
        last_at: None,
        pieces: 0,
        finish: None,
        usage: None,
        done: false,
        worker: w.clone(),
    };
    // Nothing has reached the client yet: a server that fails before its first event is
    // skipped for the next member.
    match stream.next().await {
        Some(EngineEvent::Finished {
            reason: FinishReason::Error,
            error,
            ..
        }) => Err(StartError::Failed(format!(
            "{}: {}",
            w.url,
            error.unwrap_or_default()
        ))),
        Some(first) => {
            stream.pending.push_front(first);
            Ok(stream)
        }
        None => Err(StartError::Failed(format!("{}: empty stream", w.url))),
    }
}
