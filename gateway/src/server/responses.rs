//! OpenAI's Responses API (`POST /v1/responses`), stateless: text input (a string or message
//! items), `instructions`, text output, its streaming events. Validated field by field against
//! the table (`fields.rs`; `store`, `previous_response_id` and the other stateful fields are
//! refused by name), then the same path as every other shape (`completions::run`).

use std::sync::Arc;

use cachet_backend::request::FinishReason;
use cachet_backend::sampler::RowLogprobs;
use cachet_backend::tokenizer::TextTokenizer;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde::Deserialize;
use serde_json::Value;

use super::fields::{Api, UnknownFields};
use super::openai::{self, Parsed};
use super::respond::{self, ChoiceOut, Meta, Render, UsageSum};
use super::tools::{self, Call};
use super::{completions, AppState};
use crate::http::{self, ApiError, Body};

#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    model: String,
    input: Value,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    #[serde(default)]
    stream: bool,
    user: Option<String>,
    prompt_cache_key: Option<String>,
    service_tier: Option<String>,
    truncation: Option<String>,
    text: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_tool_calls: Option<u64>,
}

/// The message text of an input item's content: a string or `input_text` / `output_text`
/// parts.
fn content_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text"), Some(t)) => out.push_str(t),
                    (ty, _) => {
                        return Err(ApiError::bad_field(
                            format!(
                                "{at}[{j}]: only `input_text` and `output_text` parts are supported, got {}",
                                ty.map_or("a part without a type".to_string(), |t| format!("`{t}`"))
                            ),
                            format!("{at}[{j}]"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad_field(
            format!("{at} must be a string or a list of text parts"),
            at.to_string(),
        )),
    }
}

/// A constraint in vLLM's `structured_outputs` form (how the other shapes hand theirs to the
/// chat path).
pub fn constraint_json(c: &cachet_backend::grammar::Constraint) -> Value {
    use cachet_backend::grammar::Constraint;
    match c {
        Constraint::JsonSchema(s) => serde_json::json!({"json": s}),
        Constraint::JsonObject => serde_json::json!({"json_object": true}),
        Constraint::Regex(r) => serde_json::json!({"regex": r}),
        Constraint::Lark(g) => serde_json::json!({"grammar": g}),
        Constraint::Choice(x) => serde_json::json!({"choice": x}),
    }
}

/// The Responses API's function tools in the chat shape. `strict` is false unless sent (the
/// Responses API's default is true; here strict schemas are enforced only when the model must
/// call, so a client asks for them by name).
fn tools_of(tools: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let bad = |m: String| ApiError::bad_request(m, Some("tools"));
    let list = match tools {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("tools is a list of function tools".into())),
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let Some(o) = t.as_object() else {
                return Err(bad(format!("tools[{i}] is an object")));
            };
            match o.get("type").and_then(Value::as_str) {
                Some("function") => {}
                ty => {
                    return Err(bad(format!(
                        "tools[{i}]: only `function` tools are served, got {}",
                        ty.map_or("a tool without a type".into(), |t| format!("`{t}`"))
                    )))
                }
            }
            openai::function_of(o, &format!("tools[{i}]"), "parameters")
                .map_err(|e| bad(e.to_string()))?;
            let mut f = o.clone();
            f.remove("type");
            Ok(serde_json::json!({"type": "function", "function": f}))
        })
        .collect()
}

/// What the response object echoes of the request.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    /// `text` as sent (its `format`), or plain text.
    text: Value,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    max_tool_calls: Option<u64>,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    temperature: f32,
    top_p: f32,
    user: Option<String>,
}

/// The chat messages of a Responses request: `instructions` as the system message, then
/// `input` (a string, or message, function_call and function_call_output items).
fn messages_of(r: &ResponsesRequest) -> Result<Vec<Value>, ApiError> {
    let mut msgs = Vec::new();
    if let Some(i) = &r.instructions {
        msgs.push(serde_json::json!({"role": "system", "content": i}));
    }
    match &r.input {
        Value::String(s) if !s.is_empty() => {
            msgs.push(serde_json::json!({"role": "user", "content": s}))
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, it) in items.iter().enumerate() {
                item_message(&mut msgs, i, it)?;
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "input must be a non-empty string or a non-empty list of message items",
                Some("input"),
            ))
        }
    }
    Ok(msgs)
}

