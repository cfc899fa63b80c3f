//! OpenAI's chat-completions and completions shapes of a response ([`OpenAiRender`]): the
//! whole JSON answer and its server-sent events.

use cachet_backend::request::{FinishReason, Usage};
use cachet_backend::sampler::RowLogprobs;
use cachet_backend::tokenizer::TextTokenizer;
use serde::Serialize;

use crate::http::{self, ApiError};
use crate::server::tools::Call;

use super::*;

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
            "id": crate::server::tools::call_id("call_", &meta.id, i, k),
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
