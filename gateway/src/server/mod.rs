//! The gateway's API server: OpenAI-compatible chat and text completions (JSON or SSE
//! streaming), tenant authentication and admission, the templates API, `/health`, `/ready`,
//! `/v1/models`, `/metrics`. Requests run on the [`crate::upstream::Pool`] — the embedded engine,
//! `cachet worker`s, OpenAI-compatible servers, or a mix.
//!
//! - [`completions`]: one completion request, validated before any work, then template,
//!   normalization, tokenization, admission and routing;
//! - [`respond`]: the response, whole or streamed, and the usage it accounts;
//! - [`openai`]: the API's request shapes; [`errors`]: subsystems' errors as API errors;
//! - [`templates`]: the tenants' templates API; [`metrics`]: `/metrics`.
//!
//! A client that goes away drops its response body; the task feeding it then drops the upstream
//! stream, which cancels the request where it runs and frees its KV blocks.

pub mod anthropic;
pub mod completions;
pub mod errors;
pub mod fields;
pub mod metrics;
pub mod openai;
pub mod operator;
pub mod reasoning;
pub mod respond;
pub mod responses;
pub mod templates;
pub mod tokenize;
pub mod tools;
pub mod usage;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cachet_backend::engine::EngineHandle;
use cachet_backend::tokenizer::TextTokenizer;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;

pub use crate::http::serve::Limits;
use crate::http::{self, ApiError, Body};
use crate::tenants::TenantRegistry;
use crate::upstream::Pool;

/// Bytes of token ids the static-prefix tokenization cache holds (LRU beyond).
pub const PREFIX_TOKEN_CACHE_BYTES: usize = 64 << 20;

/// What a request handler works with: the model it serves (its names, text side and pool) and
/// what every model of the gateway shares (tenants, metrics, usage records, traces, templates,
/// the operator store) — one `AppState` per model, the shared parts behind `Arc`s, so a request
/// runs on [`AppState::serving`]'s state for the model it names.
pub struct AppState {
    /// Where requests run.
    pub pool: Arc<Pool>,
    /// The embedded engine when it is one of the pool's members (its state goes to `/metrics`).
    pub engine: Option<EngineHandle>,
    pub tokenizer: TextTokenizer,
    /// Longest prompt + output the gateway admits.
    pub max_model_len: usize,
    /// How long a request may take end to end: the deadline it carries to the engine.
    pub request_timeout: Duration,
    /// Swapped whole on reload (SIGHUP, or a change in the operator store); requests in flight
    /// keep the tenant they authenticated as. Shared by every model.
    tenants: Arc<std::sync::RwLock<Arc<TenantRegistry>>>,
    /// The model's name: what responses and usage records carry (the first served name).
    pub model_id: String,
    /// Every name clients may send as `model` (`--served-model-name`; `model_id` first): each
    /// is listed by `/v1/models`, may be priced and may be in a tenant's `allowed_models`.
    pub served_names: Vec<String>,
    /// The model's recommended sampling (`generation_config.json`), for requests that set no
    /// value of their own.
    pub sampling_defaults: cachet_backend::loader::generation::GenerationConfig,
    pub created: u64,
    /// Shared by every model.
    pub metrics: Arc<metrics::Metrics>,
    /// Tenants' prompt templates (`--templates-dir`); `None` disables them.
    pub templates: Option<Arc<crate::sandbox::store::TemplateStore>>,
    /// Tokens of recent static prompt prefixes.
    pub prefix_tokens: crate::normalize::tokens::PrefixTokens,
    /// The operator's token for `/metrics` (which names tenants); without one, `/metrics`
    /// answers loopback clients only.
    pub metrics_token: Option<String>,
    /// Largest API request body (`--max-body-kib`); a larger one is 413.
    pub max_body_bytes: usize,
    /// What request fields outside the API's table get (`--unknown-fields`).
    pub unknown_fields: fields::UnknownFields,
    /// The model's vocabulary size (token-id prompts and `logit_bias` are checked against it).
    pub vocab: usize,
    /// How the model writes tool calls; `None`: requests with tools are refused.
    pub tool_format: Option<tools::Format>,
    /// How chat answers' thinking is split out (`--reasoning-parser`); `None`: it is not.
    pub reasoning: Option<reasoning::ReasoningParser>,
    /// The config's public prefixes (swapped whole on reload).
    pub public_prefixes: std::sync::RwLock<Arc<crate::normalize::public::PublicPrefixes>>,
    /// Where usage records go (`--usage-db`); `None`: no records, no budgets.
    pub usage: Option<Arc<crate::usage::UsageLog>>,
    /// Request traces exported over OTLP (`--otlp-endpoint`); `None`: a client's traceparent
    /// is passed on, nothing exported.
    pub tracing: Option<Arc<crate::trace::Tracing>>,
    /// The operator store (`[operator]`): tenants changed live through `/operator/v1`.
    pub operator: Option<Arc<operator::OperatorState>>,
    /// Every model of the gateway, this one among them (set once they are all made; none: this
    /// is the only one).
    models: Arc<std::sync::OnceLock<Vec<std::sync::Weak<AppState>>>>,
}

