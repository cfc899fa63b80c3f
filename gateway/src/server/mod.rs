//! The HTTP front of the gateway (hyper 1; HTTP/1.1 and HTTP/2): OpenAI-compatible chat and text
//! completions (JSON or SSE streaming) over the embedded engine, tenant authentication and
//! admission, `/health`, `/ready`, `/v1/models`.
//!
//! A client that goes away drops its response body; the task feeding it then drops the engine
//! stream, which cancels the request and frees its KV blocks.

pub mod error;
mod idle;
pub mod metrics;
pub mod openai;
pub mod templates;
pub mod tls;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cachet_backend::engine::EngineHandle;
use cachet_backend::request::{EngineEvent, EngineRequest, FinishReason, RequestTimings, Usage};
use cachet_backend::sampler::SamplingParams;
use cachet_backend::tokenizer::TextTokenizer;
use cachet_backend::EngineError;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::{header, Method, Request, Response, StatusCode};
use tokio::sync::{mpsc, watch};

use crate::tenants::{Permit, TenantRegistry};
use error::ApiError;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// How much of a too-large body is read (and dropped) so the client sees the 413.
pub const DRAIN_BODY_BYTES: usize = 16 << 20;

pub type RespBody = BoxBody<Bytes, Infallible>;

/// What every request handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: TextTokenizer,
    /// Swapped whole on reload (SIGHUP); requests in flight keep the tenant they authenticated as.
    pub tenants: std::sync::RwLock<Arc<TenantRegistry>>,
    /// The model name clients send (`model`).
    pub model_id: String,
    pub created: u64,
    pub metrics: metrics::Metrics,
    /// Tenants' prompt templates (`--templates-dir`); `None` disables them.
    pub templates: Option<Arc<crate::sandbox::store::TemplateStore>>,
    /// Tokens of recent static prompt prefixes.
    pub prefix_tokens: crate::normalize::tokens::PrefixTokens,
    /// `cachet worker`s to route to (`--worker`); `None`: the embedded engine serves.
    pub pool: Option<Arc<crate::upstream::Pool>>,
}

impl AppState {
    /// The current tenant registry.
    pub fn tenants(&self) -> Arc<TenantRegistry> {
        self.tenants.read().expect("tenants lock").clone()
    }

    /// Replaces the tenant registry (config reload). Limits and concurrency counts start afresh.
    pub fn set_tenants(&self, reg: TenantRegistry) {
        *self.tenants.write().expect("tenants lock") = Arc::new(reg);
    }
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<RespBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("static response parts")
}

fn error_response(e: &ApiError) -> Response<RespBody> {
    let mut r = json(e.status, &e.body());
    if let Some(d) = e.retry_after {
        let secs = d.as_secs_f64().ceil().max(1.0) as u64;
        r.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    r
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Routes one request.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let result = match (&method, path.as_str()) {
        (&Method::GET, "/health") => Ok(json(StatusCode::OK, &serde_json::json!({"status": "ok"}))),
        (&Method::GET, "/ready") => Ok(json(
            StatusCode::OK,
            &serde_json::json!({"status": "ready", "model": state.model_id}),
        )),
        (&Method::GET, "/v1/models") => models(&state, &req),
        (&Method::GET, "/metrics") => Ok({
            if let Some(pool) = &state.pool {
                state.metrics.worker_load(&pool.load());
            }
            Response::builder()
                .status(StatusCode::OK)
                .header(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )
                .body(Full::new(Bytes::from(state.metrics.render(&state.engine.stats()))).boxed())
                .expect("static response parts")
        }),
        (&Method::POST, "/v1/chat/completions") => {
            counted(&state, completion(state.clone(), req, true).await)
        }
        (&Method::POST, "/v1/completions") => {
            counted(&state, completion(state.clone(), req, false).await)
        }
        (_, p) if p == "/v1/templates" || p.starts_with("/v1/templates/") => {
            templates::admin(state.clone(), req).await
        }
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/models"
            | "/health"
            | "/ready"
            | "/metrics",
        ) => Err(ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            ..ApiError::bad_request(format!("{method} is not allowed on {path}"), None)
        }),
        _ => Err(ApiError::not_found(format!("no route {path}"), "not_found")),
    };
    Ok(result.unwrap_or_else(|e| error_response(&e)))
}

/// Counts a completion request by tenant and status (errors before authentication count as
/// tenant `-`).
fn counted(
    state: &AppState,
    r: Result<(Response<RespBody>, String), (ApiError, String)>,
) -> Result<Response<RespBody>, ApiError> {
    match r {
        Ok((resp, tenant)) => {
            state.metrics.count(&tenant, resp.status().as_u16());
            Ok(resp)
        }
        Err((e, tenant)) => {
            state.metrics.count(&tenant, e.status.as_u16());
            Err(e)
        }
    }
}

