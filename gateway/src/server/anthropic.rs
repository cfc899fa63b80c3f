//! Anthropic's Messages API (`POST /v1/messages`): the request validated field by field
//! against the table (`fields.rs`, Anthropic's names in its errors), then the same path as every
//! other shape (`completions::run`), and the response in Anthropic's shape — a `message` with
//! `text` content, `stop_reason`, `stop_sequence` and usage with `cache_read_input_tokens`, or
//! its stream of named events.

use std::collections::BTreeMap;
use std::sync::Arc;

use cachet_backend::request::{FinishReason, Usage};
use cachet_backend::sampler::RowLogprobs;
use cachet_backend::tokenizer::TextTokenizer;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde::Deserialize;
use serde_json::Value;

use super::fields::{Api, UnknownFields};
use super::openai::{self, Parsed, MAX_KEY_BYTES};
use super::respond::{self, ChoiceOut, Meta, Render, UsageSum};
use super::{completions, AppState};
use crate::http::{self, ApiError, Body};

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: String,
    messages: Vec<MessageIn>,
    max_tokens: Option<u64>,
    system: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: bool,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u64>,
    metadata: Option<BTreeMap<String, Value>>,
    service_tier: Option<String>,
    cache_control: Option<Value>,
    speed: Option<String>,
    output_config: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    content: Value,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// Anthropic's cache marker: `{"type": "ephemeral"}`, with an optional `ttl`.
fn is_cache_control(c: &Value) -> bool {
    c.as_object().is_some_and(|o| {
        o.get("type").and_then(Value::as_str) == Some("ephemeral")
            && o.keys().all(|k| k == "type" || k == "ttl")
    })
}

