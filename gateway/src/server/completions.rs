//! One completion request, in the order that wastes nothing on a request that will be refused:
//!
//! 1. authenticate the tenant (401);
//! 2. read and validate: the body (400 / 413), the model (404), the tenant's permission for it
//!    (403), every field (400, `param` named);
//! 3. work: the tenant's template (chat), normalization, tokenization (static prefix tokens
//!    cached), the length check (400);
//!    (the tenant's concurrency and requests/min are taken before this step: 429 + Retry-After);
//! 4. admission of the prompt: the tenant's tokens/min (429 + Retry-After);
//! 5. the engine request (tenant salt and priority, the deadline) routed through the pool
//!    (503 + Retry-After when nobody takes it), then the response, whole or streamed.

use std::sync::Arc;
use std::time::Instant;

use cachet_backend::loader::generation::Given;
use cachet_backend::request::EngineRequest;
use hyper::body::Incoming;
use hyper::{Request, Response};

use super::openai::{self, Input, Parsed, PromptIn};
use super::respond::{self, Meta};
use super::{templates, AppState};
use crate::http::{self, ApiError, Body};
use crate::normalize::tokens::TemplateArgs;
use crate::tenants::Tenant;
use crate::trace::RequestTrace;

/// Counts a completion request by tenant and status (errors before authentication count as
/// tenant `-`).
pub fn counted(
    state: &AppState,
    r: Result<(Response<Body>, String), (ApiError, String)>,
) -> Result<Response<Body>, ApiError> {
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

/// A chat or text completion; the tenant's id comes back with the result, for counting.
pub async fn completion(
    state: Arc<AppState>,
    req: Request<Incoming>,
    chat: bool,
) -> Result<(Response<Body>, String), (ApiError, String)> {
    shaped(state, req, move |state, body| {
        let parsed = openai::parse_request(chat, body, state.unknown_fields)?;
        let c = parsed.input.common();
        let render = respond::OpenAiRender::new(
            chat,
            parsed.sampling.logprobs.is_some(),
            c.stream_options.as_ref().is_some_and(|o| o.include_usage),
            c.service_tier.is_some(),
        );
        let id = format!(
            "{}-{:024x}",
            if chat { "chatcmpl" } else { "cmpl" },
            state.new_id()
        );
        Ok((parsed, render, id))
    })
    .await
}

/// A request of any API shape up to its run: the tenant from the API key (401), the body
/// within its limits (413 / 408), `prepare` turning it into the request every shape runs as
/// with the shape's render and the response's id (400s, before any work), then [`run`]. The
/// tenant's id comes back with the result, for counting.
pub async fn shaped<R: respond::Render>(
    state: Arc<AppState>,
    req: Request<Incoming>,
    prepare: impl FnOnce(&AppState, &[u8]) -> Result<(Parsed, R, String), ApiError>,
) -> Result<(Response<Body>, String), (ApiError, String)> {
    let arrived = Instant::now();
    let trace = Arc::new(RequestTrace::start(
        state.tracing.as_deref(),
        req.headers(),
        req.uri().path(),
        arrived,
    ));
    let api_key = http::api_key(&req).unwrap_or("");
    let tenant = state.tenants().authenticate(api_key).map_err(|e| {
        let e: ApiError = e.into();
        trace.end(e.status.as_u16());
        (e, "-".to_string())
    })?;
    trace.phase("auth", arrived, Instant::now());
    let seen = crate::http::access::Seen::of(&req);
    if let Some(s) = &seen {
        s.tenant(tenant.id());
    }
    trace.attributes(|| {
        [opentelemetry::KeyValue::new(
            "cachet.tenant",
            tenant.id().to_string(),
        )]
    });
    let name = tenant.id().to_string();
    // The request's usage record, written when it ends (also if the client leaves).
    let mut ticket = state.usage.as_ref().map(|log| {
        respond::Ticket::new(
            log.clone(),
            &name,
            &crate::tenants::hash_key(api_key),
            req.uri().path(),
            &state.model_id,
            arrived,
        )
    });
    // `x-cachet-timings: 1` asks for the server-side split of the request's time in its usage.
    let want_timings = req.headers().contains_key("x-cachet-timings");
    // Set by the router from the client's, or made there.
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let result = async {
        let body = http::read_body(req, state.max_body_bytes).await?;
        let (parsed, render, id) = prepare(&state, &body)?;
        drop(body);
        if let Some(t) = &mut ticket {
            t.record.request_id = id.clone();
        }
        // Boxed, as the handler's future moves: `run`'s state machine is kilobytes.
        Box::pin(run(
            state.clone(),
            tenant,
            parsed,
            render,
            Arrival {
                id,
                at: arrived,
                want_timings,
                trace: trace.clone(),
                request_id,
                seen,
            },
            &mut ticket,
        ))
        .await
    }
    .await;
    // Refused before it ran: the record and the trace say why.
    if let Err(e) = &result {
        trace.end(e.status.as_u16());
        if let Some(t) = &mut ticket {
            t.record.status = e.status.as_u16();
        }
    }
    drop(ticket);
    result.map(|r| (r, name.clone())).map_err(|e| (e, name))
}

/// A request's id and arrival, for [`run`].
pub struct Arrival {
    /// The response's id.
    pub id: String,
    pub at: Instant,
    /// The client asked for the server-side timings (`x-cachet-timings`).
    pub want_timings: bool,
    /// The request's trace (its span, and the context passed on to upstreams).
    pub trace: Arc<RequestTrace>,
    /// Its `x-request-id`, passed on to upstreams.
    pub request_id: Option<String>,
    /// What its access line says of it.
    pub seen: Option<Arc<crate::http::access::Seen>>,
}

/// The tenant has budget left this period (requests already admitted run to their end).
fn check_budget(state: &AppState, tenant: &Tenant) -> Result<(), ApiError> {
    let (Some(log), Some(usd)) = (&state.usage, tenant.config.budget_usd) else {
        return Ok(());
    };
    let period = tenant
        .config
        .budget_period
        .unwrap_or(crate::usage::Period::Month);
    let b = log.budget(tenant.id(), usd, period);
    if b.spent_usd < usd {
        return Ok(());
    }
    let left = (b.resets_at - crate::usage::now_ms() / 1000).max(1) as u64;
    Err(crate::tenants::Denied::OverBudget {
        tenant: tenant.id().into(),
        spent: b.spent_usd,
        budget: usd,
        period: period.name(),
        retry_after: std::time::Duration::from_secs(left),
    }
    .into())
}

/// A validated request of any API shape, from the tenant's admission to its response: the
/// same template, normalization, tokenization, admission, routing and accounting whatever
/// shape it came in and goes out in (`render`).
pub async fn run(
    state: Arc<AppState>,
    tenant: Arc<Tenant>,
    parsed: Parsed,
    render: impl respond::Render,
    arrival: Arrival,
    ticket: &mut Option<respond::Ticket>,
) -> Result<Response<Body>, ApiError> {
    let Arrival {
        id,
        at: arrived,
        want_timings,
        trace,
        request_id,
        seen,
    } = arrival;
    let Parsed {
        input,
        max_tokens,
        mut stop,
        mut sampling,
        stop_token_ids,
        n,
        ignored,
        mut constraint,
        tools,
    } = parsed;
    let chat = matches!(input, Input::Chat(..));
    // From here on, the state of the model the request names.
    let state = state.serving(&input.common().model, &tenant)?;
    if let Some(s) = &seen {
        s.model(&state.model_id);
    }
    trace.attributes(|| {
        [opentelemetry::KeyValue::new(
            "gen_ai.request.model",
            state.model_id.clone(),
        )]
    });
    if let Some(t) = ticket.as_mut() {
        t.record.model = state.model_id.clone();
    }
    let c = input.common();
    state.sampling_defaults.fill(
        &mut sampling,
        Given {
            temperature: c.temperature.is_some(),
            top_p: c.top_p.is_some(),
            top_k: c.top_k.is_some(),
            min_p: c.min_p.is_some(),
            repetition_penalty: c.repetition_penalty.is_some(),
        },
    );
    check_budget(&state, &tenant)?;
    let (template_tools, calls) = tool_plan(&state, tools.as_ref(), &mut constraint)?;
    // The tenant's concurrency and requests/min, before any work is done for the request (its
    // template included); the tokens/min budget once the prompt is known.
    let mut permit = tenant
        .admit_request(Instant::now())
        .await
        .map_err(|d| limited(tenant.refused_limits(&d, Instant::now()), d))?;
    // 3. Template, normalization, tokenization: each prompt as token ids (engines) and as text
    // (OpenAI-compatible upstreams).
    let Prompts {
        common,
        prompts,
        hints,
        fill,
    } = prompts_of(&state, &tenant, input, template_tools, true, &trace).await?;
    let max_tokens = output_budget(
        &state, &prompts, chat, max_tokens, hints, &mut stop, &sampling,
    )?;
    // 4. Admission of the prompts' tokens (each prompt once, whatever `n`); only an admitted
    // request's prefix tokens are cached.
    let prompt_tokens: usize = prompts.iter().map(|p| p.0.len()).sum();
    permit
        .charge_prompt(prompt_tokens as u64, Instant::now())
        .map_err(|d| limited(permit.rate_limits(Instant::now()), d))?;
    // What the response reports of the tenant's buckets (OpenAI's `x-ratelimit-*`).
    let limits = permit.rate_limits(Instant::now()).headers();
    if let Some(f) = fill {
        state.prefix_tokens.fill(f);
    }
    // 5. The engine requests — `n` per prompt, routed together to one upstream, where the
    // prefix cache shares the prompt's blocks: the first choice's full blocks are registered
    // when its prefill is scheduled, so the others compute only the last partial block.
    let template = EngineRequest {
        sampling,
        stop,
        stop_token_ids,
        salt: common.salt(&tenant.salt),
        priority: tenant.config.priority,
        share: tenant.config.share,
        tag: tenant.id().to_string(),
        ignore_eos: common.ignore_eos,
        deadline: Some(arrived + state.request_timeout),
        constraint,
        trace_parent: trace.traceparent().map(str::to_string),
        request_id,
        ..EngineRequest::new(Vec::new(), max_tokens as usize)
    };
    let streams = submit(&state, &common, prompts, n, &template, &trace, ticket).await?;
    let meta = Meta {
        id,
        created: respond::now_unix(),
        model: state.model_id.clone(),
        prepare: want_timings.then(|| arrived.elapsed()),
        n,
        ignored,
        calls,
        reasoning: chat && state.reasoning.is_some(),
        trace: Some(trace),
    };
    let mut response = if common.stream {
        respond::sse(streams, meta, render, permit, ticket.take(), state.clone())
    } else {
        respond::whole(streams, meta, render, permit, ticket.take(), &state).await?
    };
    http::add_headers(&mut response, &limits);
    Ok(response)
}

/// A refusal by the tenant's limits, with what its buckets hold (`x-ratelimit-*`).
fn limited(limits: crate::tenants::rate_limit::RateLimits, d: crate::tenants::Denied) -> ApiError {
    ApiError {
        headers: limits.headers().into(),
        ..d.into()
    }
}

/// The tools the template renders, and the format and count of the calls parsed out.
type ToolPlan = (
    Option<serde_json::Value>,
    Option<(super::tools::Format, usize)>,
);

/// What the request's tools ask of the template and of the output: the tools the template
/// renders, the format and number of calls the output is parsed for, and (`required` or a named
/// function) the grammar the output follows.
pub(super) fn tool_plan(
    state: &AppState,
    tools: Option<&super::tools::Tools>,
    constraint: &mut Option<cachet_backend::grammar::Constraint>,
) -> Result<ToolPlan, ApiError> {
    // Tools: the model must have a way to see them and to call, and `required` or a named
    // function is a grammar on the output.
    let template_tools = tools.and_then(|t| t.template_tools());
    if let Some(v) = &template_tools {
        super::tools::check_markup(v, &state.tokenizer, openai::CHAT_TOOLS)?;
    }
    let mut calls = None;
    if let Some(t) = tools {
        if t.parses() {
            let Some(format) = state.tool_format else {
                return Err(ApiError::bad_request(
                    format!(
                        "model `{}` is served without tool calls: its chat template renders no tools (the host can give it one with --chat-template); leave `tools` out or send tool_choice `none`",
                        state.model_id
                    ),
                    Some("tools"),
                ));
            };
            if let Some(c) = t.constraint(format, &state.tokenizer) {
                *constraint = Some(c);
            }
            calls = Some((format, t.call_limit()));
        }
    }
    Ok((template_tools, calls))
}

/// A request's prompts, ready for the engine: its common fields, each prompt as token ids
/// (engines) and text (OpenAI-compatible upstreams), the template's hints (stop strings, an
/// output cap) and the prefix tokens to cache once admitted.
pub(super) struct Prompts {
    common: openai::Common,
    pub(super) prompts: Vec<(Vec<u32>, String)>,
    hints: Option<(Vec<String>, Option<u32>)>,
    fill: Option<([u8; 32], Arc<Vec<u32>>)>,
}

/// The tenant's template (or the model's), normalization and tokenization of `input`.
pub(super) async fn prompts_of(
    state: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    input: Input,
    template_tools: Option<serde_json::Value>,
    generation_prompt: bool,
    trace: &RequestTrace,
) -> Result<Prompts, ApiError> {
    let mut hints = None;
    let mut fill = None;
    let (common, prompts) = match input {
        Input::Chat(r, msgs) => {
            let segments = match templates::template_for(tenant, &r) {
                Some(name) => {
                    let t0 = Instant::now();
                    let applied =
                        templates::apply(state, tenant, &name, templates::input(tenant, &r, msgs))
                            .await?;
                    trace.phase("template", t0, Instant::now());
                    hints = Some((applied.rendered.stop, applied.rendered.max_tokens));
                    applied.rendered.segments
                }
                None => crate::normalize::chat_segments(&msgs),
            };
            let args = OwnedArgs {
                tools: template_tools,
                kwargs: r.template_kwargs()?,
                generation_prompt,
            };
            let p = prepare_owned(
                state,
                tenant,
                r.common.salt(&tenant.salt),
                segments,
                args,
                trace,
            )
            .await?;
            fill = p.fill;
            (r.common, vec![(p.ids, p.prompt)])
        }
        Input::Text(r, ps) => {
            // Large prompts off the serving lane, as prepare_owned does for chats.
            let size: usize = ps
                .iter()
                .map(|p| match p {
                    PromptIn::Text(t) => t.len(),
                    PromptIn::Tokens(ids) => ids.len() * 4,
                })
                .sum();
            let t0 = Instant::now();
            let prompts = if size <= PREPARE_INLINE_BYTES {
                text_prompts(state, ps)?
            } else {
                let s = state.clone();
                tokio::task::spawn_blocking(move || text_prompts(&s, ps))
                    .await
                    .map_err(|e| {
                        ApiError::internal(format!("tokenizing the prompt failed: {e}"))
                    })??
            };
            trace.phase("tokenize", t0, Instant::now());
            (r.common, prompts)
        }
    };
    Ok(Prompts {
        common,
        prompts,
        hints,
        fill,
    })
}

/// The tokens this request may generate: `max_tokens` (or all the room left, at most 1024)
/// under the template's cap, checked against the model's length after the longest prompt;
/// the template's stop strings added to `stop`. Refused with the field to fix.
fn output_budget(
    state: &AppState,
    prompts: &[(Vec<u32>, String)],
    chat: bool,
    max_tokens: Option<u64>,
    hints: Option<(Vec<String>, Option<u32>)>,
    stop: &mut Vec<String>,
    sampling: &cachet_backend::sampler::SamplingParams,
) -> Result<u64, ApiError> {
    if let Some(&(t, _)) = sampling
        .logit_bias
        .iter()
        .find(|(t, _)| *t as usize >= state.vocab)
    {
        return Err(ApiError::bad_request(
            format!(
                "logit_bias names token {t}, outside the vocabulary of {}",
                state.vocab
            ),
            Some("logit_bias"),
        ));
    }
    // The template's hints: more stop strings, and a cap on the output (the sandbox held them to
    // the API's limits).
    let mut cap = None;
    if let Some((extra, max_hint)) = hints {
        for s in extra {
            if !s.is_empty() && !stop.contains(&s) {
                stop.push(s);
            }
        }
        cap = max_hint.map(u64::from);
    }
    // Every prompt must leave room for the output; max_tokens must fit after the longest.
    let longest = prompts.iter().map(|p| p.0.len()).max().unwrap_or(0);
    let room = state.max_model_len.saturating_sub(longest) as u64;
    let field = if chat { "messages" } else { "prompt" };
    if room == 0 {
        return Err(ApiError::bad_request(
            format!(
                "the prompt has {longest} tokens; `{}` takes at most {} (its max_model_len, listed by GET /v1/models)",
                state.model_id, state.max_model_len
            ),
            Some(field),
        ));
    }
    if let Some(m) = max_tokens.filter(|&m| m > room) {
        return Err(ApiError::bad_request(
            format!(
                "max_tokens is {m}, but the prompt has {longest} tokens of the {} `{}` takes (its max_model_len): at most {room} can be generated",
                state.max_model_len, state.model_id
            ),
            Some("max_tokens"),
        ));
    }
    let max_tokens = max_tokens.unwrap_or(room.min(1024));
    let max_tokens = cap.map_or(max_tokens, |c| max_tokens.min(c.max(1)));
    if sampling.min_tokens as u64 > max_tokens {
        return Err(ApiError::bad_request(
            format!(
                "min_tokens ({}) is more than the {max_tokens} tokens this request may generate",
                sampling.min_tokens
            ),
            Some("min_tokens"),
        ));
    }
    Ok(max_tokens)
}

/// The engine requests of each prompt — `n` copies of `template` — routed as one group and
/// handed to the chosen engine or worker; their event streams, in order.
async fn submit(
    state: &Arc<AppState>,
    common: &openai::Common,
    prompts: Vec<(Vec<u32>, String)>,
    n: usize,
    template: &EngineRequest,
    trace: &RequestTrace,
    ticket: &mut Option<respond::Ticket>,
) -> Result<Vec<crate::upstream::Events>, ApiError> {
    // A client that sent its own `cache_salt` asked to share with no one: no public blocks.
    let public = state.public_prefixes();
    let mut streams = Vec::with_capacity(prompts.len() * n);
    for (ids, text) in prompts {
        let public_blocks = match public.part_of(&ids).filter(|_| common.cache_salt.is_none()) {
            Some(part) => {
                state.metrics.public_prefix(part.name, part.blocks);
                part.blocks
            }
            None => 0,
        };
        let ers: Vec<EngineRequest> = (0..n)
            .map(|j| {
                let mut er = template.clone();
                er.prompt = ids.clone();
                er.sampling.seed = template.sampling.seed.map(|s| choice_seed(s, j));
                er.public_blocks = public_blocks;
                er
            })
            .collect();
        // Routing, and handing the group to the chosen engine or worker (up to its response
        // head); the engine's timings count from here.
        let t0 = Instant::now();
        trace.sent();
        let (evs, routed) = state
            .pool
            .submit_group(&ers, &text, common.session_key())
            .await?;
        trace.phase("route", t0, Instant::now());
        trace.attributes(|| {
            [opentelemetry::KeyValue::new(
                "cachet.upstream",
                routed.upstream.clone(),
            )]
        });
        state.metrics.routed(
            state.pool.policy_name(),
            routed.reason,
            &routed.upstream,
            routed.predicted_cached_tokens,
        );
        if let Some(t) = ticket {
            t.record.route = Some(routed.upstream.clone());
        }
        streams.extend(evs);
    }
    Ok(streams)
}

/// The seed of choice `j` of a request seeded `seed`: choice 0 keeps it (so it equals the
/// request with `n` = 1), the others get their own streams of draws.
pub fn choice_seed(seed: u64, j: usize) -> u64 {
    if j == 0 {
        return seed;
    }
    let mut h = blake3::Hasher::new();
    h.update(b"cachet choice seed");
    h.update(&seed.to_le_bytes());
    h.update(&(j as u64).to_le_bytes());
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8 bytes"))
}

/// [`TemplateArgs`] owned, for the blocking pool.
struct OwnedArgs {
    tools: Option<serde_json::Value>,
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    generation_prompt: bool,
}

impl OwnedArgs {
    fn borrow(&self) -> TemplateArgs<'_> {
        TemplateArgs {
            tools: self.tools.as_ref(),
            kwargs: self.kwargs.as_ref(),
            generation_prompt: self.generation_prompt,
        }
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
    /// The prefix's tokens for the tenant's cache, filled once the request is admitted.
    pub fill: Option<([u8; 32], std::sync::Arc<Vec<u32>>)>,
}

/// Normalizes `segments` under the tenant's rules, renders them (and `tools`) with the chat
/// template, and tokenizes — message text with special tokens as plain text, the static
/// prefix's tokens from the tenant's cache.
pub fn prepare(
    state: &AppState,
    tenant: &Tenant,
    salt: &[u8; 32],
    segments: &[cachet_guest_sdk::Segment],
    args: TemplateArgs<'_>,
    trace: Option<&RequestTrace>,
) -> Result<Prepared, ApiError> {
    let (p, times) = prepare_timed(state, tenant, salt, segments, args)?;
    if let Some(t) = trace {
        trace_prepare(t, times);
    }
    Ok(p)
}

/// The phases of [`prepare_timed`]'s instants on the request's trace.
fn trace_prepare(trace: &RequestTrace, [start, tokenize, end]: [Instant; 3]) {
    trace.phase("normalize", start, tokenize);
    trace.phase("tokenize", tokenize, end);
}

/// A completion request's prompts as (token ids, text): text tokenized, token ids checked
/// against the vocabulary and decoded.
fn text_prompts(state: &AppState, ps: Vec<PromptIn>) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    ps.into_iter()
        .map(|p| match p {
            PromptIn::Text(t) => Ok((state.tokenizer.encode_prompt(&t)?, t)),
            PromptIn::Tokens(ids) => {
                if let Some(&t) = ids.iter().find(|&&t| t as usize >= state.vocab) {
                    return Err(ApiError::bad_request(
                        format!(
                            "token id {t} in the prompt is outside the vocabulary of {}",
                            state.vocab
                        ),
                        Some("prompt"),
                    ));
                }
                let text = state.tokenizer.decode(&ids, false)?;
                Ok((ids, text))
            }
        })
        .collect()
}

