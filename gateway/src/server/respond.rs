//! A completion's response, whatever the API shape: the choices' event streams merged by choice
//! index (`n`, a batch of prompts), the accounting of what they used, and a [`Render`] that
//! writes them as the API does — the whole JSON answer or its server-sent events. OpenAI's chat
//! and completions shapes are here ([`OpenAiRender`]); Anthropic's Messages and OpenAI's
//! Responses shapes sit with their requests (`anthropic`, `responses`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::request::{EngineEvent, FinishReason, RequestTimings, Usage};
use cachet_backend::sampler::RowLogprobs;
use cachet_backend::tokenizer::TextTokenizer;
use hyper::{Response, StatusCode};
use serde::Serialize;
use tokio::sync::mpsc;

use super::reasoning::ThinkSplitter;
use super::tools::{Call, Format, Out, Parser};
use super::AppState;
use crate::http::{self, ApiError, Body};
use crate::tenants::Permit;
use crate::trace::RequestTrace;
use crate::upstream::Events;

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A request's usage record in the making: written to the usage log when dropped — when the
/// response ends, fails, or the client leaves (status 499 unless set).
pub struct Ticket {
    log: Arc<crate::usage::UsageLog>,
    pub record: crate::usage::Record,
    arrived: Instant,
    first_token: Option<Instant>,
}

impl Ticket {
    /// A record of a request that arrived at `arrived` for `tenant` with the key of sha256
    /// `key_hash`, at `endpoint`.
    pub fn new(
        log: Arc<crate::usage::UsageLog>,
        tenant: &str,
        key_hash: &[u8; 32],
        endpoint: &str,
        model: &str,
        arrived: Instant,
    ) -> Ticket {
        let mut key_id = crate::tenants::hex(key_hash);
        key_id.truncate(12);
        Ticket {
            log,
            record: crate::usage::Record {
                at_ms: crate::usage::now_ms() - arrived.elapsed().as_millis() as i64,
                tenant: tenant.to_string(),
                key_id,
                model: model.to_string(),
                endpoint: endpoint.to_string(),
                status: 499,
                ..Default::default()
            },
            arrived,
            first_token: None,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        self.record.e2e_ms = ms(self.arrived.elapsed());
        self.record.ttft_ms = self.first_token.map(|t| ms(t - self.arrived));
        self.log.record(std::mem::take(&mut self.record));
    }
}

/// What a response has generated, charged to the tenant's token budget exactly once per
/// choice: when the choice finishes (the engine's own count), or — when the client leaves first
/// and the request is cancelled — on drop, for the tokens delivered until then. Holds the
/// tenant's concurrency slot and the request's usage record for as long.
struct Meter {
    permit: Permit,
    /// Per choice: tokens delivered and not yet charged (none once settled).
    delivered: Vec<u64>,
    ticket: Option<Ticket>,
    /// The request's trace, ended with the response (its status; 499 if the client left).
    trace: Option<Arc<RequestTrace>>,
    status: Option<u16>,
    tokens: (u64, u64),
}

impl Meter {
    fn new(
        permit: Permit,
        choices: usize,
        ticket: Option<Ticket>,
        trace: Option<Arc<RequestTrace>>,
    ) -> Self {
        Meter {
            permit,
            delivered: vec![0; choices],
            ticket,
            trace,
            status: None,
            tokens: (0, 0),
        }
    }

    fn token(&mut self, choice: usize) {
        self.delivered[choice] += 1;
        if let Some(t) = &mut self.ticket {
            t.first_token.get_or_insert_with(Instant::now);
        }
    }

