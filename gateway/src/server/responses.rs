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

/// What the response object echoes of the request.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    temperature: f32,
    top_p: f32,
    user: Option<String>,
}

/// Parses and validates a Responses body into the request every shape runs as.
pub fn parse(body: &[u8], unknown: UnknownFields) -> Result<(Parsed, Echo), ApiError> {
    let (r, ignored): (ResponsesRequest, _) =
        openai::checked(Api::Responses, http::parse_json(body)?, unknown)?;
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
                let ty = it.get("type").and_then(Value::as_str).unwrap_or("message");
                if ty != "message" {
                    return Err(ApiError::bad_field(
                        format!("input[{i}]: items of type `{ty}` are not supported (message items only; tools are not served yet)"),
                        format!("input[{i}].type"),
                    ));
                }
                let role = it.get("role").and_then(Value::as_str).unwrap_or("");
                if !["user", "assistant", "system", "developer"].contains(&role) {
                    return Err(ApiError::bad_field(
                        format!("input[{i}].role must be user, assistant, system or developer, got `{role}`"),
                        format!("input[{i}].role"),
                    ));
                }
                if let Some(k) = it.as_object().and_then(|o| {
                    o.keys().find(|k| {
                        !["type", "role", "content", "id", "status"].contains(&k.as_str())
                    })
                }) {
                    return Err(ApiError::bad_field(
                        format!("input[{i}].{k} is not supported on a message item"),
                        format!("input[{i}].{k}"),
                    ));
                }
                let content = it.get("content").unwrap_or(&Value::Null);
                let text = content_text(content, &format!("input[{i}].content"))?;
                msgs.push(serde_json::json!({"role": role, "content": text}));
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "input must be a non-empty string or a non-empty list of message items",
                Some("input"),
            ))
        }
    }
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
    let parsed = openai::parse_as_chat(chat, ignored, ("max_tokens", "max_output_tokens"))?;
    let echo = Echo {
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
        let n = state.next_id();
        let render = ResponsesRender {
            echo,
            item_id: format!("msg_{n:024x}"),
            created: respond::now_unix(),
            text: String::new(),
            seq: 0,
            finish: None,
        };
        Ok((parsed, render, format!("resp_{n:024x}")))
    })
    .await
}

/// A `response` object, or its events (`response.created` … `response.completed`).
pub struct ResponsesRender {
    echo: Echo,
    item_id: String,
    created: u64,
    /// The text so far (the done events repeat it).
    text: String,
    seq: u64,
    finish: Option<FinishReason>,
}

impl ResponsesRender {
    fn message(&self, text: &str, done: bool) -> Value {
        serde_json::json!({
            "type": "message", "id": self.item_id,
            "status": if done { "completed" } else { "in_progress" },
            "role": "assistant",
            "content": if done {
                serde_json::json!([{"type": "output_text", "text": text, "annotations": []}])
            } else {
                serde_json::json!([])
            },
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
            "model": meta.model,
            "output": if finish.is_some() { vec![self.message(&self.text, true)] } else { vec![] },
            "parallel_tool_calls": false,
            "previous_response_id": null,
            "store": false,
            "temperature": self.echo.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
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
                "output_tokens_details": {"reasoning_tokens": 0},
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

    fn ids(&self) -> Value {
        serde_json::json!({"item_id": self.item_id, "output_index": 0, "content_index": 0})
    }

    fn delta(&mut self, text: &str) -> Vec<String> {
        if text.is_empty() {
            return Vec::new();
        }
        self.text.push_str(text);
        let mut d = self.ids();
        d["delta"] = text.into();
        d["logprobs"] = serde_json::json!([]);
        vec![self.event("response.output_text.delta", d)]
    }
}

impl Render for ResponsesRender {
    fn whole(
        &mut self,
        meta: &Meta,
        choices: Vec<ChoiceOut>,
        usage: &UsageSum,
        _tok: &TextTokenizer,
    ) -> Value {
        let c = choices.into_iter().next().expect("one choice");
        self.text = c.text;
        self.response(meta, Some(c.reason), Some(usage))
    }

    fn start(&mut self, meta: &Meta, _choices: usize) -> Vec<String> {
        let r = self.response(meta, None, None);
        let item = self.message("", false);
        let mut part = self.ids();
        part["part"] = serde_json::json!({"type": "output_text", "text": "", "annotations": []});
        vec![
            self.event("response.created", serde_json::json!({"response": r})),
            self.event("response.in_progress", serde_json::json!({"response": r})),
            self.event(
                "response.output_item.added",
                serde_json::json!({"output_index": 0, "item": item}),
            ),
            self.event("response.content_part.added", part),
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
        self.delta(text)
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
        self.delta(rest)
    }

    fn end(&mut self, meta: &Meta, usage: &UsageSum) -> Vec<String> {
        let finish = self.finish.unwrap_or(FinishReason::Stop);
        let mut done = self.ids();
        done["text"] = self.text.clone().into();
        done["logprobs"] = serde_json::json!([]);
        let mut part = self.ids();
        part["part"] =
            serde_json::json!({"type": "output_text", "text": self.text, "annotations": []});
        let item = self.message(&self.text, true);
        let r = self.response(meta, Some(finish), Some(usage));
        let last = if finish == FinishReason::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        vec![
            self.event("response.output_text.done", done),
            self.event("response.content_part.done", part),
            self.event(
                "response.output_item.done",
                serde_json::json!({"output_index": 0, "item": item}),
            ),
            self.event(last, serde_json::json!({"response": r})),
        ]
    }

    fn error(&mut self, _meta: &Meta, e: &ApiError) -> Vec<String> {
        let body = serde_json::json!({"code": e.code, "message": e.message, "param": e.param});
        vec![self.event("error", body)]
    }
}
