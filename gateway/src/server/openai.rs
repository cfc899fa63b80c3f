//! The OpenAI request shapes Cachet accepts, validated into engine parameters. Every field is
//! checked against [`super::fields::FIELDS`]: it works as documented, or is refused by name;
//! an unknown field is refused too unless the deployment lets it through with a warning.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeMap;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::fields::{self, Api, Status, UnknownFields};
use super::tools::{self, Choice, Function, Tools};
use crate::http::ApiError;
use cachet_backend::grammar::Constraint;
use cachet_backend::sampler::{SamplingParams, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS};
use cachet_backend::tokenizer::{ChatMessage, ToolCall};

mod chat;
mod members;
pub use chat::{function_of, CHAT_TOOLS};
pub use members::Members;
use members::{member_error, Key};

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Most choices (`n`) one request may ask for.
pub const MAX_N: u32 = 16;
/// Most prompts in one completions batch, and most choices over them all.
pub const MAX_PROMPTS: usize = 64;
pub const MAX_CHOICES: usize = 128;
/// Most `stop_token_ids`.
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// Longest `user` / `prompt_cache_key`.
pub const MAX_KEY_BYTES: usize = 256;

/// Fields shared by chat and text completions (the table has been checked first: these are the
/// fields that work, typed).
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    pub model: String,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub user: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub n: Option<u32>,
    /// `true`/`false` on chat, a count on completions.
    pub logprobs: Option<serde_json::Value>,
    pub top_logprobs: Option<u32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_tokens: Option<u64>,
    pub stop_token_ids: Option<Vec<u32>>,
    /// Generate `max_tokens` whatever the model says (vLLM's extra parameter; for benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
    /// vLLM's `cache_salt`: requests share cached prefixes only with requests of the same
    /// tenant *and* the same salt (a client's own isolation, within the tenant's).
    pub cache_salt: Option<String>,
    pub store: Option<bool>,
    pub service_tier: Option<String>,
    pub modalities: Option<Vec<String>>,
    pub echo: Option<bool>,
    pub response_format: Option<serde_json::Value>,
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub structured_outputs: Option<serde_json::Value>,
}

/// A message of a chat (or Anthropic Messages) body: its role, its content, and anything else it
/// carries (`name`, `tool_calls`, …), which each shape accepts or refuses by name.
#[derive(Debug)]
pub struct MessageIn {
    pub role: String,
    pub content: serde_json::Value,
    pub other: BTreeMap<String, serde_json::Value>,
}

/// Read member by member (serde's `flatten` would buffer the whole message first).
impl<'de> Deserialize<'de> for MessageIn {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessageIn;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<MessageIn, A::Error> {
                let (mut role, mut content, mut other) = (None, None, BTreeMap::new());
                while let Some(k) = m.next_key_seed(Key)? {
                    match &*k {
                        "role" if role.is_some() => return Err(de::Error::duplicate_field("role")),
                        "role" => role = Some(m.next_value()?),
                        "content" if content.is_some() => {
                            return Err(de::Error::duplicate_field("content"))
                        }
                        "content" => content = Some(m.next_value()?),
                        _ => {
                            other.insert(k.into_owned(), m.next_value()?);
                        }
                    }
                }
                Ok(MessageIn {
                    role: role.ok_or_else(|| de::Error::missing_field("role"))?,
                    content: content.ok_or_else(|| de::Error::missing_field("content"))?,
                    other,
                })
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<MessageIn>,
    /// The tenant's template to render the messages with (Cachet extension; `extra_body` in
    /// the OpenAI client). Without it the tenant's `default_template` applies, if any.
    pub template: Option<String>,
    /// Variables for the template (Cachet extension).
    pub template_variables: Option<Box<std::collections::BTreeMap<String, String>>>,
    pub tools: Option<serde_json::Value>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Extra variables for the model's chat template (vLLM's extension; Qwen3's
    /// `enable_thinking`).
    pub chat_template_kwargs: Option<Box<serde_json::Value>>,
    /// Typed from the same members (see [`ChatRequest::of`]).
    #[serde(skip)]
    pub common: Common,
}

impl ChatRequest {
    /// A chat body's members typed: its own fields, and the common ones from the same members
    /// (each skips the other's).
    pub fn of(m: &Members) -> Result<ChatRequest, ApiError> {
        let mut r: ChatRequest = m.typed()?;
        r.common = m.typed()?;
        Ok(r)
    }
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: serde_json::Value,
    /// Typed from the same members, as [`ChatRequest::common`].
    #[serde(skip)]
    pub common: Common,
}

/// One prompt of a completions request: text, or token ids as the client tokenized them.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptIn {
    Text(String),
    Tokens(Vec<u32>),
}