    /// The response ended with HTTP status `status` (for its usage record).
    fn ended(&mut self, status: StatusCode) {
        if let Some(t) = &mut self.ticket {
            t.record.status = status.as_u16();
        }
        self.status = Some(status.as_u16());
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
            self.tokens.0 += usage.prompt_tokens as u64;
        }
        self.tokens.1 += usage.completion_tokens as u64;
        if let Some(t) = &self.trace {
            t.engine(timings);
        }
        self.permit
            .tenant()
            .charge_tokens(usage.completion_tokens as u64, Instant::now());
        self.delivered[choice] = 0;
        if let Some(t) = &mut self.ticket {
            if first {
                t.record.prompt_tokens += usage.prompt_tokens as u64;
                t.record.cached_tokens += usage.cached_tokens as u64;
            }
            t.record.completion_tokens += usage.completion_tokens as u64;
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if let Some(t) = &self.trace {
            t.usage(self.tokens.0, self.tokens.1);
            // No status: the client left before the response ended (nginx's 499).
            t.end(self.status.unwrap_or(499));
        }
        let left: u64 = self.delivered.iter().sum();
        if left > 0 {
            self.permit.tenant().charge_tokens(left, Instant::now());
            if let Some(t) = &mut self.ticket {
                t.record.completion_tokens += left;
            }
        }
    }
}

pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Set when the client asked for timings: parsing, template, normalization and
    /// tokenization up to the engine's admission.
    pub prepare: Option<Duration>,
    /// Choices per prompt: choice `i` answers prompt `i / n`.
    pub n: usize,
    /// Unknown fields let through, for the `x-cachet-warning` header.
    pub ignored: Vec<String>,
    /// The output is parsed for tool calls in this format, keeping at most this many.
    pub calls: Option<(Format, usize)>,
    /// The model's thinking is split from its answer (where the render has a place for it).
    pub reasoning: bool,
    /// The request's trace, ended when the response does.
    pub trace: Option<Arc<RequestTrace>>,
}

