//! The OpenAI request shapes Cachet accepts, validated into engine parameters. Unsupported
//! parameters are refused by name instead of being ignored.

use serde::Deserialize;

use crate::http::ApiError;
use cachet_backend::tokenizer::ChatMessage;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by chat and text completions.
#[derive(Debug, Deserialize)]
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
    pub n: Option<u32>,
    pub logprobs: Option<serde_json::Value>,
    pub tools: Option<serde_json::Value>,
    /// Generate `max_tokens` whatever the model says (vLLM's extra parameter; for benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
    /// vLLM's `cache_salt`: requests share cached prefixes only with requests of the same
    /// tenant *and* the same salt (a client's own isolation, within the tenant's).
    pub cache_salt: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    pub content: serde_json::Value,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessageIn>,
    /// The tenant's template to render the messages with (Cachet extension; `extra_body` in
    /// the OpenAI client). Without it the tenant's `default_template` applies, if any.
    pub template: Option<String>,
    /// Variables for the template (Cachet extension).
    pub template_variables: Option<std::collections::BTreeMap<String, String>>,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: serde_json::Value,
    #[serde(flatten)]
    pub common: Common,
}

/// What a request asks for: a chat's messages or a completion's prompt.
pub enum Input {
    Chat(ChatRequest, Vec<ChatMessage>),
    Text(CompletionRequest, String),
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
}

/// Parses and validates the body of `/v1/chat/completions` (`chat`) or `/v1/completions`: any
/// bytes give a request or a 400 that names what to fix (the `request` fuzz target holds it to
/// that).
pub fn parse_request(chat: bool, body: &[u8]) -> Result<Parsed, ApiError> {
    let input = if chat {
        let r: ChatRequest = crate::http::parse_json(body)?;
        let msgs = r.messages()?;
        Input::Chat(r, msgs)
    } else {
        let r: CompletionRequest = crate::http::parse_json(body)?;
        let p = r.prompt()?;
        Input::Text(r, p)
    };
    let (max_tokens, stop) = input.common().validate()?;
    Ok(Parsed {
        input,
        max_tokens,
        stop,
    })
}

impl Common {
    /// Checks what the engine cannot do and returns (max_tokens, stop strings).
    pub fn validate(&self) -> Result<(Option<u64>, Vec<String>), ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_request(
                "n > 1 is not supported; send separate requests",
                Some("n"),
            ));
        }
        if self
            .logprobs
            .as_ref()
            .is_some_and(|v| !v.is_null() && v != &serde_json::Value::Bool(false))
        {
            return Err(ApiError::bad_request(
                "logprobs are not supported",
                Some("logprobs"),
            ));
        }
        if self.tools.is_some() {
            return Err(ApiError::bad_request(
                "tools are not supported",
                Some("tools"),
            ));
        }
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
                Some("max_tokens"),
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
        Ok((max, stop))
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

impl ChatRequest {
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        self.messages
            .iter()
            .map(|m| {
                if !["system", "user", "assistant", "developer"].contains(&m.role.as_str()) {
                    return Err(ApiError::bad_request(
                        format!("unsupported role `{}`", m.role),
                        Some("messages"),
                    ));
                }
                let text = match &m.content {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Array(parts) => parts
                        .iter()
                        .map(|p| {
                            match (
                                p.get("type").and_then(|t| t.as_str()),
                                p.get("text").and_then(|t| t.as_str()),
                            ) {
                                (Some("text"), Some(t)) => Ok(t.to_string()),
                                _ => Err(ApiError::bad_request(
                                    "only text content parts are supported",
                                    Some("messages"),
                                )),
                            }
                        })
                        .collect::<Result<Vec<_>, _>>()?
                        .join(""),
                    _ => {
                        return Err(ApiError::bad_request(
                            "message content must be a string or text parts",
                            Some("messages"),
                        ))
                    }
                };
                Ok(ChatMessage::new(
                    if m.role == "developer" {
                        "system"
                    } else {
                        m.role.as_str()
                    },
                    text,
                ))
            })
            .collect()
    }
}

impl CompletionRequest {
    pub fn prompt(&self) -> Result<String, ApiError> {
        match &self.prompt {
            serde_json::Value::String(s) if !s.is_empty() => Ok(s.clone()),
            serde_json::Value::Array(a)
                if a.len() == 1 && a[0].as_str().is_some_and(|s| !s.is_empty()) =>
            {
                Ok(a[0].as_str().unwrap_or_default().to_string())
            }
            _ => Err(ApiError::bad_request(
                "prompt must be one non-empty string",
                Some("prompt"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(cache_salt: Option<&str>) -> Common {
        let mut v = serde_json::json!({"model": "m"});
        if let Some(c) = cache_salt {
            v["cache_salt"] = c.into();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_client_cache_salt_splits_its_tenant_and_never_joins_another() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        assert_eq!(common(None).salt(&a), a);
        let x = common(Some("user-7"));
        assert_ne!(x.salt(&a), a, "the client's salt splits the tenant's cache");
        assert_eq!(x.salt(&a), common(Some("user-7")).salt(&a));
        assert_ne!(x.salt(&a), common(Some("user-8")).salt(&a));
        assert_ne!(
            x.salt(&a),
            x.salt(&b),
            "the same client salt in two tenants stays apart"
        );
        assert!(common(Some("")).validate().is_err());
        assert!(common(Some(&"x".repeat(300))).validate().is_err());
    }
}