/// What a request asks for: a chat's messages or a completion's prompts.
pub enum Input {
    Chat(ChatRequest, Vec<ChatMessage>),
    Text(CompletionRequest, Vec<PromptIn>),
}

impl Input {
    pub fn common(&self) -> &Common {
        match self {
            Input::Chat(r, _) => &r.common,
            Input::Text(r, _) => &r.common,
        }
    }
}

/// A request body parsed and validated: everything that needs no state (whether the model is
/// served here, and may be used by the tenant, is for the caller).
pub struct Parsed {
    pub input: Input,
    pub max_tokens: Option<u64>,
    pub stop: Vec<String>,
    /// Sampling, processors and log-probabilities (the seed is choice 0's).
    pub sampling: SamplingParams,
    pub stop_token_ids: Vec<u32>,
    /// Choices per prompt.
    pub n: usize,
    /// Unknown fields let through (`UnknownFields::Warn`), for the warning header.
    pub ignored: Vec<String>,
    /// What the output must match (structured outputs).
    pub constraint: Option<Constraint>,
    /// The functions the model may call (chat).
    pub tools: Option<Tools>,
}

/// Parses and validates the body of `/v1/chat/completions` (`chat`) or `/v1/completions`: any
/// bytes give a request or a 400 that names what to fix (the `request` fuzz target holds it to
/// that).
pub fn parse_request(chat: bool, body: &[u8], unknown: UnknownFields) -> Result<Parsed, ApiError> {
    let m = Members::parse(body)?;
    if chat {
        let ignored = check_fields(Api::Chat, &m, unknown)?;
        let r = ChatRequest::of(&m)?;
        let msgs = r.messages()?;
        let tools = r.tools()?;
        r.template_kwargs()?;
        validated(Input::Chat(r, msgs), ignored, tools)
    } else {
        let ignored = check_fields(Api::Completions, &m, unknown)?;
        let mut r: CompletionRequest = m.typed()?;
        r.common = m.typed()?;
        let p = r.prompts()?;
        validated(Input::Text(r, p), ignored, None)
    }
}

/// A body of `api`: a JSON object whose every key is checked against the table
/// (`check_fields`), typed as `T`; with the unknown fields let through.
pub fn checked<T: serde::de::DeserializeOwned>(
    api: Api,
    body: &[u8],
    unknown: UnknownFields,
) -> Result<(T, Vec<String>), ApiError> {
    let m = Members::parse(body)?;
    let ignored = check_fields(api, &m, unknown)?;
    Ok((m.typed()?, ignored))
}

/// The checks of the common fields, on a request whose input (and tools) are already valid.
fn validated(input: Input, ignored: Vec<String>, tools: Option<Tools>) -> Result<Parsed, ApiError> {
    let chat = matches!(input, Input::Chat(..));
    let c = input.common();
    let (max_tokens, stop) = c.validate()?;
    let sampling = c.sampling(chat)?;
    if let (Some(m), Some(mt)) = (c.min_tokens, max_tokens) {
        if m > mt {
            return Err(ApiError::bad_request(
                format!("min_tokens ({m}) is more than max_tokens ({mt})"),
                Some("min_tokens"),
            ));
        }
    }
    let n = c.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad_request(
            format!("n must be 1 to {MAX_N}, got {n}"),
            Some("n"),
        ));
    }
    if let Input::Text(_, p) = &input {
        if p.len() * n as usize > MAX_CHOICES {
            return Err(ApiError::bad_request(
                format!(
                    "{} prompts × n = {n} is {} choices; at most {MAX_CHOICES}",
                    p.len(),
                    p.len() * n as usize
                ),
                Some("n"),
            ));
        }
    }
    let constraint = c.constraint()?;
    if let Some(t) = &tools {
        if constraint.is_some() && matches!(t.choice, Choice::Required | Choice::Named(_)) {
            return Err(ApiError::bad_request(
                "tool_choice makes the model call a function, and a structured-output field shapes its text: send one of them",
                Some("tool_choice"),
            ));
        }
    }
    let stop_token_ids = c.stop_token_ids.clone().unwrap_or_default();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::bad_request(
            format!("stop_token_ids takes up to {MAX_STOP_TOKEN_IDS} ids"),
            Some("stop_token_ids"),
        ));
    }
    Ok(Parsed {
        input,
        max_tokens,
        stop,
        sampling,
        stop_token_ids,
        n: n as usize,
        ignored,
        constraint,
        tools,
    })
}

