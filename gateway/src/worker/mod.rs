//! `cachet worker`: the engine as its own process, over HTTP (plain HTTP/1.1 and HTTP/2), for a
//! gateway in front of a pool of them. The wire format is [`crate::protocol`]'s; the accept loop,
//! bodies and errors are [`crate::http`]'s.
//!
//! Block hashes are the engine's own (DESIGN.md interface 1: keyed blake3 chain, the tenant's
//! salt): a gateway holding the same deployment key computes the same hashes for a prompt, so it
//! knows exactly which worker holds which prefix. `key_id` (a hash of the key) lets it check.

pub mod kv_tracker;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cachet_backend::engine::EngineHandle;
use cachet_backend::request::{EngineEvent, EngineRequest};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{broadcast, mpsc, watch};

pub use crate::protocol::key_id;
pub use kv_tracker::KvTracker;

use crate::http::{self, ApiError, Body};
use crate::protocol::{parse_hex32, GenerateRequest, StateReply, WireEvent};

/// Largest `/v1/generate` body.
const MAX_BODY: usize = 16 << 20;

/// What the worker's handlers share.
pub struct WorkerState {
    pub engine: EngineHandle,
    pub model_id: String,
    /// Identifies the deployment key without revealing it.
    pub key_id: String,
    pub tracker: Arc<KvTracker>,
    /// Bearer token the gateway must send, if set.
    pub auth_token: Option<String>,
    /// Turns true at shutdown: ends the long-lived `/v1/kv_events` streams.
    pub closing: watch::Receiver<bool>,
    /// Spans of generate requests exported over OTLP (`--otlp-endpoint`), children of the
    /// gateway's request span through its `traceparent`.
    pub tracing: Option<Arc<crate::trace::Tracing>>,
}

fn error(status: StatusCode, code: &'static str, message: impl std::fmt::Display) -> ApiError {
    ApiError {
        status,
        code: Some(code),
        ..ApiError::bad_request(message.to_string(), None)
    }
}

/// Routes one request (a generation's access line names the model).
pub async fn handle(state: Arc<WorkerState>, req: Request<Incoming>) -> Response<Body> {
    if req.uri().path() == "/v1/generate" {
        if let Some(s) = crate::http::access::Seen::of(&req) {
            s.model(&state.model_id);
        }
    }
    if let Some(token) = &state.auth_token {
        if !http::token_matches(http::bearer(&req), token) && req.uri().path() != "/health" {
            return error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this worker needs its auth token as `Authorization: Bearer <token>`",
            )
            .response();
        }
    }
    let path = req.uri().path().to_string();
    let result = match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => Ok(http::json(
            StatusCode::OK,
            &serde_json::json!({"status": "ok"}),
        )),
        (&Method::GET, "/v1/state") => {
            let s = state.engine.stats();
            let reply = StateReply {
                model: state.model_id.clone(),
                block_size: state.engine.block_size(),
                max_model_len: state.engine.max_model_len(),
                key_id: state.key_id.clone(),
                running: s.running,
                waiting: s.waiting,
                kv_total: s.kv.total,
                kv_used: s.kv.used,
                cached_blocks: state.tracker.len(),
            };
            Ok(http::json(
                StatusCode::OK,
                &serde_json::to_value(reply).expect("serialises"),
            ))
        }
        (&Method::GET, "/v1/kv_events") => Ok(kv_events(&state)),
        (&Method::POST, "/v1/generate") => generate(&state, req).await,
        (m, "/health" | "/v1/state" | "/v1/kv_events" | "/v1/generate") => {
            Err(ApiError::method_not_allowed(m, &path))
        }
        _ => Err(error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route {path}"),
        )),
    };
    result.unwrap_or_else(|e| e.response())
}