/// The text of a content field: a string, or `text` blocks (`cache_control` on a block is
/// taken: every prefix is cached anyway). `at` names the field in errors.
fn text_of(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let ty = b.get("type").and_then(Value::as_str);
                let text = b.get("text").and_then(Value::as_str);
                let extra = b.as_object().and_then(|o| {
                    o.keys()
                        .find(|k| !["type", "text", "cache_control"].contains(&k.as_str()))
                });
                match (ty, text, extra) {
                    (Some("text"), Some(t), None)
                        if b.get("cache_control")
                            .is_none_or(|c| c.is_null() || is_cache_control(c)) =>
                    {
                        out.push_str(t)
                    }
                    (Some("text"), _, Some(k)) => {
                        return Err(ApiError::bad_field(
                            format!("{at}[{j}].{k} is not supported on a text block"),
                            format!("{at}[{j}].{k}"),
                        ))
                    }
                    (ty, _, _) => {
                        return Err(ApiError::bad_field(
                            format!(
                                "{at}[{j}]: only `text` blocks are supported, got {}",
                                ty.map_or("a block without a type".to_string(), |t| format!(
                                    "`{t}`"
                                ))
                            ),
                            format!("{at}[{j}]"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad_field(
            format!("{at} must be a string or a list of text blocks"),
            at.to_string(),
        )),
    }
}

/// Parses and validates a Messages body into the request every shape runs as.
pub fn parse(body: &[u8], unknown: UnknownFields) -> Result<Parsed, ApiError> {
    let (r, ignored): (MessagesRequest, _) =
        openai::checked(Api::Messages, http::parse_json(body)?, unknown)?;
    let Some(max_tokens) = r.max_tokens else {
        return Err(ApiError::bad_request(
            "max_tokens: Field required (the Messages API needs the output's limit)",
            Some("max_tokens"),
        ));
    };
    if let Some(t) = r.temperature {
        if !(0.0..=1.0).contains(&t) {
            return Err(ApiError::bad_request(
                format!("temperature must be between 0 and 1, got {t}"),
                Some("temperature"),
            ));
        }
    }
    if r.messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let mut msgs = Vec::with_capacity(r.messages.len() + 1);
    if let Some(s) = &r.system {
        msgs.push(serde_json::json!({"role": "system", "content": text_of(s, "system")?}));
    }
    for (i, m) in r.messages.iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(ApiError::bad_field(
                format!("messages[{i}].role must be `user` or `assistant`, got `{}` (the system prompt goes in `system`)", m.role),
                format!("messages[{i}].role"),
            ));
        }
        if let Some(k) = m.other.keys().next() {
            return Err(ApiError::bad_field(
                format!("messages[{i}].{k} is not supported: a message has `role` and `content`"),
                format!("messages[{i}].{k}"),
            ));
        }
        let text = text_of(&m.content, &format!("messages[{i}].content"))?;
        msgs.push(serde_json::json!({"role": m.role, "content": text}));
    }
    let mut user = None;
    if let Some(md) = &r.metadata {
        for (k, v) in md {
            match (k.as_str(), v) {
                ("user_id", Value::String(u)) if u.len() <= MAX_KEY_BYTES => user = Some(u.clone()),
                ("user_id", Value::Null) => {}
                ("user_id", _) => {
                    return Err(ApiError::bad_field(
                        format!("metadata.user_id is a string of at most {MAX_KEY_BYTES} bytes"),
                        "metadata.user_id",
                    ))
                }
                _ => {
                    return Err(ApiError::bad_field(
                        format!("metadata.{k} is not supported: metadata takes `user_id`"),
                        format!("metadata.{k}"),
                    ))
                }
            }
        }
    }
    if r.service_tier
        .as_deref()
        .is_some_and(|t| t != "auto" && t != "standard_only")
    {
        return Err(ApiError::bad_request(
            "service_tier: there is one tier here; send `auto`, `standard_only` or leave it out",
            Some("service_tier"),
        ));
    }
    if r.speed.as_deref().is_some_and(|s| s != "standard") {
        return Err(ApiError::bad_request(
            "speed: there is one speed here; send `standard` or leave it out",
            Some("speed"),
        ));
    }
    if let Some(c) = &r.cache_control {
        if !c.is_null() && !is_cache_control(c) {
            return Err(ApiError::bad_request(
                "cache_control is {\"type\": \"ephemeral\"} with an optional ttl",
                Some("cache_control"),
            ));
        }
    }
    let mut format = None;
    if let Some(oc) = r.output_config.as_ref().filter(|v| !v.is_null()) {
        let Some(o) = oc.as_object() else {
            return Err(ApiError::bad_request(
                "output_config is an object",
                Some("output_config"),
            ));
        };
        for (k, v) in o {
            match k.as_str() {
                "format" if !v.is_null() => format = openai::response_format(v, "output_config")?,
                "format" => {}
                "effort" if v.is_null() => {}
                _ => {
                    return Err(ApiError::bad_field(
                        format!("output_config.{k} is not supported (the served model has no effort levels)"),
                        format!("output_config.{k}"),
                    ))
                }
            }
        }
    }
    let stops = r.stop_sequences.unwrap_or_default();
    {
        use crate::sandbox::{MAX_STOP_BYTES, MAX_STOP_HINTS};
        if stops.len() > MAX_STOP_HINTS
            || stops
                .iter()
                .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(ApiError::bad_request(
                format!("stop_sequences takes up to {MAX_STOP_HINTS} non-empty strings of at most {MAX_STOP_BYTES} bytes"),
                Some("stop_sequences"),
            ));
        }
    }
    // The same request in OpenAI's chat shape: everything in it has been checked above under
    // Anthropic's names.
    let mut chat = serde_json::json!({
        "model": r.model,
        "messages": msgs,
        "max_tokens": max_tokens,
        "stream": r.stream,
        "temperature": r.temperature.unwrap_or(1.0),
    });
    if let Some(p) = r.top_p {
        chat["top_p"] = p.into();
    }
    if let Some(k) = r.top_k {
        chat["top_k"] = k.into();
    }
    if !stops.is_empty() {
        chat["stop"] = stops.into();
    }
    if let Some(u) = user {
        chat["user"] = u.into();
    }
    if let Some(c) = format {
        chat["structured_outputs"] = super::responses::constraint_json(&c);
    }
    // Anthropic's names where the shared checks name OpenAI's.
    openai::parse_as_chat(chat, ignored, ("stop", "stop_sequences"))
}

