//! The chat request's own parts: `chat_template_kwargs`, the function tools it offers and the
//! messages it carries (their tool calls and results), turned into the template's messages.

use super::*;

/// Where the chat shape's tool fields are, for errors.
impl ChatRequest {
    /// `chat_template_kwargs`: an object of variables, none of the renderer's own names.
    pub fn template_kwargs(
        &self,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ApiError> {
        let bad = |m: String| ApiError::bad_request(m, Some("chat_template_kwargs"));
        match self.chat_template_kwargs.as_deref() {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Object(m)) => {
                if let Some(k) = m.keys().find(|k| {
                    cachet_backend::tokenizer::TextTokenizer::TEMPLATE_NAMES.contains(&k.as_str())
                }) {
                    return Err(bad(format!(
                        "chat_template_kwargs may not set `{k}`: the server sets it from the request"
                    )));
                }
                Ok(Some(m.clone()))
            }
            Some(other) => Err(bad(format!(
                "chat_template_kwargs is an object of template variables, e.g. {{\"enable_thinking\": false}}; got {other}"
            ))),
        }
    }
}

pub const CHAT_TOOLS: tools::Names = tools::Names {
    tools: "tools",
    choice: "tool_choice",
};

impl ChatRequest {
    /// The functions offered (`tools`, function tools only), `tool_choice` and
    /// `parallel_tool_calls`.
    pub fn tools(&self) -> Result<Option<Tools>, ApiError> {
        use serde_json::Value;
        let bad = |m: String| ApiError::bad_request(m, Some("tools"));
        let list = match &self.tools {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(a)) => &a[..],
            Some(_) => return Err(bad("tools is a list of function tools".into())),
        };
        let mut functions = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let ty = t.get("type").and_then(Value::as_str);
            if ty != Some("function") {
                return Err(bad(format!(
                    "tools[{i}]: only `function` tools are served, got {}",
                    ty.map_or("a tool without a type".into(), |t| format!("`{t}`"))
                )));
            }
            if let Some(k) = t
                .as_object()
                .and_then(|o| o.keys().find(|k| *k != "type" && *k != "function"))
            {
                return Err(bad(format!(
                    "tools[{i}].{k} is not supported (a tool has `type` and `function`)"
                )));
            }
            let Some(f) = t.get("function").and_then(Value::as_object) else {
                return Err(bad(format!(
                    "tools[{i}].function is an object with the function's `name`"
                )));
            };
            functions.push(
                function_of(f, &format!("tools[{i}].function"), "parameters")
                    .map_err(|e| bad(e.to_string()))?,
            );
        }
        let choice = match &self.tool_choice {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(match s.as_str() {
                "none" => Choice::None,
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                _ => {
                    return Err(ApiError::bad_request(
                        format!("tool_choice `{s}` is not one of none, auto, required, or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"),
                        Some("tool_choice"),
                    ))
                }
            }),
            Some(v) => match (
                v.get("type").and_then(Value::as_str),
                v.pointer("/function/name").and_then(Value::as_str),
            ) {
                (Some("function"), Some(n)) => Some(Choice::Named(n.to_string())),
                _ => {
                    return Err(ApiError::bad_request(
                        "tool_choice names a function as {\"type\": \"function\", \"function\": {\"name\": …}}",
                        Some("tool_choice"),
                    ))
                }
            },
        };
        Tools::new(
            functions,
            choice,
            self.parallel_tool_calls.unwrap_or(true),
            CHAT_TOOLS,
        )
    }

    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        use serde_json::Value;
        if self.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let at = |what: &str| format!("messages[{i}]{what}");
                if !["system", "user", "assistant", "developer", "tool"].contains(&m.role.as_str()) {
                    return Err(ApiError::bad_field(
                        format!(
                            "messages[{i}]: unsupported role `{}` (system, developer, user, assistant, tool)",
                            m.role
                        ),
                        at(".role"),
                    ));
                }
                let mut calls = Vec::new();
                let mut call_id = None;
                let (mut name, mut reasoning) = (None, None);
                for (k, v) in &m.other {
                    match (k.as_str(), m.role.as_str()) {
                        ("tool_calls", "assistant") => calls = tool_calls_of(v, i)?,
                        ("name", _) => name = Some(text_member(v, i, k, MAX_KEY_BYTES)?),
                        ("reasoning_content", "assistant") => {
                            reasoning = Some(text_member(v, i, k, usize::MAX)?)
                        }
                        ("tool_call_id", "tool") => match v.as_str() {
                            Some(id) if !id.is_empty() && id.len() <= MAX_KEY_BYTES => {
                                call_id = Some(id.to_string())
                            }
                            _ => {
                                return Err(ApiError::bad_field(
                                    format!("messages[{i}].tool_call_id is the id of the call answered (1 to {MAX_KEY_BYTES} bytes)"),
                                    at(".tool_call_id"),
                                ))
                            }
                        },
                        _ => {
                            return Err(ApiError::bad_field(
                                format!(
                                    "messages[{i}].{k} is not supported: {}",
                                    match k.as_str() {
                                        "tool_calls" => "only an assistant message carries tool calls",
                                        "tool_call_id" => "only a tool message answers a call",
                                        "function_call" => "deprecated by OpenAI: send `tool_calls`",
                                        "reasoning_content" => "only an assistant message carries thinking",
                                        "reasoning" => "send an assistant's thinking as `reasoning_content`",
                                        _ => "a message has `role`, `content` and `name`, and `tool_calls` and `reasoning_content` (assistant) or `tool_call_id` (tool)",
                                    }
                                ),
                                at(&format!(".{k}")),
                            ))
                        }
                    }
                }
                if m.role == "tool" && call_id.is_none() {
                    return Err(ApiError::bad_field(
                        format!("messages[{i}]: a tool message needs the `tool_call_id` of the call it answers"),
                        at(".tool_call_id"),
                    ));
                }
                let text = match &m.content {
                    Value::String(s) => s.clone(),
                    // An assistant's message of calls only.
                    Value::Null if !calls.is_empty() => String::new(),
                    Value::Array(parts) => parts
                        .iter()
                        .enumerate()
                        .map(|(j, p)| {
                            match (
                                p.get("type").and_then(|t| t.as_str()),
                                p.get("text").and_then(|t| t.as_str()),
                            ) {
                                (Some("text"), Some(t)) => Ok(t.to_string()),
                                (ty, _) => Err(ApiError::bad_field(
                                    format!(
                                        "messages[{i}].content[{j}]: only `text` parts are supported, got {}",
                                        ty.map_or("a part without a type".to_string(), |t| format!("`{t}`"))
                                    ),
                                    at(&format!(".content[{j}]")),
                                )),
                            }
                        })
                        .collect::<Result<Vec<_>, _>>()?
                        .join(""),
                    _ => {
                        return Err(ApiError::bad_field(
                            format!("messages[{i}]: content must be a string or text parts"),
                            at(".content"),
                        ))
                    }
                };
                let mut msg = ChatMessage::new(
                    if m.role == "developer" {
                        "system"
                    } else {
                        m.role.as_str()
                    },
                    text,
                );
                msg.tool_calls = calls;
                msg.tool_call_id = call_id;
                msg.name = name;
                msg.reasoning_content = reasoning;
                Ok(msg)
            })
            .collect()
    }
}