/// Input item `i` as chat messages, appended to `msgs` (calls in a row join one assistant turn).
fn item_message(msgs: &mut Vec<Value>, i: usize, it: &Value) -> Result<(), ApiError> {
    let ty = it.get("type").and_then(Value::as_str).unwrap_or("message");
    let only = |keys: &[&str]| match it
        .as_object()
        .and_then(|o| o.keys().find(|k| !keys.contains(&k.as_str())))
    {
        Some(k) => Err(ApiError::bad_field(
            format!("input[{i}].{k} is not supported on a `{ty}` item"),
            format!("input[{i}].{k}"),
        )),
        None => Ok(()),
    };
    let text_field = |k: &str| {
        it.get(k).and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_field(
                format!("input[{i}]: a `{ty}` item needs `{k}` (a string)"),
                format!("input[{i}].{k}"),
            )
        })
    };
    match ty {
        "function_call" => {
            only(&["type", "call_id", "name", "arguments", "id", "status"])?;
            let call = serde_json::json!({"id": text_field("call_id")?, "type": "function",
                "function": {"name": text_field("name")?, "arguments": text_field("arguments")?}});
            // Calls in a row are one assistant turn.
            match msgs.last_mut() {
                Some(m) if m["role"] == "assistant" && m.get("tool_calls").is_some() => {
                    m["tool_calls"].as_array_mut().expect("a list").push(call)
                }
                Some(m) if m["role"] == "assistant" => m["tool_calls"] = serde_json::json!([call]),
                _ => msgs.push(serde_json::json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
            return Ok(());
        }
        "function_call_output" => {
            only(&["type", "call_id", "output", "id", "status"])?;
            let output = match it.get("output") {
                Some(o @ Value::Array(_)) => content_text(o, &format!("input[{i}].output"))?,
                _ => text_field("output")?.to_string(),
            };
            msgs.push(serde_json::json!({"role": "tool", "tool_call_id": text_field("call_id")?, "content": output}));
            return Ok(());
        }
        "reasoning" => {
            // An earlier output's reasoning item sent back: the thinking of the assistant turn
            // it precedes (its calls or its message), which the chat template keeps or drops.
            only(&["type", "id", "summary", "content", "status", "encrypted_content"])?;
            if it.get("encrypted_content").is_some_and(|e| !e.is_null()) {
                return Err(ApiError::bad_field(
                    format!("input[{i}].encrypted_content: this server's reasoning items carry their text in `content`; it has nothing to decrypt"),
                    format!("input[{i}].encrypted_content"),
                ));
            }
            let mut text = String::new();
            for (j, part) in it.get("content").and_then(Value::as_array).into_iter().flatten().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("reasoning_text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::bad_field(
                            format!("input[{i}].content[{j}] is a `reasoning_text` part with its `text`"),
                            format!("input[{i}].content[{j}]"),
                        ))
                    }
                }
            }
            msgs.push(serde_json::json!({"role": "assistant", "content": "", "reasoning_content": text}));
            return Ok(());
        }
        "message" => {}
        _ => {
            return Err(ApiError::bad_field(
                format!("input[{i}]: items of type `{ty}` are not supported (message, reasoning, function_call and function_call_output items)"),
                format!("input[{i}].type"),
            ))
        }
    }
    let role = it.get("role").and_then(Value::as_str).unwrap_or("");
    if !["user", "assistant", "system", "developer"].contains(&role) {
        return Err(ApiError::bad_field(
            format!("input[{i}].role must be user, assistant, system or developer, got `{role}`"),
            format!("input[{i}].role"),
        ));
    }
    only(&["type", "role", "content", "id", "status"])?;
    let content = it.get("content").unwrap_or(&Value::Null);
    let text = content_text(content, &format!("input[{i}].content"))?;
    match msgs.last_mut() {
        // The answer a reasoning item preceded.
        Some(m)
            if role == "assistant"
                && m["role"] == "assistant"
                && m["content"] == ""
                && m.get("reasoning_content").is_some()
                && m.get("tool_calls").is_none() =>
        {
            m["content"] = Value::from(text)
        }
        _ => msgs.push(serde_json::json!({"role": role, "content": text})),
    }
    Ok(())
}