/// `POST /v1/messages`; the tenant's id comes back with the result, for counting. Errors are in
/// Anthropic's shape (the caller writes them with [`ApiError::anthropic_response`]).
pub async fn messages(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<(Response<Body>, String), (ApiError, String)> {
    completions::shaped(state, req, |state, body| {
        let parsed = parse(body, state.unknown_fields)?;
        let id = format!("msg_{:024x}", state.next_id());
        Ok((parsed, AnthropicRender::default(), id))
    })
    .await
}

/// Anthropic's `stop_reason`.
fn stop_reason(reason: FinishReason, stop: Option<&str>) -> &'static str {
    match (reason, stop) {
        (FinishReason::Length, _) => "max_tokens",
        (_, Some(_)) => "stop_sequence",
        _ => "end_turn",
    }
}

/// Anthropic's usage: input tokens not read from the cache, those read from it, the output.
fn usage_json(u: &Usage) -> Value {
    serde_json::json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    })
}

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn text_delta(text: &str) -> Vec<String> {
    if text.is_empty() {
        return Vec::new();
    }
    vec![event(
        "content_block_delta",
        serde_json::json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": text}}),
    )]
}

/// A `message`, or its events: message_start, content_block_start, ping, content_block_delta
/// per piece of text, content_block_stop, message_delta (stop reason, usage), message_stop.
#[derive(Default)]
pub struct AnthropicRender {
    usage: Usage,
    stop: Option<(&'static str, Option<String>)>,
}

impl Render for AnthropicRender {
    fn whole(
        &mut self,
        meta: &Meta,
        choices: Vec<ChoiceOut>,
        usage: &UsageSum,
        _tok: &TextTokenizer,
    ) -> Value {
        let c = choices.into_iter().next().expect("one choice");
        let mut u = usage_json(&usage.usage);
        respond::add_timings(&mut u, meta, &usage.timings);
        serde_json::json!({
            "id": meta.id,
            "type": "message",
            "role": "assistant",
            "model": meta.model,
            "content": [{"type": "text", "text": c.text}],
            "stop_reason": stop_reason(c.reason, c.stop_sequence.as_deref()),
            "stop_sequence": c.stop_sequence,
            "usage": u,
        })
    }

    fn start(&mut self, meta: &Meta, _choices: usize) -> Vec<String> {
        vec![
            event(
                "message_start",
                serde_json::json!({"type": "message_start", "message": {
                "id": meta.id, "type": "message", "role": "assistant", "model": meta.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            ),
            event(
                "content_block_start",
                serde_json::json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ),
            event("ping", serde_json::json!({"type": "ping"})),
        ]
    }

    fn token(
        &mut self,
        _meta: &Meta,
        _i: usize,
        text: &str,
        _lp: Option<&RowLogprobs>,
        _tok: &TextTokenizer,
    ) -> Vec<String> {
        text_delta(text)
    }

    fn finish(
        &mut self,
        _meta: &Meta,
        _i: usize,
        rest: &str,
        reason: FinishReason,
        stop: Option<&str>,
        usage: &Usage,
    ) -> Vec<String> {
        self.usage = *usage;
        self.stop = Some((stop_reason(reason, stop), stop.map(str::to_owned)));
        text_delta(rest)
    }

    fn end(&mut self, meta: &Meta, usage: &UsageSum) -> Vec<String> {
        let (reason, seq) = self.stop.take().unwrap_or(("end_turn", None));
        let mut u = usage_json(&usage.usage);
        respond::add_timings(&mut u, meta, &usage.timings);
        vec![
            event(
                "content_block_stop",
                serde_json::json!({"type": "content_block_stop", "index": 0}),
            ),
            event(
                "message_delta",
                serde_json::json!({"type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": u}),
            ),
            event("message_stop", serde_json::json!({"type": "message_stop"})),
        ]
    }

    fn error(&mut self, _meta: &Meta, e: &ApiError) -> Vec<String> {
        vec![event("error", e.anthropic_body())]
    }
}
