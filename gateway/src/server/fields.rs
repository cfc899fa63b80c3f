//! Every field of OpenAI's chat-completions and completions request bodies (and the vLLM and
//! Cachet extensions Cachet takes), with what Cachet does with it. One table drives the check of
//! every request (a field not in it is unknown: refused, or let through with a warning header
//! where the deployment allows it), the docs' table (`docs/API.md`, generated from it and checked
//! against it by a test), and the test that sends every field to a real server.

/// The request bodies Cachet takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/messages` (Anthropic's Messages API)
    Messages,
    /// `POST /v1/responses` (OpenAI's Responses API)
    Responses,
}

impl Api {
    pub const ALL: [Api; 4] = [Api::Chat, Api::Completions, Api::Messages, Api::Responses];
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Messages => "messages",
            Api::Responses => "responses",
        }
    }
}

/// Which endpoints a field belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct On(pub &'static [Api]);

impl On {
    pub fn includes(self, api: Api) -> bool {
        self.0.contains(&api)
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

const BOTH: On = On(&[Api::Chat, Api::Completions]);
const CHAT: On = On(&[Api::Chat]);
const COMPLETIONS: On = On(&[Api::Completions]);
const MESSAGES: On = On(&[Api::Messages]);
const RESPONSES: On = On(&[Api::Responses]);
use Status::{Refused, Works};

/// The table, in the order of the docs.
pub const FIELDS: &[Field] = &[
    f("model", BOTH, Works, "openai", "Must name the served model (`GET /v1/models`); 404 otherwise, 403 when the tenant may not use it.", r#""smollm2""#),
    f("messages", CHAT, Works, "openai", "Roles `system`, `developer` (as system), `user`, `assistant` (with `tool_calls` and `reasoning_content`, content null or text), `tool` (with `tool_call_id`); `name` on any; content a string or `text` parts. Names and thinking go to the chat template, which renders or drops them. Other roles, part types and message fields are refused by name.", r#"[{"role":"user","content":"Hi"}]"#),
    f("prompt", COMPLETIONS, Works, "openai", "A string, a list of strings (a batch), a list of token ids, or a list of token-id lists (a batch); up to 64 prompts.", r#"[[1, 2, 3]]"#),
    f("max_tokens", BOTH, Works, "openai", "At least 1; at most what the model's length leaves after the prompt (400 names both).", "3"),
    f("max_completion_tokens", CHAT, Works, "openai", "As `max_tokens` (wins when both are sent).", "3"),
    f("temperature", BOTH, Works, "openai", "0 to 2; 0 is greedy. Default 1.", "0.5"),
    f("top_p", BOTH, Works, "openai", "(0, 1]. Default 1.", "0.9"),
    f("n", BOTH, Works, "openai", "1 to 16 choices; the prompt is prefilled once and its KV blocks shared by the choices. Usage counts the prompt once.", "2"),
    f("stream", BOTH, Works, "openai", "Server-sent events as OpenAI sends them.", "true"),
    f("stream_options", BOTH, Works, "openai", "`include_usage` works; other keys are refused.", r#"{"include_usage":true}"#),
    f("stop", BOTH, Works, "openai", "Up to 4 strings of at most 256 bytes; the text stops before the first found.", r#"["\n\n"]"#),
    f("seed", BOTH, Works, "openai", "Reproducible sampling whatever else runs in the batch (each choice of `n` gets its own stream of draws; choice 0 equals `n` = 1).", "7"),
    f("presence_penalty", BOTH, Works, "openai", "-2 to 2, subtracted once from each token already generated.", "0.5"),
    f("frequency_penalty", BOTH, Works, "openai", "-2 to 2, subtracted per occurrence in the output.", "0.5"),
    f("logit_bias", BOTH, Works, "openai", "Token id (as a string) → -100 to 100, added to its logit; up to 1024 entries, ids inside the vocabulary.", r#"{"1": -100}"#),
    f("logprobs", CHAT, Works, "openai", "`true`: each token's log-probability and bytes, in streams too (after `logit_bias` and penalties, before temperature).", "true"),
    f("top_logprobs", CHAT, Works, "openai", "0 to 20 alternatives per token; needs `logprobs: true`.", "2"),
    f("logprobs", COMPLETIONS, Works, "openai", "0 to 20: the chosen token's log-probability and that many alternatives.", "2"),
    f("user", BOTH, Works, "openai", "The session key for routing (`session` policy; one user's turns go to one worker); at most 256 bytes.", r#""user-7""#),
    f("prompt_cache_key", BOTH, Works, "openai", "As `user` for routing (wins over it): requests with one key go to the worker holding their prefix.", r#""conversation-9""#),
    f("store", CHAT, Works, "openai", "Only `false`: Cachet stores no completions.", "false"),
    f("service_tier", BOTH, Works, "openai", "Only `auto` or `default`: there is one tier; the response says `default`.", r#""auto""#),
    f("modalities", CHAT, Works, "openai", "Only `[\"text\"]`.", r#"["text"]"#),
    f("echo", COMPLETIONS, Works, "openai", "Only `false`: prompt text and log-probabilities are not echoed.", "false"),
    f("tools", CHAT, Works, "openai", "Function tools (up to 128), rendered by the model's chat template (`--chat-template` gives a model one); calls parsed from the output in the model's format (`--tool-parser`: hermes, llama3_json, mistral) into `tool_calls`, streamed as deltas. A model served without a tool format refuses them (400). `strict: true` holds a call's arguments to the schema: under `required` or a named function from the first token; under `auto` (the OpenAI Agents SDK's and pydantic-ai's default) the model may answer in text, and once it opens a call the call follows the schema.", r#"[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}]"#),
    f("tool_choice", CHAT, Works, "openai", "`auto` (default with tools), `none` (the functions are not shown), `required` (one call or more) or `{\"type\": \"function\", \"function\": {\"name\": …}}` (that call); `required` and a named function are enforced by grammar-constrained decoding, arguments under the function's schema.", r#""required""#),
    f("chat_template_kwargs", CHAT, Works, "vllm", "Extra variables for the model's chat template, e.g. `{\"enable_thinking\": false}` for Qwen3; the names the server sets (`messages`, `tools`, `add_generation_prompt`, `bos_token`, `eos_token`) are refused.", r#"{"enable_thinking":false}"#),
    f("parallel_tool_calls", CHAT, Works, "openai", "Default true; `false`: at most one call per answer (the grammar allows one; in `auto`, calls after the first are dropped).", "false"),
    f("functions", CHAT, Refused, "openai", "Deprecated by OpenAI: send `tools`.", r#"[{"name":"f","parameters":{}}]"#),
    f("function_call", CHAT, Refused, "openai", "Deprecated by OpenAI: send `tool_choice`; `none` is accepted.", r#""auto""#),
    f("response_format", BOTH, Works, "openai", "`text`, `json_object` (any JSON object) or `json_schema` (`strict` true or false: the schema is enforced either way, by grammar-constrained decoding with llguidance). A schema that does not compile is a 400.", r#"{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}"#),
    f("audio", CHAT, Refused, "openai", "The served model makes text only.", r#"{"voice":"alloy","format":"wav"}"#),
    f("prediction", CHAT, Refused, "openai", "Predicted outputs are not served; Cachet speculates from the prompt on its own (n-gram).", r#"{"type":"content","content":"x"}"#),
    f("reasoning_effort", CHAT, Refused, "openai", "No effort levels are served; a thinking template is switched with `chat_template_kwargs` (`{\"enable_thinking\": false}`), its thinking comes back as `reasoning_content`.", r#""low""#),
    f("verbosity", CHAT, Refused, "openai", "The served model has no verbosity control; say it in the prompt.", r#""low""#),
    f("web_search_options", CHAT, Refused, "openai", "Cachet does not search the web.", "{}"),
    f("metadata", CHAT, Refused, "openai", "Only for stored completions, which Cachet does not keep.", r#"{"k":"v"}"#),
    f("safety_identifier", BOTH, Refused, "openai", "Cachet runs no abuse monitoring that could use it; use `user` for routing.", r#""u1""#),
    f("best_of", COMPLETIONS, Refused, "openai", "Server-side best-of is not served; ask for `n` choices with `logprobs` and pick.", "2"),
    f("suffix", COMPLETIONS, Refused, "openai", "Insertion (fill-in-the-middle) is not served.", r#""end""#),
    f("guided_json", BOTH, Works, "vllm", "A JSON schema (object or its text) the output follows; one structured-output field per request.", r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}"#),
    f("guided_regex", BOTH, Works, "vllm", "A regular expression (Rust `regex` syntax) the whole output matches.", r#""[0-9]{3}""#),
    f("guided_choice", BOTH, Works, "vllm", "The output is exactly one of these strings.", r#"["yes","no"]"#),
    f("guided_grammar", BOTH, Works, "vllm", "A grammar in llguidance's Lark syntax the output follows.", r#""start: \"ok\"""#),
    f("structured_outputs", BOTH, Works, "vllm", "vLLM's newer form: one of `json`, `regex`, `choice`, `grammar`, `json_object`.", r#"{"choice":["yes","no"]}"#),
    f("top_k", BOTH, Works, "vllm", "Keep the k most likely tokens; 0 or -1 is off.", "5"),
    f("min_p", BOTH, Works, "vllm", "0 to 1: keep tokens at least this likely relative to the most likely.", "0.05"),
    f("repetition_penalty", BOTH, Works, "vllm", "(0, 10]: tokens of the prompt or output have positive logits divided by it, negative multiplied; 1 is off.", "1.1"),
    f("min_tokens", BOTH, Works, "vllm", "Stop tokens and stop strings do not end the output before this many tokens; at most `max_tokens`.", "2"),
    f("stop_token_ids", BOTH, Works, "vllm", "Up to 64 more token ids that end the output (the model's end tokens always do, unless `ignore_eos`).", "[2]"),
    f("ignore_eos", BOTH, Works, "vllm", "Generate `max_tokens` whatever the model says (benchmarks).", "true"),
    f("cache_salt", BOTH, Works, "vllm", "1 to 256 bytes: requests share cached prefixes only with the same tenant and the same salt.", r#""s1""#),
    f("model", MESSAGES, Works, "anthropic", "Must name the served model; 404 otherwise, 403 when the tenant may not use it.", r#""smollm2""#),
    f("messages", MESSAGES, Works, "anthropic", "Roles `user` and `assistant`; content a string or blocks: `text`, `tool_use` (assistant), `tool_result` (user; `is_error` results are shown to the model as `Error: …`). `thinking` (assistant; the message's `reasoning_content`, which the chat template keeps or drops) and `redacted_thinking` (assistant; left out). Image and document blocks are refused by name.", r#"[{"role":"user","content":"Hi"}]"#),
    f("max_tokens", MESSAGES, Works, "anthropic", "Required, as Anthropic requires it: at least 1, at most what the model's length leaves after the prompt.", "3"),
    f("system", MESSAGES, Works, "anthropic", "A string or `text` blocks: the system message.", r#""Be brief.""#),
    f("stop_sequences", MESSAGES, Works, "anthropic", "Up to 4 strings of at most 256 bytes; `stop_reason: stop_sequence` and `stop_sequence` name the one found.", r#"["\n\n"]"#),
    f("stream", MESSAGES, Works, "anthropic", "Anthropic's events: message_start, content_block_start, ping, content_block_delta, content_block_stop, message_delta, message_stop.", "true"),
    f("temperature", MESSAGES, Works, "anthropic", "0 to 1 (Anthropic's range); default 1. Current SDKs send it through `extra_body`.", "0.5"),
    f("top_p", MESSAGES, Works, "anthropic", "(0, 1].", "0.9"),
    f("top_k", MESSAGES, Works, "anthropic", "Keep the k most likely tokens; 0 is off.", "5"),
    f("metadata", MESSAGES, Works, "anthropic", "`user_id` (at most 256 bytes) is the routing session key; other keys are refused.", r#"{"user_id":"u-1"}"#),
    f("service_tier", MESSAGES, Works, "anthropic", "`auto` or `standard_only`: there is one tier.", r#""auto""#),
    f("cache_control", MESSAGES, Works, "anthropic", "`{\"type\": \"ephemeral\"}` (with an optional `ttl`) is taken: every prompt prefix is cached anyway, blocks' `cache_control` too.", r#"{"type":"ephemeral"}"#),
    f("speed", MESSAGES, Works, "anthropic", "Only `standard`: there is one speed.", r#""standard""#),
    f("output_config", MESSAGES, Works, "anthropic", "`format` (`{\"type\": \"json_schema\", \"schema\": …}`) is enforced by grammar-constrained decoding; `effort` is refused (no reasoning mode).", r#"{"format":{"type":"json_schema","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}"#),
    f("diagnostics", MESSAGES, Refused, "anthropic", "Cache-miss diagnostics are not served; `usage.cache_read_input_tokens` says what was cached.", r#"{"previous_message_id":"msg_1"}"#),
    f("inference_geo", MESSAGES, Refused, "anthropic", "Requests run where the host runs Cachet.", r#""us""#),
    f("user_profile_id", MESSAGES, Refused, "anthropic", "Tenants are the host's API keys; use `metadata.user_id` for routing.", r#""up_1""#),
    f("workspace_id", MESSAGES, Refused, "anthropic", "Tenants are the host's API keys.", r#""ws_1""#),
    f("tools", MESSAGES, Works, "anthropic", "Client tools (`name`, `description`, `input_schema`, `strict`), as chat's function tools; calls come back as `tool_use` blocks with `stop_reason: tool_use`, streamed as `input_json_delta`. Server tools (web search, code execution, …) are refused by name.", r#"[{"name":"f","input_schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}]"#),
    f("tool_choice", MESSAGES, Works, "anthropic", "`auto`, `any` (a call is enforced), `tool` with `name` (that call, enforced), `none`; `disable_parallel_tool_use` as chat's `parallel_tool_calls: false`.", r#"{"type":"any"}"#),
    f("thinking", MESSAGES, Works, "anthropic", "Sets the chat template's `enable_thinking` (Qwen3-style templates; others do not read it): `{\"type\": \"adaptive\"}` on, `{\"type\": \"disabled\"}` off; the thinking comes back as `thinking` blocks (empty `signature`). `enabled` with a `budget_tokens` is refused: nothing here holds the thinking to a budget.", r#"{"type":"adaptive"}"#),
    f("container", MESSAGES, Refused, "anthropic", "Cachet runs no code containers.", r#""c1""#),
    f("mcp_servers", MESSAGES, Refused, "anthropic", "Cachet connects to no MCP servers.", r#"[{"type":"url","url":"http://x","name":"x"}]"#),
    f("context_management", MESSAGES, Refused, "anthropic", "Context editing is not served.", "{}"),
    f("model", RESPONSES, Works, "openai", "Must name the served model; 404 otherwise, 403 when the tenant may not use it.", r#""smollm2""#),
    f("input", RESPONSES, Works, "openai", "A string, or items: messages (`role` user, assistant, system or developer; content a string or `input_text` / `output_text` parts), `function_call`, `function_call_output`, and `reasoning` (an earlier output's, sent back: the next assistant turn's thinking, which the chat template keeps or drops). Other item and part types are refused by name.", r#"[{"role":"user","content":"Hi"}]"#),
    f("instructions", RESPONSES, Works, "openai", "The system message.", r#""Be brief.""#),
    f("max_output_tokens", RESPONSES, Works, "openai", "At least 1; at most what the model's length leaves after the prompt.", "3"),
    f("temperature", RESPONSES, Works, "openai", "0 to 2; default 1.", "0.5"),
    f("top_p", RESPONSES, Works, "openai", "(0, 1].", "0.9"),
    f("stream", RESPONSES, Works, "openai", "The Responses events: response.created, response.in_progress, output_item / content_part added, response.output_text.delta, the matching done events, response.completed.", "true"),
    f("user", RESPONSES, Works, "openai", "The routing session key; at most 256 bytes.", r#""user-7""#),
    f("prompt_cache_key", RESPONSES, Works, "openai", "As `user` for routing (wins over it).", r#""conversation-9""#),
    f("service_tier", RESPONSES, Works, "openai", "Only `auto` or `default`.", r#""auto""#),
    f("truncation", RESPONSES, Works, "openai", "Only `disabled`: a prompt too long for the model is a 400.", r#""disabled""#),
    f("text", RESPONSES, Works, "openai", "`format`: `text`, `json_object` or `json_schema` (`name`, `schema`, `strict`), enforced by grammar-constrained decoding.", r#"{"format":{"type":"json_schema","name":"n","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}"#),
    f("store", RESPONSES, Refused, "openai", "Cachet is stateless: it stores no responses; send `store: false`.", "true"),
    f("previous_response_id", RESPONSES, Refused, "openai", "Cachet is stateless: send the conversation in `input`.", r#""resp_1""#),
    f("conversation", RESPONSES, Refused, "openai", "Cachet is stateless: send the conversation in `input`.", r#""conv_1""#),
    f("background", RESPONSES, Refused, "openai", "Background responses need stored state; `false` is accepted.", "true"),
    f("tools", RESPONSES, Works, "openai", "Function tools (`name`, `description`, `parameters`, `strict`), as chat's; calls come back as `function_call` output items, streamed with `response.function_call_arguments.delta`. `strict` is false unless sent (true holds the arguments to the schema, under `auto` once a call opens). Hosted tools are refused by name.", r#"[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}]"#),
    f("tool_choice", RESPONSES, Works, "openai", "`auto`, `none`, `required` or `{\"type\": \"function\", \"name\": …}`, as chat's (the last two enforced).", r#""required""#),
    f("parallel_tool_calls", RESPONSES, Works, "openai", "As chat's.", "false"),
    f("max_tool_calls", RESPONSES, Works, "openai", "At least 1: at most this many calls per answer (enforced under `required`; in `auto`, later calls are dropped).", "2"),
    f("reasoning", RESPONSES, Refused, "openai", "No effort levels or summaries are served; a thinking template's thinking comes back as a `reasoning` item (`reasoning_text` content).", r#"{"effort":"low"}"#),
    f("include", RESPONSES, Refused, "openai", "No extra output is served; an empty list is accepted.", r#"["reasoning.encrypted_content"]"#),
    f("metadata", RESPONSES, Refused, "openai", "Only for stored responses, which Cachet does not keep.", r#"{"k":"v"}"#),
    f("prompt", RESPONSES, Refused, "openai", "Stored prompt templates are OpenAI's; Cachet tenants upload theirs as WebAssembly (`/v1/templates`).", r#"{"id":"pmpt_1"}"#),
    f("safety_identifier", RESPONSES, Refused, "openai", "Cachet runs no abuse monitoring that could use it; use `user` for routing.", r#""u1""#),
    f("template", CHAT, Works, "cachet", "The tenant's prompt template to render the messages with (the tenant's default otherwise).", "null"),
    f("template_variables", CHAT, Works, "cachet", "String variables for the template.", "null"),
];

/// The field `name` of `api`'s request body.
pub fn lookup(name: &str, api: Api) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.name == name && f.on.includes(api))
}

/// The docs' table (the body of `docs/API.md`'s "Request fields" section).
pub fn markdown_table() -> String {
    let mut s = String::from(
        "| Field | Endpoints | Origin | Status | What Cachet does |\n|---|---|---|---|---|\n",
    );
    for f in FIELDS {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            f.name,
            f.on.0
                .iter()
                .map(|a| a.name())
                .collect::<Vec<_>>()
                .join(", "),
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
        for api in Api::ALL {
            let mut seen = std::collections::BTreeSet::new();
            for f in FIELDS.iter().filter(|f| f.on.includes(api)) {
                assert!(seen.insert(f.name), "{} twice", f.name);
                serde_json::from_str::<serde_json::Value>(f.sample)
                    .unwrap_or_else(|e| panic!("{}: {e}", f.name));
                assert!(!f.note.is_empty());
            }
        }
        assert_eq!(lookup("logprobs", Api::Chat).unwrap().sample, "true");
        assert_eq!(lookup("logprobs", Api::Completions).unwrap().sample, "2");
        assert!(lookup("messages", Api::Completions).is_none());
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