/// A Responses `tool_choice` in the chat shape (`{"type": "function", "name": …}` becomes
/// `{"type": "function", "function": {"name": …}}`).
fn tool_choice_of(c: &Value) -> Result<Value, ApiError> {
    Ok(match c {
        Value::String(_) => c.clone(),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o.get("name").and_then(Value::as_str) {
                Some(n) if o.len() == 2 => {
                    serde_json::json!({"type": "function", "function": {"name": n}})
                }
                _ => {
                    return Err(ApiError::bad_request(
                        "tool_choice names a function as {\"type\": \"function\", \"name\": …}",
                        Some("tool_choice"),
                    ))
                }
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "tool_choice is none, auto, required, or {\"type\": \"function\", \"name\": …} (hosted tools are not served)",
                Some("tool_choice"),
            ))
        }
    })
}

/// Parses and validates a Responses body into the request every shape runs as.
pub fn parse(body: &[u8], unknown: UnknownFields) -> Result<(Parsed, Echo), ApiError> {
    let (r, ignored): (ResponsesRequest, _) = openai::checked(Api::Responses, body, unknown)?;
    let msgs = messages_of(&r)?;
    if r.max_output_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "max_output_tokens must be at least 1",
            Some("max_output_tokens"),
        ));
    }
    if r.truncation.as_deref().is_some_and(|t| t != "disabled") {
        return Err(ApiError::bad_request(
            "truncation: only `disabled` is served (a prompt too long for the model is refused)",
            Some("truncation"),
        ));
    }
    let mut format = None;
    if let Some(t) = r.text.as_ref().filter(|t| !t.is_null()) {
        let Some(o) = t.as_object().filter(|o| o.keys().all(|k| k == "format")) else {
            return Err(ApiError::bad_request(
                "text takes `format` only (verbosity is not served)",
                Some("text"),
            ));
        };
        if let Some(f) = o.get("format") {
            format = openai::response_format(f, "text")?;
        }
    }
    let mut chat = serde_json::json!({
        "model": r.model,
        "messages": msgs,
        "stream": r.stream,
    });
    if let Some(c) = format {
        chat["structured_outputs"] = constraint_json(&c);
    }
    let tools = tools_of(r.tools.as_ref())?;
    if !tools.is_empty() {
        chat["tools"] = tools.clone().into();
    }
    if let Some(c) = r.tool_choice.as_ref().filter(|c| !c.is_null()) {
        chat["tool_choice"] = tool_choice_of(c)?;
    }
    if let Some(p) = r.parallel_tool_calls {
        chat["parallel_tool_calls"] = p.into();
    }
    if r.max_tool_calls == Some(0) {
        return Err(ApiError::bad_request(
            "max_tool_calls must be at least 1",
            Some("max_tool_calls"),
        ));
    }
    for (k, val) in [
        ("max_tokens", r.max_output_tokens.map(Value::from)),
        ("temperature", r.temperature.map(Value::from)),
        ("top_p", r.top_p.map(Value::from)),
        ("user", r.user.clone().map(Value::from)),
        (
            "prompt_cache_key",
            r.prompt_cache_key.clone().map(Value::from),
        ),
        ("service_tier", r.service_tier.clone().map(Value::from)),
    ] {
        if let Some(val) = val {
            chat[k] = val;
        }
    }
    let mut parsed = openai::parse_as_chat(chat, ignored, ("max_tokens", "max_output_tokens"))?;
    if let (Some(t), Some(m)) = (&mut parsed.tools, r.max_tool_calls) {
        t.max_calls = Some(m as usize);
    }
    let echo = Echo {
        text: r
            .text
            .clone()
            .filter(|t| t.get("format").is_some())
            .unwrap_or_else(|| serde_json::json!({"format": {"type": "text"}})),
        tools: tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                serde_json::json!({"type": "function", "name": f["name"],
                    "description": f.get("description"), "parameters": f["parameters"],
                    "strict": f.get("strict").and_then(Value::as_bool).unwrap_or(false)})
            })
            .collect(),
        tool_choice: r
            .tool_choice
            .clone()
            .filter(|c| !c.is_null())
            .unwrap_or_else(|| (if tools.is_empty() { "none" } else { "auto" }).into()),
        parallel_tool_calls: r.parallel_tool_calls.unwrap_or(true),
        max_tool_calls: r.max_tool_calls,
        instructions: r.instructions,
        max_output_tokens: r.max_output_tokens,
        temperature: r.temperature.unwrap_or(1.0),
        top_p: r.top_p.unwrap_or(1.0),
        user: r.user,
    };
    Ok((parsed, echo))
}