fn bearer(req: &Request<Incoming>) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

fn models(state: &AppState, req: &Request<Incoming>) -> Result<Response<RespBody>, ApiError> {
    let tenant = state.tenants().authenticate(bearer(req).unwrap_or(""))?;
    let data: Vec<serde_json::Value> = [&state.model_id]
        .iter()
        .filter(|m| tenant.allows_model(m))
        .map(|m| serde_json::json!({"id": m, "object": "model", "created": state.created, "owned_by": "cachet"}))
        .collect();
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    ))
}

/// Reads a JSON body of at most [`MAX_BODY_BYTES`]. A larger body is read on (and dropped) up to
/// [`DRAIN_BODY_BYTES`] so the client, still sending, receives the 413 instead of a reset.
async fn read_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, ApiError> {
    let buf = read_body(req, MAX_BODY_BYTES).await?;
    serde_json::from_slice(&buf)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))
}

/// Reads a body of at most `limit` bytes. A larger body is read on (and dropped) up to
/// [`DRAIN_BODY_BYTES`] so the client, still sending, receives the 413 instead of a reset.
pub(crate) async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Vec<u8>, ApiError> {
    let mut body = req.into_body();
    let mut buf = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}"), None))?;
        if let Ok(data) = frame.into_data() {
            total += data.len();
            if total <= limit {
                buf.extend_from_slice(&data);
            } else if total > DRAIN_BODY_BYTES.max(limit) {
                break;
            }
        }
    }
    if total > limit {
        return Err(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::bad_request(format!("request body is larger than {limit} bytes"), None)
        });
    }
    Ok(buf)
}

fn upstream_error(e: crate::upstream::UpstreamError) -> ApiError {
    use crate::upstream::UpstreamError::*;
    match e {
        Rejected(m) => ApiError::bad_request(m, None),
        other => ApiError::overloaded(other.to_string(), Duration::from_secs(1)),
    }
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Overloaded { .. } | EngineError::OverloadedTokens { .. } => {
            ApiError::overloaded(e.to_string(), Duration::from_secs(1))
        }
        EngineError::InvalidRequest(m) => ApiError::bad_request(m, None),
        other => ApiError::internal(other.to_string()),
    }
}

async fn completion(
    state: Arc<AppState>,
    req: Request<Incoming>,
    chat: bool,
) -> Result<(Response<RespBody>, String), (ApiError, String)> {
    let tenant = state
        .tenants()
        .authenticate(bearer(&req).unwrap_or(""))
        .map_err(|e| (e.into(), "-".to_string()))?;
    let name = tenant.id().to_string();
    completion_for(state, req, chat, tenant)
        .await
        .map(|r| (r, name.clone()))
        .map_err(|e| (e, name))
}