/// How long a request may take at most, unless `--request-timeout` says otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

impl AppState {
    /// The state of a gateway serving `model_id` through `pool`, with the defaults of every
    /// setting the caller then sets from its flags (`request_timeout`, `templates`, …).
    pub fn new(
        pool: Arc<Pool>,
        engine: Option<EngineHandle>,
        tokenizer: TextTokenizer,
        model_id: String,
        max_model_len: usize,
        tenants: TenantRegistry,
    ) -> Self {
        let tenants = Arc::new(std::sync::RwLock::new(Arc::new(tenants)));
        Self::with_tenants(pool, engine, tokenizer, model_id, max_model_len, tenants)
    }

    fn with_tenants(
        pool: Arc<Pool>,
        engine: Option<EngineHandle>,
        tokenizer: TextTokenizer,
        model_id: String,
        max_model_len: usize,
        tenants: Arc<std::sync::RwLock<Arc<TenantRegistry>>>,
    ) -> Self {
        let tokenizer_vocab = tokenizer.vocab_size();
        let tool_format = tokenizer.tools_template().and_then(tools::Format::detect);
        let reasoning = reasoning::ReasoningParser::from_flag("auto", tokenizer.chat_template())
            .expect("auto is a parser name");
        if tokenizer.chat_template().is_some() {
            match tokenizer.chat_layouts() {
                Ok(()) => tracing::info!(
                    "the chat template only copies message contents: prompts render once per conversation layout"
                ),
                Err(why) => tracing::info!(
                    reason = %why,
                    "the chat template renders every prompt (it does more with a message's content than copy it)"
                ),
            }
        }
        AppState {
            prefix_tokens: crate::normalize::tokens::PrefixTokens::new(PREFIX_TOKEN_CACHE_BYTES),
            metrics: Arc::new(metrics::Metrics::new(engine.is_some())),
            pool,
            engine,
            tokenizer,
            max_model_len,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            tenants,
            served_names: vec![model_id.clone()],
            sampling_defaults: Default::default(),
            model_id,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            templates: None,
            metrics_token: None,
            unknown_fields: fields::UnknownFields::Reject,
            max_body_bytes: http::MAX_BODY_BYTES,
            vocab: tokenizer_vocab,
            tool_format,
            reasoning,
            public_prefixes: Default::default(),
            usage: None,
            tracing: None,
            operator: None,
            models: Default::default(),
        }
    }