impl Meta {
    pub fn first_of_prompt(&self, choice: usize) -> bool {
        choice.is_multiple_of(self.n)
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

/// One choice's outcome, for a whole (not streamed) response.
pub struct ChoiceOut {
    /// The answer's text (without its tool calls and its thinking).
    pub text: String,
    /// The model's thinking, when it is split out (`reasoning_content`).
    pub reasoning: Option<String>,
    /// The tool calls it made.
    pub calls: Vec<Call>,
    pub reason: FinishReason,
    /// The stop string that ended the text, if one did.
    pub stop_sequence: Option<String>,
    /// The tokens' log-probabilities, in the order generated (when asked).
    pub logprobs: Vec<RowLogprobs>,
}

/// How an API shape writes a response: the whole JSON body, or its server-sent events frame by
/// frame (each a complete `data:` / `event:` frame).
pub trait Render: Send + 'static {
    fn whole(
        &mut self,
        meta: &Meta,
        choices: Vec<ChoiceOut>,
        usage: &UsageSum,
        tok: &TextTokenizer,
    ) -> Vec<u8>;
    fn start(&mut self, meta: &Meta, choices: usize) -> Vec<String>;
    /// Whether this shape has a place for the model's thinking (then [`Render::reasoning`]
    /// gets it and [`ChoiceOut::reasoning`] holds it); otherwise it stays in the text.
    fn splits_reasoning(&self) -> bool {
        false
    }
    /// Thinking text of choice `i` (streams; only where [`Render::splits_reasoning`]).
    fn reasoning(&mut self, _meta: &Meta, _i: usize, _text: &str) -> Vec<String> {
        Vec::new()
    }
    /// Text a token adds (maybe empty while held back) and its log-probabilities.
    fn token(
        &mut self,
        meta: &Meta,
        i: usize,
        text: &str,
        lp: Option<&RowLogprobs>,
        tok: &TextTokenizer,
    ) -> Vec<String>;
    /// Choice `i` made its `k`-th tool call (streams; after the text before it).
    fn call(&mut self, meta: &Meta, i: usize, k: usize, call: &Call) -> Vec<String>;
    /// A choice ends: the text held back until now, why, and its usage.
    fn finish(
        &mut self,
        meta: &Meta,
        i: usize,
        rest: &str,
        reason: FinishReason,
        stop: Option<&str>,
        usage: &Usage,
    ) -> Vec<String>;
    /// Every choice has ended.
    fn end(&mut self, meta: &Meta, usage: &UsageSum) -> Vec<String>;
    /// The stream breaks.
    fn error(&mut self, meta: &Meta, e: &ApiError) -> Vec<String>;
}

/// The server-side timings when the client asked for them (`cachet_timings`, milliseconds:
/// prepare = parse + template + normalize + tokenize; queue = engine arrival → first scheduled
/// (KV allocation included); prefill = first scheduled → first token; engine_ttft = queue +
/// prefill; e2e and mean inter-token latency in the engine), of the first choice.
#[derive(Serialize)]
pub struct TimingsOut {
    prepare_ms: f64,
    queue_ms: f64,
    prefill_ms: f64,
    engine_ttft_ms: f64,
    engine_e2e_ms: f64,
    mean_itl_ms: f64,
    preemptions: u32,
}

impl TimingsOut {
    fn of(meta: &Meta, t: &RequestTimings) -> Option<TimingsOut> {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        meta.prepare.map(|p| TimingsOut {
            prepare_ms: ms(p),
            queue_ms: ms(t.queue),
            prefill_ms: ms(t.prefill),
            engine_ttft_ms: ms(t.ttft),
            engine_e2e_ms: ms(t.e2e),
            mean_itl_ms: ms(t.mean_itl),
            preemptions: t.preemptions,
        })
    }
}

/// Adds `cachet_timings` to another shape's usage object, when the client asked for them.
pub fn add_timings(v: &mut serde_json::Value, meta: &Meta, t: &RequestTimings) {
    if let Some(t) = TimingsOut::of(meta, t) {
        v["cachet_timings"] = serde_json::to_value(t).expect("numbers write");
    }
}

/// OpenAI's usage object (with the timings when asked).
#[derive(Serialize)]
struct UsageOut {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: CachedOut,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_tokens_details: Option<ReasoningOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cachet_timings: Option<TimingsOut>,
}

#[derive(Serialize)]
struct CachedOut {
    cached_tokens: usize,
}

#[derive(Serialize)]
struct ReasoningOut {
    reasoning_tokens: u64,
}

/// The request's usage over its choices, as OpenAI counts it: each prompt once (and its cached
/// tokens as its first choice found them), every choice's output.
#[derive(Default)]
pub struct UsageSum {
    pub usage: Usage,
    pub timings: RequestTimings,
    /// Output tokens inside the thinking, where it is split from the answer.
    pub reasoning_tokens: Option<u64>,
}

impl UsageSum {
    /// One more output token, in the thinking or not (thinking split out).
    fn count_reasoning(&mut self, thinking: bool) {
        *self.reasoning_tokens.get_or_insert(0) += thinking as u64;
    }
    fn add(&mut self, meta: &Meta, choice: usize, u: &Usage, t: &RequestTimings) {
        if meta.first_of_prompt(choice) {
            self.usage.prompt_tokens += u.prompt_tokens;
            self.usage.cached_tokens += u.cached_tokens;
        }
        self.usage.completion_tokens += u.completion_tokens;
        if choice == 0 {
            self.timings = *t;
        }
    }
    /// OpenAI's usage object (with the timings when asked).
    fn openai(&self, meta: &Meta) -> UsageOut {
        let u = &self.usage;
        UsageOut {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: CachedOut {
                cached_tokens: u.cached_tokens,
            },
            completion_tokens_details: self.reasoning_tokens.map(|n| ReasoningOut {
                reasoning_tokens: n,
            }),
            cachet_timings: TimingsOut::of(meta, &self.timings),
        }
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

/// The choices' events as they arrive, each tagged with its choice index: one choice is read
/// where it is (no task, no channel: the common case costs no hop between threads); several
/// through [`merge`]. Dropped, it drops the streams — cancelling the requests where they run.
enum Choices {
    One(Events),
    Many(mpsc::UnboundedReceiver<(usize, Option<EngineEvent>)>),
}

impl Choices {
    fn new(mut streams: Vec<Events>) -> Choices {
        if streams.len() == 1 {
            Choices::One(streams.pop().expect("one stream"))
        } else {
            Choices::Many(merge(streams))
        }
    }

    async fn recv(&mut self) -> Option<(usize, Option<EngineEvent>)> {
        match self {
            Choices::One(s) => Some((0, s.next().await)),
            Choices::Many(rx) => rx.recv().await,
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

/// The whole response: every choice run to its end, then one JSON body.
pub async fn whole(
    streams: Vec<Events>,
    meta: Meta,
    mut render: impl Render,
    permit: Permit,
    ticket: Option<Ticket>,
    state: &AppState,
) -> Result<Response<Body>, ApiError> {
    let k = streams.len();
    // Dropped with this future when the client leaves: what was generated is charged, and the
    // forwarding tasks cancel every choice.
    let mut meter = Meter::new(permit, k, ticket, meta.trace.clone());
    let status = whole_into(streams, &meta, &mut render, &mut meter, state).await;
    meter.ended(match &status {
        Ok(_) => StatusCode::OK,
        Err(e) => e.status,
    });
    status.map(|body| meta.finish(http::json_bytes(StatusCode::OK, body)))
}

async fn whole_into(
    streams: Vec<Events>,
    meta: &Meta,
    render: &mut impl Render,
    meter: &mut Meter,
    state: &AppState,
) -> Result<Vec<u8>, ApiError> {
    let k = streams.len();
    let mut rx = Choices::new(streams);
    let mut out: Vec<ChoiceOut> = (0..k)
        .map(|_| ChoiceOut {
            text: String::new(),
            reasoning: None,
            calls: Vec::new(),
            reason: FinishReason::Stop,
            stop_sequence: None,
            logprobs: Vec::new(),
        })
        .collect();
    let mut sum = UsageSum::default();
    let split = meta.reasoning && render.splits_reasoning();
    // Each choice's output split as it arrives (counting the thinking's tokens), joined at
    // its end.
    let mut thinks: Vec<Option<(ThinkSplitter, Vec<super::reasoning::Piece>)>> = (0..k)
        .map(|_| split.then(|| (ThinkSplitter::new(), Vec::new())))
        .collect();
    let mut left = k;
    while left > 0 {
        let Some((i, ev)) = rx.recv().await else {
            return Err(ApiError::internal("the engine ended the stream early"));
        };
        match ev {
            Some(EngineEvent::Token { text, logprobs, .. }) => {
                meter.token(i);
                if let Some((t, pieces)) = &mut thinks[i] {
                    let (p, thinking) = t.feed_token(&text);
                    pieces.extend(p);
                    sum.count_reasoning(thinking);
                }
                out[i].logprobs.extend(logprobs);
                out[i].text.push_str(&text)
            }
            Some(EngineEvent::Finished {
                reason,
                usage,
                error,
                text,
                timings,
                stop_sequence,
            }) => {
                meter.settle(state, i, meta.first_of_prompt(i), &usage, &timings);
                if reason == FinishReason::Error {
                    return Err(ApiError::internal(
                        error.unwrap_or_else(|| "engine error".into()),
                    ));
                }
                if let Some((t, pieces)) = &mut thinks[i] {
                    pieces.extend(t.feed(&text));
                }
                out[i].text.push_str(&text);
                out[i].reason = reason;
                out[i].stop_sequence = stop_sequence;
                sum.add(meta, i, &usage, &timings);
                left -= 1;
            }
            None => return Err(ApiError::internal("the engine ended the stream early")),
        }
    }
    for (c, think) in out.iter_mut().zip(thinks) {
        if let Some((t, pieces)) = think {
            let (reasoning, content) = super::reasoning::finish_whole(t, pieces, &c.text);
            c.reasoning = reasoning;
            c.text = content;
        }
    }
    if let Some((format, limit)) = meta.calls {
        for c in &mut out {
            let mut p = Parser::new(format, limit);
            let mut outs = p.feed(&std::mem::take(&mut c.text));
            outs.extend(p.finish());
            for o in outs {
                match o {
                    Out::Text(t) => c.text.push_str(&t),
                    Out::Call(call) => c.calls.push(call),
                }
            }
        }
    }
    Ok(render.whole(meta, out, &sum, &state.tokenizer))
}

/// The streamed response: the render's frames as the choices' events arrive.
pub fn sse(
    streams: Vec<Events>,
    meta: Meta,
    mut render: impl Render,
    permit: Permit,
    ticket: Option<Ticket>,
    state: Arc<AppState>,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let k = streams.len();
    let head = meta.finish(http::streaming("text/event-stream", rx));
    tokio::spawn(async move {
        let mut meter = Meter::new(permit, k, ticket, meta.trace.clone());
        let mut events = Choices::new(streams);
        let mut sum = UsageSum::default();
        let send = |frames: Vec<String>| {
            let tx = tx.clone();
            async move {
                for f in frames {
                    if tx.send(Bytes::from(f)).await.is_err() {
                        return false;
                    }
                }
                true
            }
        };
        if !send(render.start(&meta, k)).await {
            return;
        }
        let mut parsers: Vec<Option<Parser>> = (0..k)
            .map(|_| meta.calls.map(|(f, limit)| Parser::new(f, limit)))
            .collect();
        let split = meta.reasoning && render.splits_reasoning();
        let mut thinks: Vec<Option<ThinkSplitter>> =
            (0..k).map(|_| split.then(ThinkSplitter::new)).collect();
        let mut left = k;
        while left > 0 {
            // A client that leaves is noticed at once (not at the next token): dropping the
            // merged channel cancels every choice, and the meter charges what was generated.
            let ev = tokio::select! {
                ev = events.recv() => ev,
                _ = tx.closed() => return,
            };
            let Some((i, ev)) = ev else {
                meter.ended(StatusCode::INTERNAL_SERVER_ERROR); // the engine ended early
                return;
            };
            match ev {
                Some(EngineEvent::Token { text, logprobs, .. }) => {
                    meter.token(i);
                    // The thinking goes out as such; the answer's text on to the tool parser.
                    let (mut frames, text) = match &mut thinks[i] {
                        None => (Vec::new(), text),
                        Some(t) => {
                            let (pieces, in_thinking) = t.feed_token(&text);
                            sum.count_reasoning(in_thinking);
                            thinking(&mut render, &meta, i, pieces)
                        }
                    };
                    frames.extend(match &mut parsers[i] {
                        None => render.token(&meta, i, &text, logprobs.as_ref(), &state.tokenizer),
                        Some(p) => {
                            let made = p.calls();
                            let outs = p.feed(&text);
                            parsed(
                                &mut render,
                                &meta,
                                i,
                                made,
                                outs,
                                logprobs.as_ref(),
                                &state.tokenizer,
                            )
                        }
                    });
                    if !send(frames).await {
                        return; // client gone: dropping `events` cancels the request
                    }
                }
                Some(EngineEvent::Finished {
                    reason,
                    usage,
                    text,
                    error,
                    timings,
                    stop_sequence,
                }) => {
                    meter.settle(&state, i, meta.first_of_prompt(i), &usage, &timings);
                    if reason == FinishReason::Error {
                        let e = ApiError::internal(error.unwrap_or_default());
                        meter.ended(e.status);
                        send(render.error(&meta, &e)).await;
                        return;
                    }
                    sum.add(&meta, i, &usage, &timings);
                    let (mut frames, text) = match &mut thinks[i] {
                        None => (Vec::new(), text),
                        Some(t) => {
                            let mut pieces = t.feed(&text);
                            pieces.extend(t.finish());
                            thinking(&mut render, &meta, i, pieces)
                        }
                    };
                    let (more, rest) = match &mut parsers[i] {
                        None => (Vec::new(), text),
                        Some(p) => {
                            let made = p.calls();
                            let mut outs = p.feed(&text);
                            outs.extend(p.finish());
                            let f =
                                parsed(&mut render, &meta, i, made, outs, None, &state.tokenizer);
                            (f, String::new())
                        }
                    };
                    frames.extend(more);
                    frames.extend(render.finish(
                        &meta,
                        i,
                        &rest,
                        reason,
                        stop_sequence.as_deref(),
                        &usage,
                    ));
                    if !send(frames).await {
                        return;
                    }
                    left -= 1;
                }
                None => {
                    meter.ended(StatusCode::INTERNAL_SERVER_ERROR);
                    return;
                }
            }
        }
        if send(render.end(&meta, &sum)).await {
            meter.ended(StatusCode::OK);
        }
    });
    head
}

/// The frames of a choice's thinking pieces, and the answer's text among them (joined).
fn thinking(
    render: &mut impl Render,
    meta: &Meta,
    i: usize,
    pieces: Vec<super::reasoning::Piece>,
) -> (Vec<String>, String) {
    let (mut frames, mut text) = (Vec::new(), String::new());
    for p in pieces {
        match p {
            super::reasoning::Piece::Reasoning(r) => frames.extend(render.reasoning(meta, i, &r)),
            super::reasoning::Piece::Content(c) => text.push_str(&c),
        }
    }
    (frames, text)
}

/// The frames of a choice's parsed output: its text pieces and calls in order (`made` calls
/// came before), the token's log-probabilities with the first piece (or alone).
fn parsed(
    render: &mut impl Render,
    meta: &Meta,
    i: usize,
    mut made: usize,
    outs: Vec<Out>,
    mut lp: Option<&RowLogprobs>,
    tok: &TextTokenizer,
) -> Vec<String> {
    let mut frames = Vec::new();
    for o in outs {
        match o {
            Out::Text(t) => frames.extend(render.token(meta, i, &t, lp.take(), tok)),
            Out::Call(c) => {
                frames.extend(render.call(meta, i, made, &c));
                made += 1;
            }
        }
    }
    if lp.is_some() {
        frames.extend(render.token(meta, i, "", lp, tok));
    }
    frames
}

/// OpenAI's `finish_reason`: `tool_calls` when the answer made calls and ended on its own.
fn finish_reason(reason: FinishReason, calls: bool) -> &'static str {
    if calls && reason == FinishReason::Stop {
        "tool_calls"
    } else {
        reason.as_openai()
    }
}

/// OpenAI's chat-completions and completions shapes: `choices` with `message` or `text`,
/// `logprobs` when asked, vLLM's `stop_reason` naming the stop string; streamed as `data:`
/// chunks (a role chunk per chat choice, deltas with their log-probabilities, a finish chunk
/// per choice, usage when asked, `[DONE]`).
pub struct OpenAiRender {
    pub chat: bool,
    pub logprobs: bool,
    pub include_usage: bool,
    /// Echo `service_tier: default` (the request named a tier).
    pub service_tier: bool,
    lps: Vec<LogprobsOut>,
    /// Tool calls made per choice.
    calls: Vec<usize>,
}

impl OpenAiRender {
    pub fn new(chat: bool, logprobs: bool, include_usage: bool, service_tier: bool) -> Self {
        OpenAiRender {
            chat,
            logprobs,
            include_usage,
            service_tier,
            lps: Vec::new(),
            calls: Vec::new(),
        }
    }

    /// A call as chat's `tool_calls` entry (`index` in streamed deltas).
    fn tool_call(meta: &Meta, i: usize, k: usize, c: &Call, index: bool) -> serde_json::Value {
        let mut v = serde_json::json!({
            "id": super::tools::call_id("call_", &meta.id, i, k),
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        });
        if index {
            v["index"] = k.into();
        }
        v
    }
    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat, chunk) {
            (true, false) => "chat.completion",
            (true, true) => "chat.completion.chunk",
            (false, _) => "text_completion",
        }
    }
    fn envelope<'a, C: Serialize>(
        &self,
        meta: &'a Meta,
        chunk: bool,
        choices: C,
        usage: Option<UsageOut>,
    ) -> Envelope<'a, C> {
        Envelope {
            id: &meta.id,
            object: self.object(chunk),
            created: meta.created,
            model: &meta.model,
            choices,
            service_tier: self.service_tier.then_some("default"),
            usage,
        }
    }
    /// A `data:` frame of one chunk of choice `i`.
    fn frame<C: Serialize>(&self, meta: &Meta, choice: C) -> String {
        sse_frame(&self.envelope(meta, true, [choice], None))
    }
    fn chunk(
        &self,
        meta: &Meta,
        i: usize,
        text: &str,
        logprobs: Option<serde_json::Value>,
        finish: Option<(&str, Option<&str>)>,
        role: bool,
    ) -> String {
        let delta = self.chat.then(|| {
            if role {
                Delta {
                    role: Some("assistant"),
                    content: Some(text),
                }
            } else if finish.is_some() && text.is_empty() {
                Delta::default()
            } else {
                Delta {
                    role: None,
                    content: Some(text),
                }
            }
        });
        self.frame(
            meta,
            ChunkChoice {
                index: i,
                delta,
                text: (!self.chat).then_some(text),
                finish_reason: finish.map(|f| f.0),
                stop_reason: finish.map(|f| f.1),
                logprobs: self
                    .logprobs
                    .then(|| logprobs.unwrap_or(serde_json::Value::Null)),
            },
        )
    }
}

/// A `data:` frame of server-sent events holding `v`.
fn sse_frame(v: &impl Serialize) -> String {
    let mut b = b"data: ".to_vec();
    serde_json::to_writer(&mut b, v).expect("the server's own values write as JSON");
    b.extend_from_slice(b"\n\n");
    String::from_utf8(b).expect("JSON is UTF-8")
}

/// OpenAI's response object, whole or a chunk.
#[derive(Serialize)]
struct Envelope<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_tier: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageOut>,
}

