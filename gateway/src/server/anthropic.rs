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
use super::openai::{self, MessageIn, Parsed, MAX_KEY_BYTES};
use super::respond::{self, ChoiceOut, Meta, Render, UsageSum};
use super::tools::{self, Call};
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
    tools: Option<Value>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
}

/// Anthropic's cache marker: `{"type": "ephemeral"}`, with an optional `ttl`.
fn is_cache_control(c: &Value) -> bool {
    c.as_object().is_some_and(|o| {
        o.get("type").and_then(Value::as_str) == Some("ephemeral")
            && o.keys().all(|k| k == "type" || k == "ttl")
    })
}

/// The text of one `text` block (`cache_control` on it is taken: every prefix is cached
/// anyway); `at` names the block in errors.
fn text_block(b: &Value, at: &str) -> Result<String, ApiError> {
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
            Ok(t.to_string())
        }
        (Some("text"), _, Some(k)) => Err(ApiError::bad_field(
            format!("{at}.{k} is not supported on a text block"),
            format!("{at}.{k}"),
        )),
        (ty, _, _) => Err(ApiError::bad_field(
            format!(
                "{at}: only `text` blocks are supported, got {}",
                ty.map_or("a block without a type".to_string(), |t| format!("`{t}`"))
            ),
            at.to_string(),
        )),
    }
}

/// The text of a content field: a string, or `text` blocks. `at` names the field in errors.
fn text_of(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(j, b)| text_block(b, &format!("{at}[{j}]")))
            .collect(),
        _ => Err(ApiError::bad_field(
            format!("{at} must be a string or a list of text blocks"),
            at.to_string(),
        )),
    }
}

