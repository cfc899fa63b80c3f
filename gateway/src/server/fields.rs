//! Every field of OpenAI's chat-completions and completions request bodies (and the vLLM and
//! Cachet extensions Cachet takes), with what Cachet does with it. One table drives the check of
//! every request (a field not in it is unknown: refused, or let through with a warning header
//! where the deployment allows it), the docs' table (`docs/API.md`, generated from it and checked
//! against it by a test), and the test that sends every field to a real server.

/// Which endpoint a field belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Chat,
    Completions,
    Both,
}

impl On {
    pub fn includes(self, chat: bool) -> bool {
        match self {
            On::Both => true,
            On::Chat => chat,
            On::Completions => !chat,
        }
    }
}

/// What Cachet does with a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works as documented (the note says how, and which values are refused).
    Works,
    /// Refused by name whenever it is present with a value other than its no-op (the note says
    /// what to do instead).
    Refused,
}

#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: &'static str,
    pub on: On,
    pub status: Status,
    /// Where it comes from: `openai`, `vllm` (an extension vLLM defined) or `cachet`.
    pub origin: &'static str,
    pub note: &'static str,
    /// A value to send it with in the table's test (a refused field: one that is refused).
    pub sample: &'static str,
}

const fn f(
    name: &'static str,
    on: On,
    status: Status,
    origin: &'static str,
    note: &'static str,
    sample: &'static str,
) -> Field {
    Field {
        name,
        on,
        status,
        origin,
        note,
        sample,
    }
}

use On::{Both, Chat, Completions};
use Status::{Refused, Works};