/// `POST /v1/responses`; the tenant's id comes back with the result, for counting.
pub async fn responses(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<(Response<Body>, String), (ApiError, String)> {
    completions::shaped(state, req, |state, body| {
        let (parsed, echo) = parse(body, state.unknown_fields)?;
        let n = state.new_id();
        let render = ResponsesRender {
            echo,
            item_id: format!("msg_{n:024x}"),
            reasoning_id: format!("rs_{n:024x}"),
            created: respond::now_unix(),
            text: String::new(),
            seq: 0,
            finish: None,
            output: Vec::new(),
            open: None,
            answered: false,
        };
        Ok((parsed, render, format!("resp_{n:024x}")))
    })
    .await
}

/// A `response` object, or its events (`response.created` … `response.completed`): the
/// model's thinking (where the served template thinks and it is split out) as a `reasoning`
/// item with `reasoning_text` content, the answer's text as a `message` item, each tool call as a
/// `function_call` item after them.
pub struct ResponsesRender {
    echo: Echo,
    item_id: String,
    reasoning_id: String,
    created: u64,
    /// The open item's text so far (its done events repeat it).
    text: String,
    seq: u64,
    finish: Option<FinishReason>,
    /// The output items done so far.
    output: Vec<Value>,
    /// The item open for text deltas (streams).
    open: Option<Item>,
    /// A message or function_call item was started (a reasoning item alone is no answer).
    answered: bool,
}

/// The output items that stream text.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Item {
    Reasoning,
    Message,
}

impl ResponsesRender {
    fn message(&self, text: &str, done: bool) -> Value {
        serde_json::json!({
            "type": "message", "id": self.item_id,
            "status": if done { "completed" } else { "in_progress" },
            "role": "assistant",
            "content": if done {
                serde_json::json!([Self::part(Item::Message, text)])
            } else {
                serde_json::json!([])
            },
        })
    }

    fn reasoning_item(&self, text: &str, done: bool) -> Value {
        serde_json::json!({
            "type": "reasoning", "id": self.reasoning_id, "summary": [],
            "status": if done { "completed" } else { "in_progress" },
            "content": if done {
                serde_json::json!([Self::part(Item::Reasoning, text)])
            } else {
                serde_json::json!([])
            },
        })
    }

    fn item(&self, kind: Item, text: &str, done: bool) -> Value {
        match kind {
            Item::Reasoning => self.reasoning_item(text, done),
            Item::Message => self.message(text, done),
        }
    }

    /// An item's one content part.
    fn part(kind: Item, text: &str) -> Value {
        match kind {
            Item::Reasoning => serde_json::json!({"type": "reasoning_text", "text": text}),
            Item::Message => {
                serde_json::json!({"type": "output_text", "text": text, "annotations": []})
            }
        }
    }

