//! A completion's response: the whole JSON answer, or OpenAI's SSE chunks (a role chunk per
//! choice, text deltas with their log-probabilities, each choice's finish chunk, usage when
//! asked, `[DONE]`), and the accounting of what it used. A request of several choices (`n`,
//! a batch of prompts) has one event stream per choice, merged here by choice index.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::request::{EngineEvent, FinishReason, RequestTimings, Usage};
use cachet_backend::sampler::RowLogprobs;
use cachet_backend::tokenizer::TextTokenizer;
use hyper::{Response, StatusCode};
use tokio::sync::mpsc;

use super::AppState;
use crate::http::{self, ApiError, Body};
use crate::tenants::Permit;
use crate::upstream::Events;

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a response has generated, charged to the tenant's token budget exactly once per
/// choice: when the choice finishes (the engine's own count), or — when the client leaves first
/// and the request is cancelled — on drop, for the tokens delivered until then. Holds the
/// tenant's concurrency slot for as long.
struct Meter {
    permit: Permit,
    /// Per choice: tokens delivered and not yet charged (none once settled).
    delivered: Vec<u64>,
}

impl Meter {
    fn new(permit: Permit, choices: usize) -> Self {
        Meter {
            permit,
            delivered: vec![0; choices],
        }
    }

    fn token(&mut self, choice: usize) {
        self.delivered[choice] += 1;
    }

    /// Records a finished choice: metrics (its prompt once per prompt: `first` of its group),
    /// and its generated tokens against the tenant's budget.
    fn settle(
        &mut self,
        state: &AppState,
        choice: usize,
        first: bool,
        usage: &Usage,
        timings: &RequestTimings,
    ) {
        state.metrics.observe(
            self.permit.tenant().id(),
            timings,
            if first { usage.prompt_tokens } else { 0 },
            usage.completion_tokens,
        );
        if first {
            state
                .metrics
                .cached_tokens
                .inc_by(usage.cached_tokens as u64);
        }
        self.permit
            .tenant()
            .charge_tokens(usage.completion_tokens as u64, Instant::now());
        self.delivered[choice] = 0;
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let left: u64 = self.delivered.iter().sum();
        if left > 0 {
            self.permit.tenant().charge_tokens(left, Instant::now());
        }
    }
}

pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub chat: bool,
    /// Set when the client asked for timings: parsing, template, normalization and
    /// tokenization up to the engine's admission.
    pub prepare: Option<Duration>,
    /// Choices per prompt: choice `i` answers prompt `i / n`.
    pub n: usize,
    /// Whether the request asked for log-probabilities.
    pub logprobs: bool,
    /// Echoed when the request named a tier.
    pub service_tier: bool,
    /// Unknown fields let through, for the `x-cachet-warning` header.
    pub ignored: Vec<String>,
}

impl Meta {
    fn first_of_prompt(&self, choice: usize) -> bool {
        choice.is_multiple_of(self.n)
    }
    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat, chunk) {
            (true, false) => "chat.completion",
            (true, true) => "chat.completion.chunk",
            (false, _) => "text_completion",
        }
    }
    fn envelope(&self, chunk: bool, choices: serde_json::Value) -> serde_json::Value {
        let mut v = serde_json::json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.service_tier {
            v["service_tier"] = "default".into();
        }
        v
    }
    /// The response with the warning header when fields were ignored.
    fn finish(&self, mut r: Response<Body>) -> Response<Body> {
        if !self.ignored.is_empty() {
            let w = format!("ignored unknown fields: {}", self.ignored.join(", "));
            if let Ok(v) = hyper::header::HeaderValue::from_str(&w) {
                r.headers_mut().insert("x-cachet-warning", v);
            }
        }
        r
    }
}

fn usage_json(u: &Usage) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// The usage object, with the server-side timings when the client asked for them
/// (`cachet_timings`, milliseconds: prepare = parse + template + normalize + tokenize; queue =
/// engine arrival → first scheduled (KV allocation included); prefill = first scheduled → first
/// token; engine_ttft = queue + prefill; e2e and mean inter-token latency in the engine), of
/// the first choice.
fn usage_with_timings(u: &Usage, meta: &Meta, t: &RequestTimings) -> serde_json::Value {
    let mut v = usage_json(u);
    if let Some(p) = meta.prepare {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        v["cachet_timings"] = serde_json::json!({
            "prepare_ms": ms(p),
            "queue_ms": ms(t.queue),
            "prefill_ms": ms(t.prefill),
            "engine_ttft_ms": ms(t.ttft),
            "engine_e2e_ms": ms(t.e2e),
            "mean_itl_ms": ms(t.mean_itl),
            "preemptions": t.preemptions,
        });
    }
    v
}

/// The request's usage over its choices, as OpenAI counts it: each prompt once (and its cached
/// tokens as its first choice found them), every choice's output.
#[derive(Default)]
struct UsageSum {
    usage: Usage,
    timings: Option<RequestTimings>,
}