/// The table, in the order of the docs.
pub const FIELDS: &[Field] = &[
    f("model", Both, Works, "openai", "Must name the served model (`GET /v1/models`); 404 otherwise, 403 when the tenant may not use it.", r#""smollm2""#),
    f("messages", Chat, Works, "openai", "Roles `system`, `developer` (as system), `user`, `assistant`; content a string or `text` parts. Other roles, part types and message fields are refused by name.", r#"[{"role":"user","content":"Hi"}]"#),
    f("prompt", Completions, Works, "openai", "A string, a list of strings (a batch), a list of token ids, or a list of token-id lists (a batch); up to 64 prompts.", r#"[[1, 2, 3]]"#),
    f("max_tokens", Both, Works, "openai", "At least 1; at most what the model's length leaves after the prompt (400 names both).", "3"),
    f("max_completion_tokens", Chat, Works, "openai", "As `max_tokens` (wins when both are sent).", "3"),
    f("temperature", Both, Works, "openai", "0 to 2; 0 is greedy. Default 1.", "0.5"),
    f("top_p", Both, Works, "openai", "(0, 1]. Default 1.", "0.9"),
    f("n", Both, Works, "openai", "1 to 16 choices; the prompt is prefilled once and its KV blocks shared by the choices. Usage counts the prompt once.", "2"),
    f("stream", Both, Works, "openai", "Server-sent events as OpenAI sends them.", "true"),
    f("stream_options", Both, Works, "openai", "`include_usage` works; other keys are refused.", r#"{"include_usage":true}"#),
    f("stop", Both, Works, "openai", "Up to 4 strings of at most 256 bytes; the text stops before the first found.", r#"["\n\n"]"#),
    f("seed", Both, Works, "openai", "Reproducible sampling whatever else runs in the batch (each choice of `n` gets its own stream of draws; choice 0 equals `n` = 1).", "7"),
    f("presence_penalty", Both, Works, "openai", "-2 to 2, subtracted once from each token already generated.", "0.5"),
    f("frequency_penalty", Both, Works, "openai", "-2 to 2, subtracted per occurrence in the output.", "0.5"),
    f("logit_bias", Both, Works, "openai", "Token id (as a string) → -100 to 100, added to its logit; up to 1024 entries, ids inside the vocabulary.", r#"{"1": -100}"#),
    f("logprobs", Chat, Works, "openai", "`true`: each token's log-probability and bytes, in streams too (after `logit_bias` and penalties, before temperature).", "true"),
    f("top_logprobs", Chat, Works, "openai", "0 to 20 alternatives per token; needs `logprobs: true`.", "2"),
    f("logprobs", Completions, Works, "openai", "0 to 20: the chosen token's log-probability and that many alternatives.", "2"),
    f("user", Both, Works, "openai", "The session key for routing (`session` policy; one user's turns go to one worker); at most 256 bytes.", r#""user-7""#),
    f("prompt_cache_key", Both, Works, "openai", "As `user` for routing (wins over it): requests with one key go to the worker holding their prefix.", r#""conversation-9""#),
    f("store", Chat, Works, "openai", "Only `false`: Cachet stores no completions.", "false"),
    f("service_tier", Both, Works, "openai", "Only `auto` or `default`: there is one tier; the response says `default`.", r#""auto""#),
    f("modalities", Chat, Works, "openai", "Only `[\"text\"]`.", r#"["text"]"#),
    f("echo", Completions, Works, "openai", "Only `false`: prompt text and log-probabilities are not echoed.", "false"),
    f("tools", Chat, Refused, "openai", "Tool calling is not served yet; leave `tools` out (or send an empty list).", r#"[{"type":"function","function":{"name":"f","parameters":{}}}]"#),
    f("tool_choice", Chat, Refused, "openai", "Only with tools, which are not served yet; `none` is accepted.", r#""required""#),
    f("parallel_tool_calls", Chat, Refused, "openai", "Only with tools, which are not served yet.", "true"),
    f("functions", Chat, Refused, "openai", "Deprecated by OpenAI for `tools`, which are not served yet.", r#"[{"name":"f","parameters":{}}]"#),
    f("function_call", Chat, Refused, "openai", "Deprecated by OpenAI for `tool_choice`; `none` is accepted.", r#""auto""#),
    f("response_format", Both, Refused, "openai", "Structured outputs are not served yet; only `{\"type\": \"text\"}` is accepted.", r#"{"type":"json_object"}"#),
    f("audio", Chat, Refused, "openai", "The served model makes text only.", r#"{"voice":"alloy","format":"wav"}"#),
    f("prediction", Chat, Refused, "openai", "Predicted outputs are not served; Cachet speculates from the prompt on its own (n-gram).", r#"{"type":"content","content":"x"}"#),
    f("reasoning_effort", Chat, Refused, "openai", "The served model has no reasoning mode.", r#""low""#),
    f("verbosity", Chat, Refused, "openai", "The served model has no verbosity control; say it in the prompt.", r#""low""#),
    f("web_search_options", Chat, Refused, "openai", "Cachet does not search the web.", "{}"),
    f("metadata", Chat, Refused, "openai", "Only for stored completions, which Cachet does not keep.", r#"{"k":"v"}"#),
    f("safety_identifier", Both, Refused, "openai", "Cachet runs no abuse monitoring that could use it; use `user` for routing.", r#""u1""#),
    f("best_of", Completions, Refused, "openai", "Server-side best-of is not served; ask for `n` choices with `logprobs` and pick.", "2"),
    f("suffix", Completions, Refused, "openai", "Insertion (fill-in-the-middle) is not served.", r#""end""#),
    f("top_k", Both, Works, "vllm", "Keep the k most likely tokens; 0 or -1 is off.", "5"),
    f("min_p", Both, Works, "vllm", "0 to 1: keep tokens at least this likely relative to the most likely.", "0.05"),
    f("repetition_penalty", Both, Works, "vllm", "(0, 10]: tokens of the prompt or output have positive logits divided by it, negative multiplied; 1 is off.", "1.1"),
    f("min_tokens", Both, Works, "vllm", "Stop tokens and stop strings do not end the output before this many tokens; at most `max_tokens`.", "2"),
    f("stop_token_ids", Both, Works, "vllm", "Up to 64 more token ids that end the output (the model's end tokens always do, unless `ignore_eos`).", "[2]"),
    f("ignore_eos", Both, Works, "vllm", "Generate `max_tokens` whatever the model says (benchmarks).", "true"),
    f("cache_salt", Both, Works, "vllm", "1 to 256 bytes: requests share cached prefixes only with the same tenant and the same salt.", r#""s1""#),
    f("template", Chat, Works, "cachet", "The tenant's prompt template to render the messages with (the tenant's default otherwise).", "null"),
    f("template_variables", Chat, Works, "cachet", "String variables for the template.", "null"),
];

/// The field `name` of the chat (`chat`) or completions endpoint.
pub fn lookup(name: &str, chat: bool) -> Option<&'static Field> {
    FIELDS
        .iter()
        .find(|f| f.name == name && f.on.includes(chat))
}

/// The docs' table (the body of `docs/API.md`'s "Request fields" section).
pub fn markdown_table() -> String {
    let mut s = String::from(
        "| Field | Endpoint | Origin | Status | What Cachet does |\n|---|---|---|---|---|\n",
    );
    for f in FIELDS {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            f.name,
            match f.on {
                Both => "both",
                Chat => "chat",
                Completions => "completions",
            },
            f.origin,
            match f.status {
                Works => "works",
                Refused => "refused",
            },
            f.note.replace('|', "\\|"),
        ));
    }
    s
}

/// What a deployment does with request fields outside the table (`--unknown-fields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UnknownFields {
    /// 400 naming the field, as OpenAI does.
    #[default]
    Reject,
    /// Let the request through; the response's `x-cachet-warning` header names what was
    /// ignored.
    Warn,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_listed_once_per_endpoint_with_a_parseable_sample() {
        for chat in [true, false] {
            let mut seen = std::collections::BTreeSet::new();
            for f in FIELDS.iter().filter(|f| f.on.includes(chat)) {
                assert!(seen.insert(f.name), "{} twice", f.name);
                serde_json::from_str::<serde_json::Value>(f.sample)
                    .unwrap_or_else(|e| panic!("{}: {e}", f.name));
                assert!(!f.note.is_empty());
            }
        }
        assert_eq!(lookup("logprobs", true).unwrap().sample, "true");
        assert_eq!(lookup("logprobs", false).unwrap().sample, "2");
        assert!(lookup("messages", false).is_none());
    }

    #[test]
    fn the_docs_carry_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/API.md");
        let docs = std::fs::read_to_string(path).unwrap();
        let (start, end) = ("<!-- fields:start -->\n", "<!-- fields:end -->");
        let (a, b) = (
            docs.find(start).expect("the start marker") + start.len(),
            docs.find(end).expect("the end marker"),
        );
        if std::env::var_os("CACHET_BLESS").is_some() {
            let new = format!("{}{}{}", &docs[..a], markdown_table(), &docs[b..]);
            std::fs::write(path, new).unwrap();
            return;
        }
        assert_eq!(
            docs[a..b],
            markdown_table(),
            "docs/API.md is out of date with server/fields.rs: regenerate it with \
             `CACHET_BLESS=1 cargo test -p cachet-gateway the_docs_carry_the_table`"
        );
    }
}