/// One Messages message as chat messages: `text` blocks are its text; an assistant's
/// `tool_use` blocks its tool calls; a user's `tool_result` blocks one `tool` message each
/// (before the rest of its text, as the results answer the turn before).
fn chat_messages(role: &str, content: &Value, i: usize) -> Result<Vec<Value>, ApiError> {
    let at = format!("messages[{i}].content");
    let Value::Array(blocks) = content else {
        return Ok(vec![
            serde_json::json!({"role": role, "content": text_of(content, &at)?}),
        ]);
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut thinking = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let field = |k: &str| b.get(k).filter(|v| !v.is_null());
        let only = |keys: &[&str]| -> Result<(), ApiError> {
            match b.as_object().and_then(|o| {
                o.keys()
                    .find(|k| !keys.contains(&k.as_str()) && *k != "cache_control")
            }) {
                Some(k) => Err(ApiError::bad_field(
                    format!("{here}.{k} is not supported on this block"),
                    format!("{here}.{k}"),
                )),
                None => Ok(()),
            }
        };
        match (b.get("type").and_then(Value::as_str), role) {
            (Some("tool_use"), "assistant") => {
                only(&["type", "id", "name", "input"])?;
                let (Some(id), Some(name), Some(input)) = (
                    field("id").and_then(Value::as_str),
                    field("name").and_then(Value::as_str),
                    field("input").filter(|v| v.is_object()),
                ) else {
                    return Err(ApiError::bad_field(
                        format!("{here}: a tool_use block has an `id`, a `name` and an `input` object"),
                        here,
                    ));
                };
                calls.push(serde_json::json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            (Some("tool_result"), "user") => {
                only(&["type", "tool_use_id", "content", "is_error"])?;
                let Some(id) = field("tool_use_id").and_then(Value::as_str) else {
                    return Err(ApiError::bad_field(
                        format!("{here}: a tool_result block names its `tool_use_id`"),
                        format!("{here}.tool_use_id"),
                    ));
                };
                let out = match field("content") {
                    None => String::new(),
                    Some(c) => text_of(c, &format!("{here}.content"))?,
                };
                // The model is told a call failed the way Anthropic's prompt format does not
                // say: in the result's text.
                let out = match field("is_error").map(|e| e.as_bool()) {
                    None | Some(Some(false)) => out,
                    Some(Some(true)) => format!("Error: {out}"),
                    Some(None) => {
                        return Err(ApiError::bad_field(
                            format!("{here}.is_error is true or false"),
                            format!("{here}.is_error"),
                        ))
                    }
                };
                results.push(serde_json::json!({"role": "tool", "tool_call_id": id, "content": out}));
            }
            (Some("tool_use" | "tool_result"), _) => {
                return Err(ApiError::bad_field(
                    format!("{here}: tool_use blocks come from the assistant, tool_result blocks from the user"),
                    here,
                ))
            }
            // An earlier answer's thinking, sent back as the API returned it: the message's
            // `reasoning_content`, which the chat template keeps or drops (Qwen3 keeps it for
            // the turns after the last user message, a tool loop's, as Anthropic does).
            (Some("thinking"), "assistant") => {
                only(&["type", "thinking", "signature"])?;
                if let Some(t) = field("thinking").and_then(Value::as_str) {
                    thinking.push(t);
                }
            }
            (Some("redacted_thinking"), "assistant") => only(&["type", "data"])?,
            (Some("thinking" | "redacted_thinking"), _) => {
                return Err(ApiError::bad_field(
                    format!("{here}: thinking blocks come from the assistant"),
                    here,
                ))
            }
            _ => text.push(text_block(b, &here)?),
        }
    }
    let text = text.concat();
    let mut out = results;
    if !calls.is_empty() {
        out.push(serde_json::json!({"role": role, "content": text, "tool_calls": calls}));
    } else if !text.is_empty() || !thinking.is_empty() || out.is_empty() {
        out.push(serde_json::json!({"role": role, "content": text}));
    }
    if !thinking.is_empty() {
        if let Some(m) = out.last_mut() {
            m["reasoning_content"] = Value::from(thinking.concat());
        }
    }
    Ok(out)
}

/// Anthropic's `tools` and `tool_choice` in the chat shape: function tools, the choice, and
/// whether calls may come several at once.
fn tools_of(
    tools: Option<&Value>,
    choice: Option<&Value>,
) -> Result<(Vec<Value>, Option<Value>, bool), ApiError> {
    let bad = |m: String| ApiError::bad_request(m, Some("tools"));
    let list = match tools {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(a)) => &a[..],
        Some(_) => return Err(bad("tools is a list of tools".into())),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let Some(o) = t.as_object() else {
            return Err(bad(format!("tools[{i}] is an object")));
        };
        match o.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(ty) => {
                return Err(bad(format!(
                    "tools[{i}]: `{ty}` tools run on Anthropic's servers; only client tools (name, input_schema) are served"
                )))
            }
        }
        let mut f = serde_json::Map::new();
        for (k, v) in o {
            match k.as_str() {
                "type" | "cache_control" => {}
                "name" | "description" | "strict" => {
                    f.insert(k.clone(), v.clone());
                }
                "input_schema" => {
                    f.insert("parameters".into(), v.clone());
                }
                _ => {
                    return Err(bad(format!(
                        "tools[{i}].{k} is not supported (name, description, input_schema, strict)"
                    )))
                }
            }
        }
        if !o.contains_key("input_schema") {
            return Err(bad(format!("tools[{i}] needs its `input_schema`")));
        }
        super::openai::function_of(&f, &format!("tools[{i}]"), "parameters")
            .map_err(|e| bad(e.to_string().replace(".parameters", ".input_schema")))?;
        out.push(serde_json::json!({"type": "function", "function": f}));
    }
    let mut parallel = true;
    let choice = match choice.filter(|c| !c.is_null()) {
        None => None,
        Some(c) => {
            let badc = |m: &str| ApiError::bad_request(m.to_string(), Some("tool_choice"));
            let Some(o) = c.as_object() else {
                return Err(badc("tool_choice is an object with a `type`"));
            };
            for (k, v) in o {
                match (k.as_str(), v) {
                    ("type" | "name", _) => {}
                    ("disable_parallel_tool_use", Value::Bool(b)) => parallel = !b,
                    _ => {
                        return Err(badc(&format!(
                        "tool_choice.{k} is not supported (type, name, disable_parallel_tool_use)"
                    )))
                    }
                }
            }
            Some(
                match (
                    o.get("type").and_then(Value::as_str),
                    o.get("name").and_then(Value::as_str),
                ) {
                    (Some("auto"), _) => "auto".into(),
                    (Some("any"), _) => "required".into(),
                    (Some("none"), _) => "none".into(),
                    (Some("tool"), Some(n)) => {
                        serde_json::json!({"type": "function", "function": {"name": n}})
                    }
                    (Some("tool"), None) => {
                        return Err(badc("tool_choice of type `tool` names the tool (`name`)"))
                    }
                    _ => return Err(badc("tool_choice.type is auto, any, tool or none")),
                },
            )
        }
    };
    Ok((out, choice, parallel))
}