    fn function_call(meta: &Meta, k: usize, c: &Call, done: bool) -> Value {
        serde_json::json!({
            "type": "function_call",
            "id": tools::call_id("fc_", &meta.id, 0, k),
            "call_id": tools::call_id("call_", &meta.id, 0, k),
            "name": c.name,
            "arguments": if done { c.arguments.as_str() } else { "" },
            "status": if done { "completed" } else { "in_progress" },
        })
    }

    fn response(
        &self,
        meta: &Meta,
        finish: Option<FinishReason>,
        usage: Option<&UsageSum>,
    ) -> Value {
        let (status, incomplete) = match finish {
            None => ("in_progress", Value::Null),
            Some(FinishReason::Length) => (
                "incomplete",
                serde_json::json!({"reason": "max_output_tokens"}),
            ),
            Some(_) => ("completed", Value::Null),
        };
        let mut v = serde_json::json!({
            "id": meta.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.echo.instructions,
            "max_output_tokens": self.echo.max_output_tokens,
            "max_tool_calls": self.echo.max_tool_calls,
            "model": meta.model,
            "output": if finish.is_some() { self.output.clone() } else { vec![] },
            "parallel_tool_calls": self.echo.parallel_tool_calls,
            "previous_response_id": null,
            "store": false,
            "temperature": self.echo.temperature,
            "text": self.echo.text,
            "tool_choice": self.echo.tool_choice,
            "tools": self.echo.tools,
            "top_p": self.echo.top_p,
            "truncation": "disabled",
            "user": self.echo.user,
            "metadata": {},
            "usage": null,
        });
        if let Some(u) = usage {
            let x = &u.usage;
            let mut j = serde_json::json!({
                "input_tokens": x.prompt_tokens,
                "input_tokens_details": {"cached_tokens": x.cached_tokens},
                "output_tokens": x.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens.unwrap_or(0)},
                "total_tokens": x.prompt_tokens + x.completion_tokens,
            });
            respond::add_timings(&mut j, meta, &u.timings);
            v["usage"] = j;
        }
        v
    }

    fn event(&mut self, kind: &str, mut data: Value) -> String {
        data["type"] = kind.into();
        data["sequence_number"] = self.seq.into();
        self.seq += 1;
        format!("event: {kind}\ndata: {data}\n\n")
    }

    fn ids(&self, kind: Item) -> Value {
        let id = match kind {
            Item::Reasoning => &self.reasoning_id,
            Item::Message => &self.item_id,
        };
        serde_json::json!({"item_id": id, "output_index": self.output.len(), "content_index": 0})
    }

    /// Opens a `kind` item (its first text).
    fn open_item(&mut self, kind: Item) -> Vec<String> {
        self.open = Some(kind);
        self.answered |= kind == Item::Message;
        let item = self.item(kind, "", false);
        let mut part = self.ids(kind);
        part["part"] = Self::part(kind, "");
        let index = self.output.len();
        vec![
            self.event(
                "response.output_item.added",
                serde_json::json!({"output_index": index, "item": item}),
            ),
            self.event("response.content_part.added", part),
        ]
    }

    /// Closes the open item, if any.
    fn close(&mut self) -> Vec<String> {
        let Some(kind) = self.open.take() else {
            return Vec::new();
        };
        let text = std::mem::take(&mut self.text);
        let mut done = self.ids(kind);
        done["text"] = text.as_str().into();
        let name = match kind {
            Item::Reasoning => "response.reasoning_text.done",
            Item::Message => {
                done["logprobs"] = serde_json::json!([]);
                "response.output_text.done"
            }
        };
        let mut part = self.ids(kind);
        part["part"] = Self::part(kind, &text);
        let item = self.item(kind, &text, true);
        let index = self.output.len();
        let frames = vec![
            self.event(name, done),
            self.event("response.content_part.done", part),
            self.event(
                "response.output_item.done",
                serde_json::json!({"output_index": index, "item": item}),
            ),
        ];
        self.output.push(item);
        frames
    }

    /// `text` as a delta of a `kind` item, opened (and the other closed) first if needed.
    fn delta(&mut self, kind: Item, text: &str) -> Vec<String> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frames = Vec::new();
        if self.open != Some(kind) {
            frames.extend(self.close());
            frames.extend(self.open_item(kind));
        }
        self.text.push_str(text);
        let mut d = self.ids(kind);
        d["delta"] = text.into();
        let name = match kind {
            Item::Reasoning => "response.reasoning_text.delta",
            Item::Message => {
                d["logprobs"] = serde_json::json!([]);
                "response.output_text.delta"
            }
        };
        frames.push(self.event(name, d));
        frames
    }
}