    /// The state of another model of the same gateway: its own pool, engine, tokenizer, name
    /// and length (the text side read from its tokenizer, as [`AppState::new`] does), this
    /// one's tenants, metrics, usage records, traces, templates and settings.
    pub fn sibling(
        &self,
        pool: Arc<Pool>,
        engine: Option<EngineHandle>,
        tokenizer: TextTokenizer,
        model_id: String,
        max_model_len: usize,
    ) -> Self {
        let mut s = AppState::with_tenants(
            pool,
            engine,
            tokenizer,
            model_id,
            max_model_len,
            self.tenants.clone(),
        );
        s.metrics = self.metrics.clone();
        s.models = self.models.clone();
        s.created = self.created;
        s.request_timeout = self.request_timeout;
        s.templates = self.templates.clone();
        s.metrics_token = self.metrics_token.clone();
        s.unknown_fields = self.unknown_fields;
        s.max_body_bytes = self.max_body_bytes;
        s.usage = self.usage.clone();
        s.tracing = self.tracing.clone();
        s.operator = self.operator.clone();
        s
    }

    /// Makes `states` (siblings, the first the gateway's front) the gateway's models.
    pub fn join(states: &[Arc<AppState>]) {
        let weak = states.iter().map(Arc::downgrade).collect();
        if states[0].models.set(weak).is_err() {
            panic!("the gateway's models are joined once");
        }
    }

    /// Every model of the gateway, in the order given to [`AppState::join`].
    pub fn models(self: &Arc<Self>) -> Vec<Arc<AppState>> {
        match self.models.get() {
            Some(all) => all.iter().filter_map(std::sync::Weak::upgrade).collect(),
            None => vec![self.clone()],
        }
    }

    /// The state of the model a request names, if it is served here under that name and the
    /// tenant may use it (under any of its names).
    pub fn serving(
        self: &Arc<Self>,
        model: &str,
        tenant: &crate::tenants::Tenant,
    ) -> Result<Arc<AppState>, ApiError> {
        // Every request asks: the one-model gateway answers from itself, no list made.
        let names = |m: &AppState| m.served_names.iter().any(|n| n == model);
        let found = match self.models.get() {
            None => names(self).then(|| self.clone()),
            Some(all) => all
                .iter()
                .filter_map(std::sync::Weak::upgrade)
                .find(|m| names(m)),
        };
        let Some(m) = found else {
            return Err(ApiError::not_found(
                format!("model `{model}` does not exist; GET /v1/models lists them"),
                "model_not_found",
            ));
        };
        if !m.served_names.iter().any(|n| tenant.allows_model(n)) {
            return Err(crate::tenants::Denied::ModelNotAllowed {
                tenant: tenant.id().into(),
                model: model.to_string(),
            }
            .into());
        }
        Ok(m)
    }

    /// The current tenant registry.
    pub fn tenants(&self) -> Arc<TenantRegistry> {
        self.tenants.read().expect("tenants lock").clone()
    }

    /// Replaces the tenant registry (config reload). Limits and concurrency counts start afresh.
    pub fn set_tenants(&self, reg: TenantRegistry) {
        *self.tenants.write().expect("tenants lock") = Arc::new(reg);
    }

    /// The current public prefixes.
    pub fn public_prefixes(&self) -> Arc<crate::normalize::public::PublicPrefixes> {
        self.public_prefixes.read().expect("prefixes lock").clone()
    }

    /// Replaces the public prefixes (config reload).
    pub fn set_public_prefixes(&self, p: crate::normalize::public::PublicPrefixes) {
        *self.public_prefixes.write().expect("prefixes lock") = Arc::new(p);
    }

    /// A fresh random number for a response's id (96 bits: unique across restarts and replicas
    /// sharing a usage database, and telling no tenant how busy the gateway is).
    pub fn new_id(&self) -> u128 {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b[..12]).expect("the system's random source");
        u128::from_le_bytes(b)
    }
}

/// Answers one request (its id on the response, see [`request_id`]).
pub async fn handle(state: Arc<AppState>, mut req: Request<Incoming>) -> Response<Body> {
    // The request's id: the client's `x-request-id` where it is a usable one, else a fresh
    // random one; handlers read it from the request, and the response carries it back.
    let request_id = request_id(&state, &req);
    req.headers_mut().insert("x-request-id", request_id.clone());
    let mut response = route(state, req).await;
    response.headers_mut().insert("x-request-id", request_id);
    response
}