/// Parses and validates a Messages body into the request every shape runs as.
pub fn parse(body: &[u8], unknown: UnknownFields) -> Result<Parsed, ApiError> {
    let (r, ignored): (MessagesRequest, _) = openai::checked(Api::Messages, body, unknown)?;
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
    let msgs = messages_of(&r)?;
    let (tools, tool_choice, parallel) = tools_of(r.tools.as_ref(), r.tool_choice.as_ref())?;
    let user = user_of(r.metadata.as_ref())?;
    check_options(&r)?;
    let format = output_format(r.output_config.as_ref())?;
    let enable_thinking = thinking_switch(r.thinking.as_ref())?;
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
    if !tools.is_empty() {
        chat["tools"] = tools.into();
        chat["parallel_tool_calls"] = parallel.into();
    }
    if let Some(c) = tool_choice {
        chat["tool_choice"] = c;
    }
    if let Some(on) = enable_thinking {
        chat["chat_template_kwargs"] = serde_json::json!({"enable_thinking": on});
    }
    // Anthropic's names where the shared checks name OpenAI's.
    openai::parse_as_chat(chat, ignored, ("stop", "stop_sequences"))
}

/// The chat messages of a Messages request: `system`, then each message's blocks.
fn messages_of(r: &MessagesRequest) -> Result<Vec<Value>, ApiError> {
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
        msgs.extend(chat_messages(&m.role, &m.content, i)?);
    }
    Ok(msgs)
}