impl Render for ResponsesRender {
    fn whole(
        &mut self,
        meta: &Meta,
        choices: Vec<ChoiceOut>,
        usage: &UsageSum,
        _tok: &TextTokenizer,
    ) -> Vec<u8> {
        let c = choices.into_iter().next().expect("one choice");
        if let Some(r) = &c.reasoning {
            self.output.push(self.reasoning_item(r, true));
        }
        if !c.text.is_empty() || c.calls.is_empty() {
            self.output.push(self.message(&c.text, true));
        }
        for (k, call) in c.calls.iter().enumerate() {
            self.output.push(Self::function_call(meta, k, call, true));
        }
        http::to_json(&self.response(meta, Some(c.reason), Some(usage)))
    }

    fn start(&mut self, meta: &Meta, _choices: usize) -> Vec<String> {
        let r = self.response(meta, None, None);
        vec![
            self.event("response.created", serde_json::json!({"response": r})),
            self.event("response.in_progress", serde_json::json!({"response": r})),
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
        self.delta(Item::Message, text)
    }

    fn splits_reasoning(&self) -> bool {
        true
    }

    fn reasoning(&mut self, _meta: &Meta, _i: usize, text: &str) -> Vec<String> {
        self.delta(Item::Reasoning, text)
    }

    fn call(&mut self, meta: &Meta, _i: usize, k: usize, call: &Call) -> Vec<String> {
        let mut frames = self.close();
        self.answered = true;
        let index = self.output.len();
        let id = tools::call_id("fc_", &meta.id, 0, k);
        let added = Self::function_call(meta, k, call, false);
        let done = Self::function_call(meta, k, call, true);
        frames.push(self.event(
            "response.output_item.added",
            serde_json::json!({"output_index": index, "item": added}),
        ));
        frames.push(self.event(
            "response.function_call_arguments.delta",
            serde_json::json!({"item_id": id, "output_index": index, "delta": call.arguments}),
        ));
        frames.push(self.event(
            "response.function_call_arguments.done",
            serde_json::json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments}),
        ));
        frames.push(self.event(
            "response.output_item.done",
            serde_json::json!({"output_index": index, "item": done}),
        ));
        self.output.push(done);
        frames
    }

    fn finish(
        &mut self,
        _meta: &Meta,
        _i: usize,
        rest: &str,
        reason: FinishReason,
        _stop: Option<&str>,
        _usage: &cachet_backend::request::Usage,
    ) -> Vec<String> {
        self.finish = Some(reason);
        self.delta(Item::Message, rest)
    }

    fn end(&mut self, meta: &Meta, usage: &UsageSum) -> Vec<String> {
        let finish = self.finish.unwrap_or(FinishReason::Stop);
        let mut frames = Vec::new();
        if !self.answered {
            // An empty answer is an empty message (after the reasoning, if any).
            frames.extend(self.close());
            frames.extend(self.open_item(Item::Message));
        }
        frames.extend(self.close());
        let r = self.response(meta, Some(finish), Some(usage));
        let last = if finish == FinishReason::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        frames.push(self.event(last, serde_json::json!({"response": r})));
        frames
    }

    fn error(&mut self, _meta: &Meta, e: &ApiError) -> Vec<String> {
        let body = serde_json::json!({"code": e.code, "message": e.message, "param": e.param});
        vec![self.event("error", body)]
    }
}