/// Prompts with more text than this are prepared on the blocking pool. A serving lane runs all
/// its connections' requests on one thread (`--io-threads`), and a long prompt's normalization
/// and tokenization (about 0.7 µs a byte on one core through the tokenizers pipeline: a 500 KB
/// message takes 0.3 s; ASCII text of a byte-level BPE vocabulary about a tenth of that) would
/// hold every other request on the lane for that long; below it the hand-off costs more than it
/// saves. Sized for the slow path: the text's bytes decide, not which path it will take.
const PREPARE_INLINE_BYTES: usize = 16 << 10;

/// The length of `v` as JSON text, counted as it is written (no string is kept).
fn json_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).expect("a JSON value writes");
    c.0
}

/// [`prepare`] for a request that owns its inputs: inline when they are small, on the blocking
/// pool when they are not ([`PREPARE_INLINE_BYTES`]).
async fn prepare_owned(
    state: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    salt: [u8; 32],
    segments: Vec<cachet_guest_sdk::Segment>,
    args: OwnedArgs,
    trace: &RequestTrace,
) -> Result<Prepared, ApiError> {
    let text: usize = segments.iter().map(|s| s.text.len()).sum();
    let tools_len = args.tools.as_ref().map_or(0, json_len);
    if text + tools_len <= PREPARE_INLINE_BYTES {
        return prepare(state, tenant, &salt, &segments, args.borrow(), Some(trace));
    }
    let (state, tenant) = (state.clone(), tenant.clone());
    let (p, times) = tokio::task::spawn_blocking(move || {
        prepare_timed(&state, &tenant, &salt, &segments, args.borrow())
    })
    .await
    .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))??;
    trace_prepare(trace, times);
    Ok(p)
}