async fn completion_for(
    state: Arc<AppState>,
    req: Request<Incoming>,
    chat: bool,
    tenant: Arc<crate::tenants::Tenant>,
) -> Result<Response<RespBody>, ApiError> {
    let arrived = Instant::now();
    // `x-cachet-timings: 1` asks for the server-side split of the request's time in its usage.
    let want_timings = req.headers().contains_key("x-cachet-timings");
    let mut hints = None;
    // The prompt as token ids (engines) and as text (OpenAI-compatible upstreams).
    let (common, prompt, prompt_text) = if chat {
        let r: openai::ChatRequest = read_json(req).await?;
        let msgs = r.messages()?;
        let segments = match templates::apply(&state, &tenant, &r, &msgs).await? {
            Some(applied) => {
                hints = Some((applied.rendered.stop, applied.rendered.max_tokens));
                applied.rendered.segments
            }
            None => crate::normalize::chat_segments(
                &msgs
                    .iter()
                    .map(|m| (m.role.clone(), m.content.clone()))
                    .collect::<Vec<_>>(),
            ),
        };
        let p = prepare(&state, &tenant, &segments)?;
        (r.common, p.ids, p.prompt)
    } else {
        let r: openai::CompletionRequest = read_json(req).await?;
        let p = r.prompt()?;
        let ids = state.tokenizer.encode(&p).map_err(engine_error)?;
        (r.common, ids, p)
    };
    if common.model != state.model_id {
        return Err(ApiError::not_found(
            format!(
                "model `{}` does not exist; GET /v1/models lists them",
                common.model
            ),
            "model_not_found",
        ));
    }
    if !tenant.allows_model(&common.model) {
        return Err(crate::tenants::Denied::ModelNotAllowed {
            tenant: tenant.id().into(),
            model: common.model.clone(),
        }
        .into());
    }
    let (max_tokens, mut stop) = common.validate()?;
    // The template's hints: more stop strings, and a cap on the output.
    let mut cap = None;
    if let Some((extra, max_hint)) = hints {
        for s in extra {
            if !s.is_empty() && !stop.contains(&s) {
                stop.push(s);
            }
        }
        cap = max_hint.map(u64::from);
    }
    let room = state.engine.max_model_len().saturating_sub(prompt.len()) as u64;
    if room == 0 {
        return Err(ApiError::bad_request(
            format!(
                "the prompt has {} tokens, the model's limit is {}",
                prompt.len(),
                state.engine.max_model_len()
            ),
            Some("messages"),
        ));
    }
    let max_tokens = max_tokens.unwrap_or(room.min(1024));
    let max_tokens = cap.map_or(max_tokens, |c| max_tokens.min(c.max(1)));
    let permit = tenant.admit(prompt.len() as u64, Instant::now())?;
    let mut er = EngineRequest::new(prompt, max_tokens as usize);
    er.sampling = SamplingParams {
        temperature: common.temperature.unwrap_or(1.0),
        top_k: 0,
        top_p: common.top_p.unwrap_or(1.0),
        seed: common.seed,
    };
    er.stop = stop;
    er.salt = tenant.salt;
    er.priority = tenant.config.priority;
    er.tag = tenant.id().to_string();
    er.ignore_eos = common.ignore_eos;
    let stream = match &state.pool {
        Some(pool) => {
            let (stream, routed) = pool
                .submit(&er, &prompt_text, common.user.as_deref())
                .await
                .map_err(upstream_error)?;
            state.metrics.routed(
                pool.policy.name(),
                routed.reason,
                &pool.workers[routed.worker].url,
                routed.predicted_cached_tokens,
            );
            stream
        }
        None => crate::upstream::local(&state.engine, er).map_err(engine_error)?,
    };
    let id = format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, stream.id());
    let include_usage = common
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let meta = Meta {
        id,
        created: now_unix(),
        model: state.model_id.clone(),
        chat,
        prepare: want_timings.then(|| arrived.elapsed()),
    };
    if common.stream {
        Ok(sse(stream, meta, include_usage, permit, state.clone()))
    } else {
        whole(stream, meta, permit, &state).await
    }
}

/// A chat prompt ready for the engine: normalized, rendered, tokenized.
pub struct Prepared {
    pub segments: Vec<cachet_guest_sdk::Segment>,
    pub relocated: Vec<String>,
    pub prompt: String,
    pub ids: Vec<u32>,
    /// Tokens of the request-independent prefix (cached tokenization).
    pub stable_tokens: usize,
}

/// Normalizes `segments` under the tenant's rules, renders them with the chat template, and
/// tokenizes with the static prefix's tokens cached.
pub fn prepare(
    state: &AppState,
    tenant: &crate::tenants::Tenant,
    segments: &[cachet_guest_sdk::Segment],
) -> Result<Prepared, ApiError> {
    let n = crate::normalize::normalize(segments, &tenant.rules);
    let (messages, first_dynamic) = crate::normalize::to_messages(&n.segments);
    let (prompt, boundary) =
        crate::normalize::tokens::render_with_boundary(&state.tokenizer, &messages, first_dynamic)
            .map_err(engine_error)?;
    let enc = state
        .prefix_tokens
        .encode(&state.tokenizer, &prompt, boundary.unwrap_or(0))
        .map_err(engine_error)?;
    state
        .metrics
        .normalized(tenant.id(), n.relocated.len(), enc.stable_tokens);
    Ok(Prepared {
        segments: n.segments,
        relocated: n.relocated,
        prompt,
        ids: enc.ids,
        stable_tokens: enc.stable_tokens,
    })
}

