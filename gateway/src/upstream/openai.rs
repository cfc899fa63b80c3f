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

use std::borrow::Cow;
use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cachet_backend::block_hash::BlockHash;
use cachet_backend::request::{EngineEvent, EngineRequest, FinishReason, RequestTimings, Usage};
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

/// The `/v1/completions` body an OpenAI-compatible server is sent: OpenAI's fields, then vLLM's
/// extensions only where a request uses them (a server without them is not sent what it would
/// refuse); written straight from the request's fields, with no JSON tree or prompt copy between.
#[derive(serde::Serialize)]
struct CompletionBody<'a> {
    model: &'a str,
    prompt: &'a str,
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    presence_penalty: f32,
    #[serde(skip_serializing_if = "is_zero")]
    frequency_penalty: f32,
    #[serde(
        skip_serializing_if = "<[_]>::is_empty",
        serialize_with = "bias_by_token"
    )]
    logit_bias: &'a [(u32, f32)],
    #[serde(skip_serializing_if = "is_zero_usize")]
    top_k: usize,
    #[serde(skip_serializing_if = "is_zero")]
    min_p: f32,
    #[serde(skip_serializing_if = "is_one")]
    repetition_penalty: f32,
    #[serde(skip_serializing_if = "is_zero_usize")]
    min_tokens: usize,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
    /// Structured outputs: JSON through OpenAI's `response_format`, the rest through vLLM's
    /// `structured_outputs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    structured_outputs: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop: &'a [String],
    /// vLLM's extension; ids of the model's vocabulary, which the gateway's tokenizer shares
    /// with the servers it routes to.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_token_ids: &'a [u32],
    #[serde(skip_serializing_if = "str::is_empty")]
    user: &'a str,
    /// The tenant's salt (never a client's alone): the server keeps tenants' cached prefixes
    /// apart as the gateway's own engines do.
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_salt: Option<String>,
}

#[derive(serde::Serialize)]
struct StreamOptions {
    include_usage: bool,
}

fn is_zero(x: &f32) -> bool {
    *x == 0.0
}

fn is_zero_usize(x: &usize) -> bool {
    *x == 0
}

fn is_one(x: &f32) -> bool {
    *x == 1.0
}

/// OpenAI's `logit_bias`: token ids as the keys of an object.
fn bias_by_token<S: serde::Serializer>(bias: &&[(u32, f32)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(bias.iter().map(|(t, b)| (t.to_string(), b)))
}

/// The completion request `er` makes of the server serving `model`, with the rendered prompt
/// `text`, as JSON (with the tenant's salt as `cache_salt` when `send_cache_salt`).
fn completion_body(model: &str, send_cache_salt: bool, er: &EngineRequest, text: &str) -> Vec<u8> {
    use cachet_backend::grammar::Constraint;
    let p = &er.sampling;
    let (response_format, structured_outputs) = match &er.constraint {
        None => (None, None),
        Some(Constraint::JsonObject) => (Some(serde_json::json!({"type": "json_object"})), None),
        Some(Constraint::JsonSchema(s)) => (
            Some(serde_json::json!({"type": "json_schema",
                "json_schema": {"name": "output", "schema": s, "strict": true}})),
            None,
        ),
        Some(Constraint::Regex(r)) => (None, Some(serde_json::json!({"regex": r}))),
        Some(Constraint::Choice(c)) => (None, Some(serde_json::json!({"choice": c}))),
        Some(Constraint::Lark(g)) => (None, Some(serde_json::json!({"grammar": g}))),
    };
    serde_json::to_vec(&CompletionBody {
        model,
        prompt: text,
        max_tokens: er.max_tokens,
        temperature: p.temperature,
        top_p: p.top_p,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        seed: p.seed,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        logit_bias: &p.logit_bias,
        top_k: p.top_k,
        min_p: p.min_p.max(0.0),
        repetition_penalty: p.repetition_penalty,
        min_tokens: p.min_tokens,
        ignore_eos: er.ignore_eos,
        response_format,
        structured_outputs,
        stop: &er.stop,
        stop_token_ids: &er.stop_token_ids,
        user: &er.tag,
        cache_salt: send_cache_salt.then(|| crate::protocol::hex(&er.salt)),
    })
    .expect("a completion body serialises")
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
            // Valid UTF-8 checked on the fast path (a word at a time), repaired only if not.
            let line = match std::str::from_utf8(&line) {
                Ok(l) => Cow::Borrowed(l),
                Err(_) => String::from_utf8_lossy(&line),
            };
            let Some(data) = line.trim_end_matches('\r').strip_prefix("data:") else {
                continue; // blank separators, comments, event names
            };
            let data = data.trim();
            if data == "[DONE]" {
                let reason = self.finish.unwrap_or(FinishReason::Stop);
                return Some(self.finished(reason, None));
            }
            let chunk: Chunk = match serde_json::from_str(data) {
                Ok(c) => c,
                Err(e) => {
                    return Some(self.failed(format!("a chunk is not a completion chunk: {e}")))
                }
            };
            if let Some(err) = chunk.error {
                let message = match err {
                    ChunkErrorField::Object(e) => e.message,
                    ChunkErrorField::Other(_) => None,
                };
                let msg = message.map_or_else(|| "upstream error".to_string(), |m| m.into_owned());
                return Some(self.finished(FinishReason::Error, Some(msg)));
            }
            if let Some(u) = chunk.usage {
                self.usage = Some(Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    cached_tokens: u.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
                });
            }
            if let Some(c) = chunk.choices.into_iter().flatten().next() {
                if let Some(s) = c.stop_reason {
                    self.stop_sequence = Some(s.into_owned());
                }
                if let Some(r) = c.finish_reason {
                    self.finish = Some(finish_reason(&r));
                }
                let text = c.text.unwrap_or_default();
                if !text.is_empty() {
                    let at = Instant::now();
                    self.first_at.get_or_insert(at);
                    self.last_at = Some(at);
                    self.pieces += 1;
                    self.pending.push_back(EngineEvent::Token {
                        id: 0,
                        text: text.into_owned(),
                        at,
                        logprobs: None,
                    });
                }
            }
        }
    }
}

