//! A completion's response: the whole JSON answer, or OpenAI's SSE chunks (a role chunk, text
//! deltas, the finish chunk, usage when asked, `[DONE]`), and the accounting of what it used.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::request::{EngineEvent, FinishReason, RequestTimings, Usage};
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

/// What a response has generated, charged to the tenant's token budget exactly once: when the
/// request finishes (the engine's own count), or — when the client leaves first and the request
/// is cancelled — on drop, for the tokens delivered until then. Holds the tenant's concurrency
/// slot for as long.
struct Meter {
    permit: Permit,
    /// Tokens delivered and not yet charged (none once settled).
    tokens: u64,
}

impl Meter {
    fn new(permit: Permit) -> Self {
        Meter { permit, tokens: 0 }
    }

    fn token(&mut self) {
        self.tokens += 1;
    }

    /// Records a finished request: metrics, and the generated tokens against the tenant's budget.
    fn settle(&mut self, state: &AppState, usage: &Usage, timings: &RequestTimings) {
        state.metrics.observe(
            self.permit.tenant().id(),
            timings,
            usage.prompt_tokens,
            usage.completion_tokens,
        );
        state
            .metrics
            .cached_tokens
            .inc_by(usage.cached_tokens as u64);
        self.permit
            .tenant()
            .charge_tokens(usage.completion_tokens as u64, Instant::now());
        self.tokens = 0;
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.tokens > 0 {
            self.permit
                .tenant()
                .charge_tokens(self.tokens, Instant::now());
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
/// token; engine_ttft = queue + prefill; e2e and mean inter-token latency in the engine).
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

pub async fn whole(
    mut stream: Events,
    meta: Meta,
    permit: Permit,
    state: &AppState,
) -> Result<Response<Body>, ApiError> {
    // Dropped with this future when the client leaves: what was generated is charged.
    let mut meter = Meter::new(permit);
    let mut text = String::new();
    loop {
        match stream.next().await {
            Some(EngineEvent::Token { text: t, .. }) => {
                meter.token();
                text.push_str(&t)
            }
            Some(EngineEvent::Finished {
                reason,
                usage,
                error,
                text: rest,
                timings,
            }) => {
                meter.settle(state, &usage, &timings);
                if reason == FinishReason::Error {
                    return Err(ApiError::internal(
                        error.unwrap_or_else(|| "engine error".into()),
                    ));
                }
                text.push_str(&rest);
                let choice = if meta.chat {
                    serde_json::json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason.as_openai()})
                } else {
                    serde_json::json!({"index": 0, "text": text, "finish_reason": reason.as_openai()})
                };
                let body = serde_json::json!({
                    "id": meta.id,
                    "object": if meta.chat { "chat.completion" } else { "text_completion" },
                    "created": meta.created,
                    "model": meta.model,
                    "choices": [choice],
                    "usage": usage_with_timings(&usage, &meta, &timings),
                });
                return Ok(http::json(StatusCode::OK, &body));
            }
            None => return Err(ApiError::internal("the engine ended the stream early")),
        }
    }
}

pub fn sse(
    mut stream: Events,
    meta: Meta,
    include_usage: bool,
    permit: Permit,
    state: Arc<AppState>,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut meter = Meter::new(permit);
        let object = if meta.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let chunk = |delta: serde_json::Value, finish: Option<&str>| {
            let choice = if meta.chat {
                serde_json::json!({"index": 0, "delta": delta, "finish_reason": finish})
            } else {
                serde_json::json!({"index": 0, "text": delta.get("content").cloned().unwrap_or_default(), "finish_reason": finish})
            };
            let v = serde_json::json!({"id": meta.id, "object": object, "created": meta.created, "model": meta.model, "choices": [choice]});
            Bytes::from(format!("data: {v}\n\n"))
        };
        if meta.chat
            && tx
                .send(chunk(
                    serde_json::json!({"role": "assistant", "content": ""}),
                    None,
                ))
                .await
                .is_err()
        {
            return;
        }
        loop {
            // A client that leaves is noticed at once (not at the next token): dropping `stream`
            // cancels the request, and the meter charges what was generated.
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = tx.closed() => return,
            };
            match ev {
                Some(EngineEvent::Token { text, .. }) => {
                    meter.token();
                    if !text.is_empty()
                        && tx
                            .send(chunk(serde_json::json!({"content": text}), None))
                            .await
                            .is_err()
                    {
                        return; // client gone: dropping `stream` cancels the request
                    }
                }
                Some(EngineEvent::Finished {
                    reason,
                    usage,
                    text,
                    error,
                    timings,
                }) => {
                    meter.settle(&state, &usage, &timings);
                    if reason == FinishReason::Error {
                        let e = ApiError::internal(error.unwrap_or_default());
                        let _ = tx
                            .send(Bytes::from(format!("data: {}\n\n", e.body())))
                            .await;
                        return;
                    }
                    if !text.is_empty() {
                        let _ = tx
                            .send(chunk(serde_json::json!({"content": text}), None))
                            .await;
                    }
                    let _ = tx
                        .send(chunk(serde_json::json!({}), Some(reason.as_openai())))
                        .await;
                    if include_usage {
                        let v = serde_json::json!({"id": meta.id, "object": object, "created": meta.created, "model": meta.model, "choices": [], "usage": usage_with_timings(&usage, &meta, &timings)});
                        let _ = tx.send(Bytes::from(format!("data: {v}\n\n"))).await;
                    }
                    let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                    return;
                }
                None => return,
            }
        }
    });
    http::streaming("text/event-stream", rx)
}
