//! A completion's response, whatever the API shape: the choices' event streams merged by choice
//! index (`n`, a batch of prompts), the accounting of what they used, and a [`Render`] that
//! writes them as the API does — the whole JSON answer or its server-sent events. OpenAI's chat
//! and completions shapes are here ([`OpenAiRender`]); Anthropic's Messages and OpenAI's
//! Responses shapes sit with their requests (`anthropic`, `responses`).

use std::sync::Arc;
use std::time::Duration;

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

mod meter;
mod openai;
use meter::Meter;
pub use meter::Ticket;
pub use openai::OpenAiRender;

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
            outs.extend(if c.reason == FinishReason::Length {
                p.finish_cut()
            } else {
                p.finish()
            });
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
                            outs.extend(if reason == FinishReason::Length {
                                p.finish_cut()
                            } else {
                                p.finish()
                            });
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