/// `metadata.user_id`, the one metadata key served.
fn user_of(metadata: Option<&BTreeMap<String, Value>>) -> Result<Option<String>, ApiError> {
    let mut user = None;
    if let Some(md) = metadata {
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
    Ok(user)
}

/// `service_tier`, `speed` and `cache_control`: accepted where they ask for what is served.
fn check_options(r: &MessagesRequest) -> Result<(), ApiError> {
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
    Ok(())
}

/// `output_config.format` as a constraint on the output (`effort` is not served).
fn output_format(
    output_config: Option<&Value>,
) -> Result<Option<cachet_backend::grammar::Constraint>, ApiError> {
    let mut format = None;
    if let Some(oc) = output_config.filter(|v| !v.is_null()) {
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
    Ok(format)
}

/// Anthropic's `thinking` as the chat template's `enable_thinking` switch (Qwen3-style templates;
/// others do not read it): `disabled` off, `adaptive` on (the model thinks as much as it does,
/// within `max_tokens`). `enabled` asks for a token budget, which nothing here would hold the
/// thinking to: refused, naming the two that work.
fn thinking_switch(t: Option<&Value>) -> Result<Option<bool>, ApiError> {
    let Some(t) = t.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let bad = |m: &str, at: &str| Err(ApiError::bad_field(m.to_string(), at.to_string()));
    let Some(o) = t.as_object() else {
        return bad(
            "thinking is an object: {\"type\": \"adaptive\"} or {\"type\": \"disabled\"}",
            "thinking",
        );
    };
    if let Some(k) = o
        .keys()
        .find(|k| !["type", "display"].contains(&k.as_str()))
    {
        if o.get("type").and_then(Value::as_str) != Some("enabled") {
            return bad(
                &format!("thinking.{k} is not supported: thinking takes `type` and `display`"),
                &format!("thinking.{k}"),
            );
        }
    }
    match (o.get("type").and_then(Value::as_str), o.get("display")) {
        (Some("disabled"), None) => Ok(Some(false)),
        (Some("adaptive"), None | Some(Value::Null)) => Ok(Some(true)),
        (Some("adaptive"), Some(Value::String(d))) if d == "summarized" => Ok(Some(true)),
        (Some("adaptive" | "disabled"), Some(_)) => bad(
            "thinking.display: the thinking comes back as it is (`summarized` or leave it out); there is no signature to carry `omitted` thinking",
            "thinking.display",
        ),
        (Some("enabled"), _) => bad(
            "thinking type `enabled` sets a budget_tokens that nothing here holds the thinking to: send {\"type\": \"adaptive\"} (it thinks within max_tokens) or {\"type\": \"disabled\"}",
            "thinking.type",
        ),
        _ => bad(
            "thinking.type is `adaptive` or `disabled`",
            "thinking.type",
        ),
    }
}

/// `POST /v1/messages`; the tenant's id comes back with the result, for counting. Errors are in
/// Anthropic's shape (the caller writes them with [`ApiError::anthropic_response`]).
pub async fn messages(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<(Response<Body>, String), (ApiError, String)> {
    completions::shaped(state, req, |state, body| {
        let parsed = parse(body, state.unknown_fields)?;
        let id = format!("msg_{:024x}", state.new_id());
        Ok((parsed, AnthropicRender::default(), id))
    })
    .await
}

/// Anthropic's `stop_reason`.
fn stop_reason(reason: FinishReason, stop: Option<&str>, calls: bool) -> &'static str {
    match (reason, stop) {
        (FinishReason::Length, _) => "max_tokens",
        (_, Some(_)) => "stop_sequence",
        _ if calls => "tool_use",
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

/// A call as a `tool_use` block.
fn tool_use(meta: &Meta, k: usize, c: &Call) -> Value {
    let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| serde_json::json!({}));
    serde_json::json!({"type": "tool_use", "id": tools::call_id("toolu_", &meta.id, 0, k),
        "name": c.name, "input": input})
}

/// A `message`, or its events: message_start, ping, then per content block (thinking, text,
/// tool_use) content_block_start, its deltas (thinking_delta, text_delta, input_json_delta) and
/// content_block_stop; message_delta (stop reason, usage), message_stop. The model's thinking,
/// where the served template thinks and it is split out, is a `thinking` block before the text
/// (its `signature` empty: nothing here signs it).
#[derive(Default)]
pub struct AnthropicRender {
    usage: Usage,
    stop: Option<(&'static str, Option<String>)>,
    /// Blocks started so far; which kind the last one is when it is still open.
    blocks: usize,
    open: Option<Delta>,
    /// A text or tool_use block was started (thinking alone is no answer).
    answered: bool,
    calls: usize,
}

/// The kinds of block that stream deltas.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Delta {
    Text,
    Thinking,
}

impl AnthropicRender {
    /// Starts block `content` (Anthropic pings after the first).
    fn start_block(&mut self, content: Value) -> Vec<String> {
        let mut frames = vec![event(
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": self.blocks, "content_block": content}),
        )];
        if self.blocks == 0 {
            frames.push(event("ping", serde_json::json!({"type": "ping"})));
        }
        self.blocks += 1;
        frames
    }

    /// Closes the open text or thinking block, if any.
    fn close(&mut self) -> Vec<String> {
        if self.open.take().is_none() {
            return Vec::new();
        }
        vec![event(
            "content_block_stop",
            serde_json::json!({"type": "content_block_stop", "index": self.blocks - 1}),
        )]
    }

    /// `text` as a delta of a `kind` block, opened (and the other kind closed) first if needed.
    fn delta(&mut self, kind: Delta, text: &str) -> Vec<String> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frames = Vec::new();
        if self.open != Some(kind) {
            frames.extend(self.close());
            frames.extend(self.start_block(match kind {
                Delta::Text => serde_json::json!({"type": "text", "text": ""}),
                Delta::Thinking => {
                    serde_json::json!({"type": "thinking", "thinking": "", "signature": ""})
                }
            }));
            self.open = Some(kind);
            self.answered |= kind == Delta::Text;
        }
        let delta = match kind {
            Delta::Text => serde_json::json!({"type": "text_delta", "text": text}),
            Delta::Thinking => serde_json::json!({"type": "thinking_delta", "thinking": text}),
        };
        frames.push(event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}),
        ));
        frames
    }
}