/// The client's `x-request-id` if it is 1 to 128 characters of `A-Z a-z 0-9 - _ . :`, else
/// `req_` and 24 random hex digits.
fn request_id(state: &AppState, req: &Request<Incoming>) -> hyper::header::HeaderValue {
    let ok = |v: &&hyper::header::HeaderValue| {
        let b = v.as_bytes();
        (1..=128).contains(&b.len())
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
    };
    match req.headers().get("x-request-id").filter(ok) {
        Some(v) => v.clone(),
        None => hyper::header::HeaderValue::from_str(&format!("req_{:024x}", state.new_id()))
            .expect("hex is a header value"),
    }
}

/// Routes one request.
async fn route(state: Arc<AppState>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    // Anthropic's paths answer errors in Anthropic's shape.
    let anthropic_path = path == "/v1/messages" || path.starts_with("/v1/messages/");
    let result = match (&method, path.as_str()) {
        (&Method::GET, "/health") => Ok(http::json(
            StatusCode::OK,
            &serde_json::json!({"status": "ok"}),
        )),
        (&Method::GET, "/ready") => Ok(ready(&state)),
        (&Method::GET, "/v1/models") => models(&state, &req),
        (&Method::GET, "/v1/usage") => usage::usage(&state, &req).await,
        (&Method::GET, "/metrics") => metrics_allowed(&state, &req).map(|()| {
            let load: Vec<_> = state.models().iter().flat_map(|m| m.pool.load()).collect();
            state.metrics.worker_load(&load);
            if let Some(s) = state.tenants().shared_limits() {
                state.metrics.shared_limits(s);
            }
            if let Some(op) = &state.operator {
                state.metrics.operator(&op.store.status);
            }
            let stats = state.engine.as_ref().map(|e| e.stats());
            http::bytes(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                Bytes::from(state.metrics.render(stats.as_ref())),
            )
        }),
        (&Method::POST, "/v1/chat/completions") => completions::counted(
            &state,
            completions::completion(state.clone(), req, true).await,
        ),
        (&Method::POST, "/v1/completions") => completions::counted(
            &state,
            completions::completion(state.clone(), req, false).await,
        ),
        (&Method::POST, "/v1/responses") => {
            completions::counted(&state, responses::responses(state.clone(), req).await)
        }
        (&Method::POST, "/tokenize") => Box::pin(tokenize::tokenize(state.clone(), req)).await,
        (&Method::POST, "/detokenize") => tokenize::detokenize(state.clone(), req).await,
        (&Method::POST, "/v1/messages/count_tokens") => {
            Box::pin(tokenize::count_tokens(state.clone(), req)).await
        }
        (&Method::POST, "/v1/messages") => {
            return completions::counted(&state, anthropic::messages(state.clone(), req).await)
                .unwrap_or_else(|e| e.anthropic_response());
        }
        // Boxed: administration's state machines are kilobytes, and this future (every
        // request's) would be as large as its largest route.
        (_, p) if p == "/v1/templates" || p.starts_with("/v1/templates/") => {
            Box::pin(templates::admin(state.clone(), req)).await
        }
        (_, p) if p.starts_with("/operator/") => {
            Box::pin(operator::handle(state.clone(), req)).await
        }
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/messages"
            | "/v1/messages/count_tokens"
            | "/v1/responses"
            | "/tokenize"
            | "/detokenize"
            | "/v1/models"
            | "/v1/usage"
            | "/health"
            | "/ready"
            | "/metrics",
        ) => Err(ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            ..ApiError::bad_request(format!("{method} is not allowed on {path}"), None)
        }),
        _ => Err(ApiError::not_found(format!("no route {path}"), "not_found")),
    };
    result.unwrap_or_else(|e| {
        if anthropic_path {
            e.anthropic_response()
        } else {
            e.response()
        }
    })
}