impl UsageSum {
    fn add(&mut self, meta: &Meta, choice: usize, u: &Usage, t: &RequestTimings) {
        if meta.first_of_prompt(choice) {
            self.usage.prompt_tokens += u.prompt_tokens;
            self.usage.cached_tokens += u.cached_tokens;
        }
        self.usage.completion_tokens += u.completion_tokens;
        if choice == 0 {
            self.timings = Some(*t);
        }
    }
    fn json(&self, meta: &Meta) -> serde_json::Value {
        usage_with_timings(&self.usage, meta, &self.timings.unwrap_or_default())
    }
}

/// OpenAI's stand-in for an impossible token's log-probability (JSON has no -∞).
const MIN_LOGPROB: f32 = -9999.0;

fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        MIN_LOGPROB
    }
}

/// Log-probabilities as a choice shows them: chat's `content` entries (token, logprob, bytes,
/// top_logprobs), or completions' parallel lists (tokens, token_logprobs, top_logprobs as
/// token → logprob, text_offset).
struct LogprobsOut {
    chat: bool,
    entries: Vec<serde_json::Value>,
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top: Vec<serde_json::Value>,
    offsets: Vec<usize>,
    /// Characters of the choice's text so far (completions' `text_offset`).
    offset: usize,
}

impl LogprobsOut {
    fn new(chat: bool) -> Self {
        LogprobsOut {
            chat,
            entries: Vec::new(),
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top: Vec::new(),
            offsets: Vec::new(),
            offset: 0,
        }
    }

    fn push(&mut self, tok: &TextTokenizer, lp: &RowLogprobs) {
        let piece = |id: u32| {
            let b = tok.token_bytes(id);
            (String::from_utf8_lossy(&b).into_owned(), b)
        };
        let (s, b) = piece(lp.token);
        if self.chat {
            let top: Vec<serde_json::Value> = lp
                .top
                .iter()
                .map(|&(id, l)| {
                    let (s, b) = piece(id);
                    serde_json::json!({"token": s, "logprob": finite(l), "bytes": b})
                })
                .collect();
            self.entries.push(serde_json::json!({
                "token": s, "logprob": finite(lp.logprob), "bytes": b, "top_logprobs": top,
            }));
        } else {
            let mut top = serde_json::Map::new();
            for &(id, l) in &lp.top {
                top.insert(piece(id).0, finite(l).into());
            }
            self.offsets.push(self.offset);
            self.offset += s.chars().count();
            self.tokens.push(s);
            self.token_logprobs.push(finite(lp.logprob));
            self.top.push(top.into());
        }
    }

    /// The `logprobs` object of everything pushed, and empties it (for the next chunk).
    fn take(&mut self) -> serde_json::Value {
        if self.chat {
            serde_json::json!({"content": std::mem::take(&mut self.entries)})
        } else {
            serde_json::json!({
                "tokens": std::mem::take(&mut self.tokens),
                "token_logprobs": std::mem::take(&mut self.token_logprobs),
                "top_logprobs": std::mem::take(&mut self.top),
                "text_offset": std::mem::take(&mut self.offsets),
            })
        }
    }
}

/// The choices' events merged into one channel, each tagged with its choice index. A forwarding
/// task per choice drops its stream — cancelling the request where it runs — as soon as the
/// receiver is gone.
fn merge(streams: Vec<Events>) -> mpsc::UnboundedReceiver<(usize, Option<EngineEvent>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    for (i, mut s) in streams.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let ev = tokio::select! {
                    ev = s.next() => ev,
                    _ = tx.closed() => return,
                };
                let end = !matches!(ev, Some(EngineEvent::Token { .. }));
                if tx.send((i, ev)).is_err() || end {
                    return;
                }
            }
        });
    }
    rx
}