/// `messages[i].k` as text of 1 to `max` bytes (`name`; `reasoning_content` may be empty).
fn text_member(v: &serde_json::Value, i: usize, k: &str, max: usize) -> Result<String, ApiError> {
    match v.as_str() {
        Some(t) if t.len() <= max && (k != "name" || !t.is_empty()) => Ok(t.to_string()),
        _ => Err(ApiError::bad_field(
            if k == "name" {
                format!("messages[{i}].name is the participant's name: text of 1 to {max} bytes")
            } else {
                format!("messages[{i}].{k} is text")
            },
            format!("messages[{i}].{k}"),
        )),
    }
}

/// A function of a tool definition (`at` names it in errors; `params` is the shape's key for
/// the schema): `name`, `description`, the schema, `strict`.
pub fn function_of(
    f: &serde_json::Map<String, serde_json::Value>,
    at: &str,
    params: &str,
) -> Result<Function, BadFunction> {
    use serde_json::Value;
    let mut func = Function {
        name: String::new(),
        description: None,
        parameters: serde_json::json!({"type": "object", "properties": {}}),
        strict: false,
    };
    for (k, v) in f {
        match (k.as_str(), v) {
            ("name", Value::String(n)) => func.name = n.clone(),
            ("description", Value::String(d)) => func.description = Some(d.clone()),
            ("description", Value::Null) => {}
            (p, Value::Object(_)) if p == params => func.parameters = v.clone(),
            (p, Value::Null) if p == params => {}
            ("strict", Value::Bool(b)) => func.strict = *b,
            ("strict", Value::Null) => {}
            ("type", Value::String(t)) if t == "function" => {}
            ("name" | "description" | "strict", _) => {
                return Err(BadFunction::WrongType(format!("{at}.{k}")))
            }
            (p, _) if p == params => return Err(BadFunction::NotASchema(format!("{at}.{p}"))),
            _ => {
                return Err(BadFunction::Unsupported {
                    field: format!("{at}.{k}"),
                    params: params.to_string(),
                })
            }
        }
    }
    if func.name.is_empty() {
        return Err(BadFunction::NoName(at.to_string()));
    }
    Ok(func)
}

/// A tool's function definition that cannot be served; each names the field.
#[derive(Debug, thiserror::Error)]
pub enum BadFunction {
    #[error("{0} has the wrong type")]
    WrongType(String),
    #[error("{0} is a JSON Schema object")]
    NotASchema(String),
    #[error("{field} is not supported (name, description, {params}, strict)")]
    Unsupported { field: String, params: String },
    #[error("{0} needs a `name`")]
    NoName(String),
}

/// An assistant message's `tool_calls`: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`, the arguments a JSON object as text.
fn tool_calls_of(v: &serde_json::Value, i: usize) -> Result<Vec<ToolCall>, ApiError> {
    use serde_json::Value;
    let at = |j: usize, what: &str| format!("messages[{i}].tool_calls[{j}]{what}");
    let Some(list) = v.as_array() else {
        return Err(ApiError::bad_field(
            format!("messages[{i}].tool_calls is a list of calls"),
            format!("messages[{i}].tool_calls"),
        ));
    };
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            let id = c.get("id").and_then(Value::as_str).unwrap_or("");
            let name = c.pointer("/function/name").and_then(Value::as_str).unwrap_or("");
            let args = c.pointer("/function/arguments");
            let ty = c.get("type").and_then(Value::as_str).unwrap_or("function");
            if ty != "function" || id.is_empty() || id.len() > MAX_KEY_BYTES || name.is_empty() {
                return Err(ApiError::bad_field(
                    format!("{} is {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}} with a non-empty id and name", at(j, "")),
                    at(j, ""),
                ));
            }
            let arguments = match args {
                Some(Value::String(s)) => s.clone(),
                Some(o @ Value::Object(_)) => o.to_string(),
                _ => String::new(),
            };
            if !serde_json::from_str::<Value>(&arguments).is_ok_and(|a| a.is_object()) {
                return Err(ApiError::bad_field(
                    format!("{} must be a JSON object (as text)", at(j, ".function.arguments")),
                    at(j, ".function.arguments"),
                ));
            }
            Ok(ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}