/// One event of an OpenAI-compatible completion stream: what this client reads of it, typed
/// (text borrowed from the line where it has no escapes; other fields skipped unread). An
/// `error` of any shape is an error; a field of the wrong type inside a choice or the usage
/// reads as absent; `choices` and `usage` must be a list and an object (or null).
#[derive(serde::Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    error: Option<ChunkErrorField<'a>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default, borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
}

/// An error object, or an error of another shape (a bare string), without a message then.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum ChunkErrorField<'a> {
    #[serde(borrow)]
    Object(ChunkError<'a>),
    Other(serde::de::IgnoredAny),
}

#[derive(serde::Deserialize)]
struct ChunkError<'a> {
    #[serde(default, borrow, deserialize_with = "lenient_str")]
    message: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct ChunkUsage {
    #[serde(default, deserialize_with = "lenient_count")]
    prompt_tokens: usize,
    #[serde(default, deserialize_with = "lenient_count")]
    completion_tokens: usize,
    #[serde(default, deserialize_with = "lenient_object")]
    prompt_tokens_details: Option<ChunkCached>,
}

#[derive(serde::Deserialize)]
struct ChunkCached {
    #[serde(default, deserialize_with = "lenient_count")]
    cached_tokens: usize,
}

#[derive(serde::Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default, borrow, deserialize_with = "lenient_str")]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient_str")]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient_str")]
    stop_reason: Option<Cow<'a, str>>,
}

/// The lenient fields' visitors: a value of the type wanted is read; a value of any other type
/// (`null` included) is skipped and reads as `NOTHING`. Written out rather than through an
/// untagged enum, which would buffer every field's value before trying its variants.
macro_rules! nothing_for_other_types {
    () => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Self::NOTHING)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Self::NOTHING)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Self::NOTHING)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Self::NOTHING)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(Self::NOTHING)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(Self::NOTHING)
        }
    };
}

/// Drains an object a lenient field does not take.
fn skip_map<'de, A: serde::de::MapAccess<'de>>(mut a: A) -> Result<(), A::Error> {
    while a
        .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
        .is_some()
    {}
    Ok(())
}

/// A string where the value is one (borrowed where it has no escapes), absent otherwise.
fn lenient_str<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    struct V;
    impl V {
        const NOTHING: Option<Cow<'static, str>> = None;
    }
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any value")
        }
        fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Borrowed(s)))
        }
        fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(s.to_owned())))
        }
        fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(s)))
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
            skip_map(a).map(|_| None)
        }
        nothing_for_other_types!();
    }
    d.deserialize_any(V)
}

/// A token count, 0 where the value is not a whole number.
fn lenient_count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    struct V;
    impl V {
        const NOTHING: usize = 0;
    }
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = usize;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any value")
        }
        fn visit_u64<E>(self, n: u64) -> Result<usize, E> {
            Ok(usize::try_from(n).unwrap_or(0))
        }
        fn visit_str<E>(self, _: &str) -> Result<usize, E> {
            Ok(0)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<usize, A::Error> {
            skip_map(a).map(|_| 0)
        }
        nothing_for_other_types!();
    }
    d.deserialize_any(V)
}

/// `T` where the value is an object, absent otherwise.
fn lenient_object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    struct V<T>(std::marker::PhantomData<T>);
    impl<T> V<T> {
        const NOTHING: Option<T> = None;
    }
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any value")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<Option<T>, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(a)).map(Some)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        nothing_for_other_types!();
    }
    d.deserialize_any(V(std::marker::PhantomData))
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
            let body = Bytes::from(completion_body(
                &self.model,
                self.send_cache_salt,
                er,
                req.text,
            ));
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
                    er.request_id.as_deref(),
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

#[cfg(test)]
mod tests;