pub async fn whole(
    streams: Vec<Events>,
    meta: Meta,
    permit: Permit,
    state: &AppState,
) -> Result<Response<Body>, ApiError> {
    let k = streams.len();
    // Dropped with this future when the client leaves: what was generated is charged, and the
    // forwarding tasks cancel every choice.
    let mut meter = Meter::new(permit, k);
    let mut rx = merge(streams);
    let mut text = vec![String::new(); k];
    let mut lps: Vec<LogprobsOut> = (0..k).map(|_| LogprobsOut::new(meta.chat)).collect();
    let mut reasons: Vec<Option<FinishReason>> = vec![None; k];
    let mut sum = UsageSum::default();
    let mut left = k;
    while left > 0 {
        let Some((i, ev)) = rx.recv().await else {
            return Err(ApiError::internal("the engine ended the stream early"));
        };
        match ev {
            Some(EngineEvent::Token {
                text: t, logprobs, ..
            }) => {
                meter.token(i);
                if let Some(lp) = &logprobs {
                    lps[i].push(&state.tokenizer, lp);
                }
                text[i].push_str(&t)
            }
            Some(EngineEvent::Finished {
                reason,
                usage,
                error,
                text: rest,
                timings,
            }) => {
                meter.settle(state, i, meta.first_of_prompt(i), &usage, &timings);
                if reason == FinishReason::Error {
                    return Err(ApiError::internal(
                        error.unwrap_or_else(|| "engine error".into()),
                    ));
                }
                text[i].push_str(&rest);
                reasons[i] = Some(reason);
                sum.add(&meta, i, &usage, &timings);
                left -= 1;
            }
            None => return Err(ApiError::internal("the engine ended the stream early")),
        }
    }
    let choices: Vec<serde_json::Value> = (0..k)
        .map(|i| {
            let logprobs = if meta.logprobs {
                lps[i].take()
            } else {
                serde_json::Value::Null
            };
            let reason = reasons[i].map_or("stop", |r| r.as_openai());
            let t = std::mem::take(&mut text[i]);
            if meta.chat {
                serde_json::json!({"index": i, "message": {"role": "assistant", "content": t}, "logprobs": logprobs, "finish_reason": reason})
            } else {
                serde_json::json!({"index": i, "text": t, "logprobs": logprobs, "finish_reason": reason})
            }
        })
        .collect();
    let mut body = meta.envelope(false, choices.into());
    body["usage"] = sum.json(&meta);
    Ok(meta.finish(http::json(StatusCode::OK, &body)))
}

pub fn sse(
    streams: Vec<Events>,
    meta: Meta,
    include_usage: bool,
    permit: Permit,
    state: Arc<AppState>,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let k = streams.len();
    let head = meta.finish(http::streaming("text/event-stream", rx));
    tokio::spawn(async move {
        let mut meter = Meter::new(permit, k);
        let mut events = merge(streams);
        let mut lps: Vec<LogprobsOut> = (0..k).map(|_| LogprobsOut::new(meta.chat)).collect();
        let mut sum = UsageSum::default();
        let chunk = |i: usize,
                     text: &str,
                     logprobs: Option<serde_json::Value>,
                     finish: Option<&str>,
                     role: bool| {
            let mut choice = if meta.chat {
                let delta = if role {
                    serde_json::json!({"role": "assistant", "content": text})
                } else if finish.is_some() && text.is_empty() {
                    serde_json::json!({})
                } else {
                    serde_json::json!({"content": text})
                };
                serde_json::json!({"index": i, "delta": delta, "finish_reason": finish})
            } else {
                serde_json::json!({"index": i, "text": text, "finish_reason": finish})
            };
            if meta.logprobs {
                choice["logprobs"] = logprobs.unwrap_or(serde_json::Value::Null);
            }
            let v = meta.envelope(true, serde_json::json!([choice]));
            Bytes::from(format!("data: {v}\n\n"))
        };
        if meta.chat {
            for i in 0..k {
                if tx.send(chunk(i, "", None, None, true)).await.is_err() {
                    return;
                }
            }
        }
        let mut left = k;
        while left > 0 {
            // A client that leaves is noticed at once (not at the next token): dropping the
            // merged channel cancels every choice, and the meter charges what was generated.
            let ev = tokio::select! {
                ev = events.recv() => ev,
                _ = tx.closed() => return,
            };
            let Some((i, ev)) = ev else { return };
            match ev {
                Some(EngineEvent::Token { text, logprobs, .. }) => {
                    meter.token(i);
                    let lp = logprobs.map(|lp| {
                        lps[i].push(&state.tokenizer, &lp);
                        lps[i].take()
                    });
                    if (!text.is_empty() || lp.is_some())
                        && tx.send(chunk(i, &text, lp, None, false)).await.is_err()
                    {
                        return; // client gone: dropping `events` cancels the request
                    }
                }
                Some(EngineEvent::Finished {
                    reason,
                    usage,
                    text,
                    error,
                    timings,
                }) => {
                    meter.settle(&state, i, meta.first_of_prompt(i), &usage, &timings);
                    if reason == FinishReason::Error {
                        let e = ApiError::internal(error.unwrap_or_default());
                        let _ = tx
                            .send(Bytes::from(format!("data: {}\n\n", e.body())))
                            .await;
                        return;
                    }
                    sum.add(&meta, i, &usage, &timings);
                    if !text.is_empty() {
                        let _ = tx.send(chunk(i, &text, None, None, false)).await;
                    }
                    let _ = tx
                        .send(chunk(i, "", None, Some(reason.as_openai()), false))
                        .await;
                    left -= 1;
                }
                None => return,
            }
        }
        if include_usage {
            let mut v = meta.envelope(true, serde_json::json!([]));
            v["usage"] = sum.json(&meta);
            let _ = tx.send(Bytes::from(format!("data: {v}\n\n"))).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    head
}