/// [`prepare`], with the instants normalization started, tokenization started and it ended.
fn prepare_timed(
    state: &AppState,
    tenant: &Tenant,
    salt: &[u8; 32],
    segments: &[cachet_guest_sdk::Segment],
    args: TemplateArgs<'_>,
) -> Result<(Prepared, [Instant; 3]), ApiError> {
    let kwargs = args.kwargs;
    // Template variables render as markup (control tokens recognised): none may carry one.
    if let Some(k) = kwargs {
        let v = serde_json::Value::Object(k.clone());
        if let Some(s) = super::tools::control_token_in(&v, &state.tokenizer) {
            return Err(ApiError::bad_request(
                format!(
                    "chat_template_kwargs contain the model's control token `{s}`; take it out"
                ),
                Some("chat_template_kwargs"),
            ));
        }
    }
    let t0 = Instant::now();
    let n = crate::normalize::normalize(segments, &tenant.rules);
    let (messages, first_dynamic) = crate::normalize::to_messages(&n.segments);
    let r =
        crate::normalize::tokens::render(&state.tokenizer, salt, &messages, args, first_dynamic)?;
    let t1 = Instant::now();
    let enc = state.prefix_tokens.encode(&state.tokenizer, &r, salt)?;
    let t2 = Instant::now();
    state
        .metrics
        .normalized(tenant.id(), n.relocated.len(), enc.stable_tokens);
    Ok((
        Prepared {
            segments: n.segments,
            relocated: n.relocated,
            prompt: r.text,
            ids: enc.ids,
            stable_tokens: enc.stable_tokens,
            fill: enc.fill,
        },
        [t0, t1, t2],
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_len_counts_what_to_string_would_write() {
        let v = serde_json::json!([{"type": "function", "function": {"name": "f\"x", "parameters": {"a": [1, 2.5, null]}}}]);
        assert_eq!(super::json_len(&v), v.to_string().len());
    }
}