/// `c` if it is within the grammar limits (a 400 naming `field` and the limit if not): checked
/// before the request goes anywhere, so no schema or grammar reaches the grammar library (here
/// or in a worker) past the bounds it was measured to run within.
pub fn bounded(c: Constraint, field: &'static str) -> Result<Constraint, ApiError> {
    c.check()
        .map_err(|e| ApiError::bad_request(format!("{field}: {e}"), Some(field)))?;
    Ok(c)
}

/// The constraint of a `response_format` (OpenAI's chat shape; `param` names the field for
/// errors): `text` is none, `json_object` any object, `json_schema` its schema.
pub fn response_format(
    v: &serde_json::Value,
    param: &'static str,
) -> Result<Option<Constraint>, ApiError> {
    let bad = |m: &str| ApiError::bad_request(format!("{param}: {m}"), Some(param));
    match v.get("type").and_then(|t| t.as_str()) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            // Chat nests the schema under `json_schema`; the Responses API's `text.format` and
            // Anthropic's `output_config.format` carry it at the top.
            let holder = v.get("json_schema").unwrap_or(v);
            match holder.get("schema") {
                Some(s) if s.is_object() || s.is_boolean() => {
                    Ok(Some(bounded(Constraint::JsonSchema(s.clone()), param)?))
                }
                Some(_) => Err(bad("`schema` must be a JSON Schema object")),
                None => Err(bad("a json_schema format needs its `schema`")),
            }
        }
        Some(t) => Err(bad(&format!(
            "type `{t}` is not supported (text, json_object, json_schema)"
        ))),
        None => Err(bad("needs a `type` (text, json_object, json_schema)")),
    }
}

/// Another shape's request, rewritten in the chat shape after its own checks, parsed as chat:
/// the errors of the shared checks name the shape's field `to` where they name the chat field
/// `from`; `ignored` are the shape's unknown fields let through.
pub fn parse_as_chat(
    chat: serde_json::Value,
    ignored: Vec<String>,
    (from, to): (&'static str, &'static str),
) -> Result<Parsed, ApiError> {
    let rename = |mut e: ApiError| {
        if e.param.as_deref() == Some(from) {
            e.param = Some(to.into());
            e.message = e.message.replace(from, to);
        }
        e
    };
    let body = serde_json::to_vec(&chat).expect("a JSON value writes");
    let m = Members::parse(&body)?;
    check_fields(Api::Chat, &m, UnknownFields::Reject).map_err(rename)?;
    let r = ChatRequest::of(&m).map_err(rename)?;
    let msgs = r.messages().map_err(rename)?;
    let tools = r.tools().map_err(rename)?;
    validated(Input::Chat(r, msgs), ignored, tools).map_err(rename)
}

/// Every key of an `api` body against the table: refused fields (with a value other than
/// their no-op) and unknown ones are a 400 naming them; unknown ones are returned instead under
/// `Warn`.
fn check_fields(api: Api, m: &Members, unknown: UnknownFields) -> Result<Vec<String>, ApiError> {
    use serde_json::Value;
    let mut ignored = Vec::new();
    for (k, raw) in &m.0 {
        let Some(f) = fields::lookup(k, api) else {
            match unknown {
                UnknownFields::Reject => {
                    return Err(ApiError::bad_field(
                        format!(
                            "Unrecognized request argument supplied: {k} (docs/API.md lists the fields {} takes)",
                            api.path()
                        ),
                        k.to_string(),
                    ))
                }
                UnknownFields::Warn => {
                    ignored.push(k.to_string());
                    continue;
                }
            }
        };
        if f.status == Status::Works {
            continue;
        }
        // The no-ops of refused fields: what a client may send meaning "none of it" (the only
        // values parsed before typing: a refused field's are rare).
        let v: Value = serde_json::from_str(raw.get()).map_err(|e| {
            // Scanned as JSON already; what parsing adds is a number's range (`1e400`).
            member_error(k, &e)
        })?;
        let no_op = match (f.name, &v) {
            (_, Value::Null) => true,
            ("tools" | "functions", Value::Array(a)) => a.is_empty(),
            ("tool_choice" | "function_call", Value::String(s)) => s == "none",
            ("tool_choice", Value::Object(o)) => {
                o.len() == 1 && o.get("type").and_then(Value::as_str) == Some("none")
            }
            ("parallel_tool_calls" | "store" | "background", Value::Bool(b)) => !b,
            ("include", Value::Array(a)) => a.is_empty(),
            ("response_format", Value::Object(o)) => {
                o.len() == 1 && o.get("type").and_then(Value::as_str) == Some("text")
            }
            ("metadata" | "output_config", Value::Object(o)) => o.is_empty(),
            ("best_of", Value::Number(n)) => n.as_u64() == Some(1),
            _ => false,
        };
        if !no_op {
            return Err(ApiError::bad_field(
                format!("`{}` is not supported: {}", f.name, f.note),
                f.name,
            ));
        }
    }
    Ok(ignored)
}