/// A choice of a whole response: chat's `message` or completions' `text`.
#[derive(Serialize)]
struct WholeChoice<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<MessageOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    logprobs: serde_json::Value,
    finish_reason: &'static str,
    stop_reason: Option<&'a str>,
}

#[derive(Serialize)]
struct MessageOut<'a> {
    role: &'static str,
    /// Null for a message of tool calls only.
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<serde_json::Value>,
}

/// A choice of a chunk: chat's `delta` or completions' `text`; `stop_reason` with the
/// finish, `logprobs` when asked.
#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<Delta<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    finish_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<serde_json::Value>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

impl Render for OpenAiRender {
    fn whole(
        &mut self,
        meta: &Meta,
        choices: Vec<ChoiceOut>,
        usage: &UsageSum,
        tok: &TextTokenizer,
    ) -> Vec<u8> {
        let out: Vec<WholeChoice> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let logprobs = if self.logprobs {
                    let mut l = LogprobsOut::new(self.chat);
                    c.logprobs.iter().for_each(|lp| l.push(tok, lp));
                    l.take()
                } else {
                    serde_json::Value::Null
                };
                let message = self.chat.then(|| MessageOut {
                    role: "assistant",
                    content: (!c.text.is_empty() || c.calls.is_empty()).then_some(&*c.text),
                    reasoning_content: c.reasoning.as_deref(),
                    tool_calls: c
                        .calls
                        .iter()
                        .enumerate()
                        .map(|(k, call)| Self::tool_call(meta, i, k, call, false))
                        .collect(),
                });
                WholeChoice {
                    index: i,
                    message,
                    text: (!self.chat).then_some(&*c.text),
                    logprobs,
                    finish_reason: finish_reason(c.reason, !c.calls.is_empty()),
                    stop_reason: c.stop_sequence.as_deref(),
                }
            })
            .collect();
        http::to_json(&self.envelope(meta, false, out, Some(usage.openai(meta))))
    }

    fn splits_reasoning(&self) -> bool {
        self.chat
    }

    fn reasoning(&mut self, meta: &Meta, i: usize, text: &str) -> Vec<String> {
        let choice = serde_json::json!({
            "index": i, "delta": {"reasoning_content": text}, "finish_reason": null,
        });
        vec![self.frame(meta, choice)]
    }

    fn start(&mut self, meta: &Meta, choices: usize) -> Vec<String> {
        self.lps = (0..choices).map(|_| LogprobsOut::new(self.chat)).collect();
        self.calls = vec![0; choices];
        if !self.chat {
            return Vec::new();
        }
        (0..choices)
            .map(|i| self.chunk(meta, i, "", None, None, true))
            .collect()
    }

    fn token(
        &mut self,
        meta: &Meta,
        i: usize,
        text: &str,
        lp: Option<&RowLogprobs>,
        tok: &TextTokenizer,
    ) -> Vec<String> {
        let lp = lp.map(|lp| {
            self.lps[i].push(tok, lp);
            self.lps[i].take()
        });
        if text.is_empty() && lp.is_none() {
            return Vec::new();
        }
        vec![self.chunk(meta, i, text, lp, None, false)]
    }

    fn finish(
        &mut self,
        meta: &Meta,
        i: usize,
        rest: &str,
        reason: FinishReason,
        stop: Option<&str>,
        _usage: &Usage,
    ) -> Vec<String> {
        let mut frames = Vec::new();
        if !rest.is_empty() {
            frames.push(self.chunk(meta, i, rest, None, None, false));
        }
        let reason = finish_reason(reason, self.calls[i] > 0);
        frames.push(self.chunk(meta, i, "", None, Some((reason, stop)), false));
        frames
    }

    fn call(&mut self, meta: &Meta, i: usize, k: usize, call: &Call) -> Vec<String> {
        self.calls[i] += 1;
        let delta = serde_json::json!({"tool_calls": [Self::tool_call(meta, i, k, call, true)]});
        let mut choice = serde_json::json!({"index": i, "delta": delta, "finish_reason": null});
        if self.logprobs {
            choice["logprobs"] = serde_json::Value::Null;
        }
        vec![self.frame(meta, choice)]
    }

    fn end(&mut self, meta: &Meta, usage: &UsageSum) -> Vec<String> {
        let mut frames = Vec::new();
        if self.include_usage {
            let none: [(); 0] = [];
            frames.push(sse_frame(&self.envelope(
                meta,
                true,
                none,
                Some(usage.openai(meta)),
            )));
        }
        frames.push("data: [DONE]\n\n".to_string());
        frames
    }

    fn error(&mut self, _meta: &Meta, e: &ApiError) -> Vec<String> {
        vec![format!("data: {}\n\n", e.body())]
    }
}