/// Records a finished request: metrics, and the generated tokens against the tenant's budget.
fn account(state: &AppState, permit: &Permit, usage: &Usage, timings: &RequestTimings) {
    state.metrics.observe(
        permit.tenant().id(),
        timings,
        usage.prompt_tokens,
        usage.completion_tokens,
    );
    state
        .metrics
        .cached_tokens
        .inc_by(usage.cached_tokens as u64);
    permit
        .tenant()
        .charge_tokens(usage.completion_tokens as u64, Instant::now());
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    chat: bool,
    /// Set when the client asked for timings: parsing, template, normalization and
    /// tokenization up to the engine's admission.
    prepare: Option<Duration>,
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

async fn whole(
    mut stream: crate::upstream::TokenStream,
    meta: Meta,
    permit: Permit,
    state: &AppState,
) -> Result<Response<RespBody>, ApiError> {
    let mut text = String::new();
    loop {
        match stream.next().await {
            Some(EngineEvent::Token { text: t, .. }) => text.push_str(&t),
            Some(EngineEvent::Finished {
                reason,
                usage,
                error,
                text: rest,
                timings,
            }) => {
                account(state, &permit, &usage, &timings);
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
                return Ok(json(StatusCode::OK, &body));
            }
            None => return Err(ApiError::internal("the engine ended the stream early")),
        }
    }
}

/// A response body fed by a channel: dropping it (client gone) closes the channel.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

fn sse(
    mut stream: crate::upstream::TokenStream,
    meta: Meta,
    include_usage: bool,
    permit: Permit,
    state: Arc<AppState>,
) -> Response<RespBody> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let _permit = permit;
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
            match stream.next().await {
                Some(EngineEvent::Token { text, .. }) => {
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
                    account(&state, &_permit, &usage, &timings);
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
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(ChannelBody { rx }.boxed())
        .expect("static response parts")
}

/// Connection-level limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A client must send a request's headers within this (slowloris).
    pub header_read_timeout: Duration,
    /// Largest request head (HTTP/1 buffer, HTTP/2 header list); larger gets 431.
    pub max_header_bytes: usize,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// A connection with no request in flight and no traffic for this long is closed.
    pub idle_timeout: Duration,
    pub grace: Duration,
}

/// Accepts connections on `listener` (through TLS when `tls` is given) until `shutdown` turns
/// true, then stops accepting and lets connections in flight finish within `limits.grace`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let (conn_tx, mut conn_rx) = watch::channel(0usize);
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let grace = limits.grace;
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s.expect("semaphore never closed"),
            _ = shutdown.changed() => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer): (tokio::net::TcpStream, SocketAddr) = match accepted {
                    Ok(x) => x,
                    Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
                };
                tune_accepted(&stream);
                let state = state.clone();
                let active = active.clone();
                let conn_tx = conn_tx.clone();
                let mut stop = shutdown.clone();
                let acceptor = acceptor.clone();
                active.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let _slot = slot;
                    let activity = idle::Activity::new();
                    let stream = idle::Watched::new(stream, activity.clone());
                    let act = activity.clone();
                    let svc = hyper::service::service_fn(move |req| {
                        let guard = act.begin();
                        let state = state.clone();
                        async move {
                            let resp = handle(state, req).await?;
                            Ok::<_, Infallible>(resp.map(|b| idle::guard_body(b, guard)))
                        }
                    });
                    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    builder
                        .http1()
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_read_timeout)
                        .max_buf_size(limits.max_header_bytes.max(8192));
                    builder.http2().timer(TokioTimer::new()).max_header_list_size(limits.max_header_bytes as u32);
                    macro_rules! run {
                        ($io:expr) => {{
                            let conn = builder.serve_connection($io, svc);
                            tokio::pin!(conn);
                            tokio::select! {
                                r = conn.as_mut() => { if let Err(e) = r { tracing::debug!(%peer, error = %e, "connection ended with an error"); } }
                                _ = stop.changed() => {
                                    conn.as_mut().graceful_shutdown();
                                    let _ = conn.await;
                                }
                                _ = activity.idle(limits.idle_timeout) => {
                                    tracing::debug!(%peer, "closing an idle connection");
                                    conn.as_mut().graceful_shutdown();
                                    // A peer that never answers HTTP/2's shutdown PING must not
                                    // hold the connection: with nothing in flight, drop it.
                                    loop {
                                        tokio::select! {
                                            _ = conn.as_mut() => break,
                                            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                                                if !activity.busy() { break; }
                                            }
                                        }
                                    }
                                }
                            }
                        }};
                    }
                    match acceptor {
                        Some(acc) => match tokio::time::timeout(Duration::from_secs(10), acc.accept(stream)).await {
                            Ok(Ok(tls_stream)) => run!(TokioIo::new(tls_stream)),
                            Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                        },
                        None => run!(TokioIo::new(stream)),
                    }
                    let left = active.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) - 1;
                    let _ = conn_tx.send(left);
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tracing::info!("draining: no new connections; waiting for requests in flight");
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    while active.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        tokio::select! {
            _ = conn_rx.changed() => {}
            _ = &mut deadline => { tracing::warn!("grace period over; closing the remaining connections"); break; }
        }
    }
    Ok(())
}
/// Socket options of an accepted client connection. Streamed tokens are small writes: without
/// TCP_NODELAY, Nagle's algorithm holds one back until the client's (delayed, ~40 ms) ACK of the
/// previous write arrives; measured on the H200, every request whose first token came sooner saw
/// it at ~43 ms.
fn tune_accepted(stream: &tokio::net::TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        assert!(!stream.nodelay().unwrap(), "the OS default has Nagle on");
        super::tune_accepted(&stream);
        assert!(stream.nodelay().unwrap());
    }
}