impl Common {
    /// Checks the fields that need no state and returns (max_tokens, stop strings).
    pub fn validate(&self) -> Result<(Option<u64>, Vec<String>), ApiError> {
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ApiError::bad_request(
                    format!("temperature must be between 0 and 2, got {t}"),
                    Some("temperature"),
                ));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(ApiError::bad_request(
                    format!("top_p must be in (0, 1], got {p}"),
                    Some("top_p"),
                ));
            }
        }
        let max = self.max_completion_tokens.or(self.max_tokens);
        if max == Some(0) {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1",
                Some(if self.max_completion_tokens.is_some() {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                }),
            ));
        }
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        use crate::sandbox::{MAX_STOP_BYTES, MAX_STOP_HINTS};
        if stop.len() > MAX_STOP_HINTS
            || stop
                .iter()
                .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(ApiError::bad_request(
                format!("stop takes up to {MAX_STOP_HINTS} non-empty strings of at most {MAX_STOP_BYTES} bytes"),
                Some("stop"),
            ));
        }
        if self
            .cache_salt
            .as_ref()
            .is_some_and(|c| c.is_empty() || c.len() > MAX_CACHE_SALT_BYTES)
        {
            return Err(ApiError::bad_request(
                format!("cache_salt must be 1 to {MAX_CACHE_SALT_BYTES} bytes"),
                Some("cache_salt"),
            ));
        }
        for (name, v) in [
            ("user", &self.user),
            ("prompt_cache_key", &self.prompt_cache_key),
        ] {
            if v.as_ref().is_some_and(|s| s.len() > MAX_KEY_BYTES) {
                return Err(ApiError::bad_field(
                    format!("{name} takes at most {MAX_KEY_BYTES} bytes"),
                    name,
                ));
            }
        }
        if self.store == Some(true) {
            return Err(ApiError::bad_request(
                "store: Cachet stores no completions; send false or leave it out",
                Some("store"),
            ));
        }
        if self
            .service_tier
            .as_deref()
            .is_some_and(|t| t != "auto" && t != "default")
        {
            return Err(ApiError::bad_request(
                "service_tier: there is one tier here; send `auto`, `default` or leave it out",
                Some("service_tier"),
            ));
        }
        if self
            .modalities
            .as_ref()
            .is_some_and(|m| m.iter().any(|x| x != "text"))
        {
            return Err(ApiError::bad_request(
                "modalities: the served model makes text only; send [\"text\"]",
                Some("modalities"),
            ));
        }
        if self.echo == Some(true) {
            return Err(ApiError::bad_request(
                "echo: the prompt is not echoed back; send false or leave it out",
                Some("echo"),
            ));
        }
        Ok((max, stop))
    }

    /// The sampling parameters, processors and log-probabilities asked for.
    pub fn sampling(&self, chat: bool) -> Result<SamplingParams, ApiError> {
        let mut p = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            seed: self.seed,
            ..Default::default()
        };
        match self.top_k {
            None | Some(-1) | Some(0) => {}
            Some(k) if k > 0 => p.top_k = k as usize,
            Some(k) => {
                return Err(ApiError::bad_request(
                    format!("top_k must be -1 or 0 (off) or a positive count, got {k}"),
                    Some("top_k"),
                ))
            }
        }
        p.min_p = self.min_p.unwrap_or(0.0);
        p.presence_penalty = self.presence_penalty.unwrap_or(0.0);
        p.frequency_penalty = self.frequency_penalty.unwrap_or(0.0);
        p.repetition_penalty = self.repetition_penalty.unwrap_or(1.0);
        p.min_tokens = self.min_tokens.unwrap_or(0).min(u32::MAX as u64) as usize;
        if let Some(b) = &self.logit_bias {
            if b.len() > MAX_LOGIT_BIAS {
                return Err(ApiError::bad_request(
                    format!("logit_bias takes at most {MAX_LOGIT_BIAS} tokens"),
                    Some("logit_bias"),
                ));
            }
            for (k, &v) in b {
                let Ok(t) = k.parse::<u32>() else {
                    return Err(ApiError::bad_request(
                        format!("logit_bias keys are token ids, got `{k}`"),
                        Some("logit_bias"),
                    ));
                };
                p.logit_bias.push((t, v));
            }
        }
        p.logprobs = self.logprobs(chat)?;
        p.validate().map_err(|e| {
            let msg = e.to_string();
            let param = [
                "min_p",
                "presence_penalty",
                "frequency_penalty",
                "repetition_penalty",
                "logit_bias",
                "top_logprobs",
            ]
            .into_iter()
            .find(|f| msg.contains(f));
            ApiError::bad_request(msg, param)
        })?;
        Ok(p)
    }

    /// Chat: `logprobs: true` with `top_logprobs` alternatives; completions: `logprobs: k`.
    fn logprobs(&self, chat: bool) -> Result<Option<usize>, ApiError> {
        use serde_json::Value;
        let lp = self.logprobs.as_ref().filter(|v| !v.is_null());
        if chat {
            let on = match lp {
                None | Some(Value::Bool(false)) => false,
                Some(Value::Bool(true)) => true,
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "logprobs is true or false on chat completions",
                        Some("logprobs"),
                    ))
                }
            };
            match (on, self.top_logprobs) {
                (false, Some(_)) => Err(ApiError::bad_request(
                    "top_logprobs needs logprobs: true",
                    Some("top_logprobs"),
                )),
                (false, None) => Ok(None),
                (true, t) => {
                    let t = t.unwrap_or(0) as usize;
                    if t > MAX_TOP_LOGPROBS {
                        return Err(ApiError::bad_request(
                            format!("top_logprobs must be 0 to {MAX_TOP_LOGPROBS}, got {t}"),
                            Some("top_logprobs"),
                        ));
                    }
                    Ok(Some(t))
                }
            }
        } else {
            match lp {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(k) if k as usize <= MAX_TOP_LOGPROBS => Ok(Some(k as usize)),
                    _ => Err(ApiError::bad_request(
                        format!("logprobs is a count of alternatives, 0 to {MAX_TOP_LOGPROBS}"),
                        Some("logprobs"),
                    )),
                },
            }
        }
    }

    /// The structured-output constraint of `response_format` or vLLM's `guided_*` /
    /// `structured_outputs` (at most one of them).
    pub fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        use serde_json::Value;
        let mut found: Vec<(&'static str, Option<Constraint>)> = Vec::new();
        if let Some(v) = self.response_format.as_ref().filter(|v| !v.is_null()) {
            found.push(("response_format", response_format(v, "response_format")?));
        }
        if let Some(v) = self.guided_json.as_ref().filter(|v| !v.is_null()) {
            let schema = match v {
                Value::String(s) => serde_json::from_str(s).map_err(|e| {
                    ApiError::bad_request(
                        format!("guided_json is not JSON: {e}"),
                        Some("guided_json"),
                    )
                })?,
                v => v.clone(),
            };
            found.push(("guided_json", Some(Constraint::JsonSchema(schema))));
        }
        if let Some(r) = &self.guided_regex {
            found.push(("guided_regex", Some(Constraint::Regex(r.clone()))));
        }
        if let Some(c) = &self.guided_choice {
            found.push(("guided_choice", Some(Constraint::Choice(c.clone()))));
        }
        if let Some(g) = &self.guided_grammar {
            found.push(("guided_grammar", Some(Constraint::Lark(g.clone()))));
        }
        if let Some(so) = self.structured_outputs.as_ref().filter(|v| !v.is_null()) {
            let Some(o) = so.as_object().filter(|o| o.len() == 1) else {
                return Err(ApiError::bad_request(
                    "structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
                    Some("structured_outputs"),
                ));
            };
            let (k, v) = o.iter().next().expect("one entry");
            let bad = |what: &str| {
                ApiError::bad_request(
                    format!("structured_outputs.{k} {what}"),
                    Some("structured_outputs"),
                )
            };
            let c = match (k.as_str(), v) {
                ("json", Value::String(s)) => Constraint::JsonSchema(
                    serde_json::from_str(s).map_err(|e| bad(&format!("is not JSON: {e}")))?,
                ),
                ("json", v) => Constraint::JsonSchema(v.clone()),
                ("regex", Value::String(r)) => Constraint::Regex(r.clone()),
                ("grammar", Value::String(g)) => Constraint::Lark(g.clone()),
                ("choice", Value::Array(a)) => Constraint::Choice(
                    a.iter()
                        .map(|x| x.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| bad("is a list of strings"))?,
                ),
                ("json_object", Value::Bool(true)) => Constraint::JsonObject,
                _ => return Err(bad("is not one of json, regex, choice, grammar, json_object (with a value of its type)")),
            };
            found.push(("structured_outputs", Some(c)));
        }
        if found.len() > 1 {
            return Err(ApiError::bad_field(
                format!(
                    "one structured-output field per request, got {}",
                    found.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
                ),
                found[1].0,
            ));
        }
        match found.pop() {
            // `response_format` was checked under its own name (also for the other shapes).
            Some(("response_format", c)) => Ok(c),
            Some((field, Some(c))) => Ok(Some(bounded(c, field)?)),
            _ => Ok(None),
        }
    }

    /// The routing session key: `prompt_cache_key`, else `user`.
    pub fn session_key(&self) -> Option<&str> {
        self.prompt_cache_key.as_deref().or(self.user.as_deref())
    }

    /// The request's cache salt: the tenant's, mixed with the client's `cache_salt` if it sent
    /// one (never the client's alone).
    pub fn salt(&self, tenant_salt: &[u8; 32]) -> [u8; 32] {
        match &self.cache_salt {
            None => *tenant_salt,
            Some(c) => {
                let mut h = blake3::Hasher::new_keyed(tenant_salt);
                h.update(b"cachet cache_salt\0");
                h.update(c.as_bytes());
                *h.finalize().as_bytes()
            }
        }
    }
}