fn kv_events(state: &WorkerState) -> Response<Body> {
    let (tx, rx) = mpsc::channel(256);
    // Subscribe before the snapshot: a change in between arrives twice, which applying in
    // sequence order makes harmless.
    let mut changes = state.tracker.changes.subscribe();
    let snapshot = state.tracker.snapshot();
    let tracker = state.tracker.clone();
    let mut closing = state.closing.clone();
    tokio::spawn(async move {
        if tx.send(http::ndjson_line(&snapshot)).await.is_err() {
            return;
        }
        loop {
            let got = tokio::select! {
                got = changes.recv() => got,
                _ = closing.changed() => return,
            };
            let next = match got {
                Ok((_, wire)) => wire,
                // Fell behind: start over from a fresh snapshot.
                Err(broadcast::error::RecvError::Lagged(_)) => tracker.snapshot(),
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if tx.send(http::ndjson_line(&next)).await.is_err() {
                return;
            }
        }
    });
    http::streaming("application/x-ndjson", rx)
}

/// Most stop strings, their longest, and most stop token ids a request may carry (the gateway
/// sends the API's and the template's together).
const MAX_STOP: usize = 16;
const MAX_STOP_BYTES: usize = 1024;
const MAX_STOP_TOKEN_IDS: usize = 256;
const MAX_TAG_BYTES: usize = 256;
/// A day: longer timeouts are taken as this (no Instant overflow).
const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// The engine request a gateway sent, every field in range (the engine checks the rest: token
/// ids against the vocabulary, the length against the model's, the sampling parameters).
fn engine_request(g: GenerateRequest) -> Result<EngineRequest, ApiError> {
    let bad = |m: String| error(StatusCode::BAD_REQUEST, "invalid_request", m);
    if g.stop.len() > MAX_STOP
        || g.stop
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(bad(format!(
            "stop takes up to {MAX_STOP} non-empty strings of at most {MAX_STOP_BYTES} bytes"
        )));
    }
    if g.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(bad(format!(
            "stop_token_ids takes up to {MAX_STOP_TOKEN_IDS} ids"
        )));
    }
    if g.tag.len() > MAX_TAG_BYTES {
        return Err(bad(format!("tag takes up to {MAX_TAG_BYTES} bytes")));
    }
    if g.timeout_ms == Some(0) {
        return Err(bad("timeout_ms must be at least 1".into()));
    }
    let Some(salt) = parse_hex32(&g.salt) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "bad_salt",
            "salt must be 64 hex digits (the tenant's cache salt)",
        ));
    };
    let mut er = EngineRequest::new(g.prompt, g.max_tokens);
    er.sampling = g.sampling;
    er.constraint = g.constraint;
    er.stop = g.stop;
    er.stop_token_ids = g.stop_token_ids;
    er.ignore_eos = g.ignore_eos;
    er.salt = salt;
    er.public_blocks = g.public_blocks;
    er.priority = g.priority;
    er.share = g.share;
    er.tag = g.tag;
    er.deadline = g
        .timeout_ms
        .map(|ms| Instant::now() + Duration::from_millis(ms.min(MAX_TIMEOUT_MS)));
    Ok(er)
}

async fn generate(state: &WorkerState, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let trace = crate::trace::RequestTrace::start(
        state.tracing.as_deref(),
        req.headers(),
        "/v1/generate",
        std::time::Instant::now(),
    );
    trace.attributes(|| {
        [opentelemetry::KeyValue::new(
            "gen_ai.request.model",
            state.model_id.clone(),
        )]
    });
    let g: GenerateRequest = http::read_json(req, MAX_BODY)
        .await
        .inspect_err(|e| trace.end(e.status.as_u16()))?;
    let er = engine_request(g).inspect_err(|e| trace.end(e.status.as_u16()))?;
    trace.sent();
    let mut stream = crate::upstream::embedded::submit_engine(&state.engine, er)
        .await
        .map_err(|e| {
            use cachet_backend::EngineError;
            match e {
                e if e.is_overload() => ApiError::overloaded(e.to_string(), Duration::from_secs(1)),
                EngineError::InvalidRequest(m) => {
                    error(StatusCode::BAD_REQUEST, "invalid_request", m)
                }
                e => ApiError::internal(e.to_string()),
            }
        })
        .inspect_err(|e| trace.end(e.status.as_u16()))?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        // Dropping `stream` when the client is gone cancels the request in the engine — at once,
        // not only when the next event fails to send.
        loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = tx.closed() => return,
            };
            let Some(ev) = ev else { return };
            if let EngineEvent::Finished {
                usage,
                timings,
                error,
                ..
            } = &ev
            {
                trace.engine(timings);
                trace.usage(usage.prompt_tokens as u64, usage.completion_tokens as u64);
                trace.end(if error.is_some() { 500 } else { 200 });
            }
            let wire = WireEvent::from(ev);
            if tx.send(http::ndjson_line(&wire)).await.is_err() {
                return;
            }
        }
    });
    Ok(http::streaming("application/x-ndjson", rx))
}

/// Serves the worker API on `listener` (each connection on one of `lanes` where given) until
/// `shutdown` turns true; requests in flight then get `limits.grace` to finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<WorkerState>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: watch::Receiver<bool>,
    limits: http::serve::Limits,
    lanes: Option<Arc<http::lanes::Lanes>>,
) -> std::io::Result<()> {
    let handle = move |req| handle(state.clone(), req);
    http::serve::serve(listener, handle, tls, shutdown, limits, lanes).await
}