impl Render for AnthropicRender {
    fn whole(
        &mut self,
        meta: &Meta,
        choices: Vec<ChoiceOut>,
        usage: &UsageSum,
        _tok: &TextTokenizer,
    ) -> Vec<u8> {
        let c = choices.into_iter().next().expect("one choice");
        let mut u = usage_json(&usage.usage);
        respond::add_timings(&mut u, meta, &usage.timings);
        let mut content = Vec::new();
        if let Some(r) = &c.reasoning {
            content.push(serde_json::json!({"type": "thinking", "thinking": r, "signature": ""}));
        }
        if !c.text.is_empty() || c.calls.is_empty() {
            content.push(serde_json::json!({"type": "text", "text": c.text}));
        }
        content.extend(
            c.calls
                .iter()
                .enumerate()
                .map(|(k, call)| tool_use(meta, k, call)),
        );
        http::to_json(&serde_json::json!({
            "id": meta.id,
            "type": "message",
            "role": "assistant",
            "model": meta.model,
            "content": content,
            "stop_reason": stop_reason(c.reason, c.stop_sequence.as_deref(), !c.calls.is_empty()),
            "stop_sequence": c.stop_sequence,
            "usage": u,
        }))
    }

    fn start(&mut self, meta: &Meta, _choices: usize) -> Vec<String> {
        vec![event(
            "message_start",
            serde_json::json!({"type": "message_start", "message": {
                "id": meta.id, "type": "message", "role": "assistant", "model": meta.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        )]
    }

    fn token(
        &mut self,
        _meta: &Meta,
        _i: usize,
        text: &str,
        _lp: Option<&RowLogprobs>,
        _tok: &TextTokenizer,
    ) -> Vec<String> {
        self.delta(Delta::Text, text)
    }

    fn splits_reasoning(&self) -> bool {
        true
    }

    fn reasoning(&mut self, _meta: &Meta, _i: usize, text: &str) -> Vec<String> {
        self.delta(Delta::Thinking, text)
    }

    fn call(&mut self, meta: &Meta, _i: usize, k: usize, call: &Call) -> Vec<String> {
        let mut frames = self.close();
        let mut block = tool_use(meta, k, call);
        block["input"] = serde_json::json!({});
        let index = self.blocks;
        self.calls += 1;
        self.answered = true;
        frames.extend(self.start_block(block));
        frames.push(event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": call.arguments}}),
        ));
        frames.push(event(
            "content_block_stop",
            serde_json::json!({"type": "content_block_stop", "index": index}),
        ));
        frames
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
        self.stop = Some((
            stop_reason(reason, stop, self.calls > 0),
            stop.map(str::to_owned),
        ));
        self.delta(Delta::Text, rest)
    }

    fn end(&mut self, meta: &Meta, usage: &UsageSum) -> Vec<String> {
        let (reason, seq) = self.stop.take().unwrap_or(("end_turn", None));
        let mut u = usage_json(&usage.usage);
        respond::add_timings(&mut u, meta, &usage.timings);
        let mut frames = Vec::new();
        if !self.answered {
            // An empty answer is one empty text block, as Anthropic sends it (after the
            // thinking, if any).
            frames.extend(self.close());
            frames.extend(self.start_block(serde_json::json!({"type": "text", "text": ""})));
            self.open = Some(Delta::Text);
        }
        frames.extend(self.close());
        frames.extend([
            event(
                "message_delta",
                serde_json::json!({"type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": u}),
            ),
            event("message_stop", serde_json::json!({"type": "message_stop"})),
        ]);
        frames
    }

    fn error(&mut self, _meta: &Meta, e: &ApiError) -> Vec<String> {
        vec![event("error", e.anthropic_body())]
    }
}