/// Longest `cache_salt` accepted.
pub const MAX_CACHE_SALT_BYTES: usize = 256;

impl CompletionRequest {
    /// The prompts: a string, strings, token ids, or lists of token ids.
    pub fn prompts(&self) -> Result<Vec<PromptIn>, ApiError> {
        use serde_json::Value;
        let bad = |m: String| Err(ApiError::bad_request(m, Some("prompt")));
        let tokens = |a: &[Value]| -> Option<Vec<u32>> {
            a.iter()
                .map(|x| x.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect()
        };
        let prompts = match &self.prompt {
            Value::String(s) => vec![PromptIn::Text(s.clone())],
            Value::Array(a) if a.is_empty() => return bad("prompt must not be empty".into()),
            Value::Array(a) if a[0].is_number() => match tokens(a) {
                Some(t) => vec![PromptIn::Tokens(t)],
                None => return bad("a token-id prompt is a list of non-negative integers".into()),
            },
            Value::Array(a) if a[0].is_string() => {
                let mut v = Vec::with_capacity(a.len());
                for x in a {
                    match x.as_str() {
                        Some(s) => v.push(PromptIn::Text(s.to_string())),
                        None => return bad("a batch of prompts is all strings or all token-id lists".into()),
                    }
                }
                v
            }
            Value::Array(a) if a[0].is_array() => {
                let mut v = Vec::with_capacity(a.len());
                for x in a {
                    match x.as_array().and_then(|t| tokens(t)) {
                        Some(t) => v.push(PromptIn::Tokens(t)),
                        None => return bad("a batch of prompts is all strings or all token-id lists".into()),
                    }
                }
                v
            }
            _ => return bad("prompt is a string, a list of strings, a list of token ids or a list of token-id lists".into()),
        };
        if prompts.len() > MAX_PROMPTS {
            return bad(format!(
                "at most {MAX_PROMPTS} prompts in one request, got {}",
                prompts.len()
            ));
        }
        if prompts.iter().any(|p| match p {
            PromptIn::Text(s) => s.is_empty(),
            PromptIn::Tokens(t) => t.is_empty(),
        }) {
            return bad("every prompt must be non-empty".into());
        }
        Ok(prompts)
    }
}

#[cfg(test)]
mod tests;