/// `/ready`: 200 when every model served here has a healthy upstream (its loaded engine, a
/// worker whose health check answers, a server whose circuit is closed), else 503 naming the
/// models that have none — what a load balancer's readiness probe should see.
fn ready(state: &Arc<AppState>) -> Response<Body> {
    let models: Vec<(String, usize, usize)> = state
        .models()
        .iter()
        .map(|m| {
            let (healthy, total) = m.pool.healthy_members();
            (m.model_id.clone(), healthy, total)
        })
        .collect();
    let down: Vec<&str> = models
        .iter()
        .filter(|(_, healthy, _)| *healthy == 0)
        .map(|(m, _, _)| m.as_str())
        .collect();
    let upstreams: Vec<serde_json::Value> = models
        .iter()
        .map(|(m, h, t)| serde_json::json!({"model": m, "healthy": h, "upstreams": t}))
        .collect();
    let names: Vec<&str> = models.iter().map(|(m, _, _)| m.as_str()).collect();
    if down.is_empty() {
        http::json(
            StatusCode::OK,
            &serde_json::json!({"status": "ready", "model": state.model_id, "models": names,
                "upstreams": upstreams}),
        )
    } else {
        http::json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": "not ready", "models_without_upstream": down,
                "upstreams": upstreams}),
        )
    }
}

/// `/metrics` names tenants: it answers the operator's token, or, without one configured, the
/// machine itself only.
fn metrics_allowed(state: &AppState, req: &Request<Incoming>) -> Result<(), ApiError> {
    let ok = match &state.metrics_token {
        Some(t) => http::token_matches(http::bearer(req), t),
        None => http::from_loopback(req),
    };
    if ok {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::FORBIDDEN,
        code: Some("metrics_forbidden"),
        ..ApiError::bad_request(
            match &state.metrics_token {
                Some(_) => "/metrics needs the operator's token (--metrics-token) as `Authorization: Bearer <token>`",
                None => "/metrics answers this machine only; start `cachet serve` with --metrics-token to scrape it from elsewhere",
            },
            None,
        )
    })
}

/// Every name of every model the tenant may use.
fn models(state: &Arc<AppState>, req: &Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let tenant = state
        .tenants()
        .authenticate(http::bearer(req).unwrap_or(""))?;
    http::access::tenant(req, tenant.id());
    let mut data: Vec<serde_json::Value> = Vec::new();
    for model in state.models() {
        if !model.served_names.iter().any(|m| tenant.allows_model(m)) {
            continue;
        }
        // vLLM's model card adds the model's length, which clients size requests by.
        data.extend(model.served_names.iter().map(|m| serde_json::json!({"id": m, "object": "model", "created": model.created, "owned_by": "cachet", "max_model_len": model.max_model_len})));
    }
    Ok(http::json(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    ))
}

/// Serves the API on `listener` (through TLS when `tls` is given; each connection on one of
/// `lanes` where given) until `shutdown` turns true, then drains (see [`crate::http::serve`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: watch::Receiver<bool>,
    limits: Limits,
    lanes: Option<Arc<http::lanes::Lanes>>,
) -> std::io::Result<()> {
    let handle = move |req| handle(state.clone(), req);
    http::serve::serve(listener, handle, tls, shutdown, limits, lanes).await
}

#[cfg(test)]
mod future_sizes {
    use super::*;

    fn future_of<A, F>(_: &impl FnOnce(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What hyper holds per request, and what it moves, is the handler's future: as large as
    /// its largest route's state machine if nothing were boxed (10.2 KB measured, copied three
    /// times a request: boxing removed 13% of the gateway's instructions). Administration's
    /// routes, `run` and the shared limits' round trip are boxed; this keeps them so.
    #[test]
    fn a_requests_future_stays_small() {
        type Req = hyper::Request<hyper::body::Incoming>;
        let handle = future_of(&|a: (Arc<AppState>, Req)| handle(a.0, a.1));
        let completion =
            future_of(&|a: (Arc<AppState>, Req)| completions::completion(a.0, a.1, true));
        let admit = future_of(&|t: &'static Arc<crate::tenants::Tenant>| {
            t.admit_request(std::time::Instant::now())
        });
        assert!(handle <= 4096, "handle's future is {handle} bytes");
        assert!(
            completion <= 3072,
            "completion's future is {completion} bytes"
        );
        assert!(admit <= 256, "admission's future is {admit} bytes");
    }
}
