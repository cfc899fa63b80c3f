//! The request surface against a real `cachet serve` (SmolLM2 on the CPU): every row of the
//! field table (`server/fields.rs`, `docs/API.md`) sent as its sample — a field that works gets
//! a 200, a refused one a 400 naming it — unknown fields refused or, under `--unknown-fields
//! warn`, named in a warning header; token-id prompts equal their text; then the official
//! `openai` client through n, logprobs, the processors and the refusals
//! (`tests/python/openai_api_check.py`); the official `anthropic` client through the Messages
//! API and `openai` through the Responses API (`tests/python/anthropic_check.py`); tool calling
//! through all three with a ChatML template that renders tools (`tests/python/tools_check.py`).

use cachet_gateway::server::fields::{Api, Status, FIELDS};
use cachet_tests::curl_status;

use super::common::*;

fn config() -> String {
    format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-test-acme")
    )
}

/// Our ChatML template with tools (Hermes-format calls), for SmolLM2.
const TOOLS_TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/chat-templates/chatml-tools.jinja"
);

fn post(base: &str, path: &str, body: &serde_json::Value, headers: bool) -> (u16, String) {
    let url = format!("{base}{path}");
    let b = body.to_string();
    let mut args = vec![
        "-H",
        "Authorization: Bearer sk-test-acme",
        "-H",
        "Content-Type: application/json",
        "-d",
        &b,
    ];
    if headers {
        args.push("-i");
    }
    args.push(&url);
    curl_status(&args)
}

#[test]
fn every_field_of_the_table_works_or_is_refused_by_name() {
    let (_server, base) = start_with(&config(), &["--chat-template", TOOLS_TEMPLATE]);
    for api in Api::ALL {
        let path = api.path();
        let msgs = serde_json::json!([{"role": "user", "content": "Hi"}]);
        let base_body = match api {
            Api::Chat | Api::Messages => {
                serde_json::json!({"model": "smollm2", "messages": msgs, "max_tokens": 3, "temperature": 0})
            }
            Api::Completions => {
                serde_json::json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 3, "temperature": 0})
            }
            Api::Responses => {
                serde_json::json!({"model": "smollm2", "input": "Hi", "max_output_tokens": 3, "temperature": 0})
            }
        };
        for f in FIELDS.iter().filter(|f| f.on.includes(api)) {
            let mut body = base_body.clone();
            body[f.name] = serde_json::from_str(f.sample).unwrap();
            if f.name == "top_logprobs" {
                body["logprobs"] = true.into();
            }
            // The tool fields other than `tools` go with tools.
            if ["tool_choice", "parallel_tool_calls", "max_tool_calls"].contains(&f.name) {
                let tools = FIELDS
                    .iter()
                    .find(|t| t.name == "tools" && t.on.includes(api))
                    .unwrap();
                body["tools"] = serde_json::from_str(tools.sample).unwrap();
            }
            let (code, text) = post(&base, path, &body, false);
            let what = format!("{path} `{}` = {}: {code} {text}", f.name, f.sample);
            match f.status {
                Status::Works => assert_eq!(code, 200, "{what}"),
                Status::Refused => {
                    assert_eq!(code, 400, "{what}");
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                    if api == Api::Messages {
                        assert_eq!(v["error"]["type"], "invalid_request_error", "{what}");
                    } else {
                        assert_eq!(v["error"]["param"], f.name, "{what}");
                    }
                    assert!(
                        v["error"]["message"].as_str().unwrap().contains(f.name),
                        "{what}"
                    );
                }
            }
        }
        // Not in the table: refused by name, as OpenAI does.
        let mut body = base_body.clone();
        body["frobnicate"] = 1.into();
        let (code, text) = post(&base, path, &body, false);
        assert_eq!(code, 400, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        if api != Api::Messages {
            assert_eq!(v["error"]["param"], "frobnicate");
        }
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Unrecognized request argument supplied: frobnicate"));
    }
    // A message field and a content part the engine cannot use are named too.
    for (msg, param) in [
        (
            serde_json::json!({"role": "user", "content": "Hi", "name": 7}),
            "messages[0].name",
        ),
        (
            serde_json::json!({"role": "user", "content": "Hi", "reasoning_content": "hm"}),
            "messages[0].reasoning_content",
        ),
        (
            serde_json::json!({"role": "user", "content": "42", "tool_call_id": "c1"}),
            "messages[0].tool_call_id",
        ),
        (
            serde_json::json!({"role": "tool", "content": "42"}),
            "messages[0].tool_call_id",
        ),
        (
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            serde_json::json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}),
            "messages[0].content[0]",
        ),
    ] {
        let body = serde_json::json!({"model": "smollm2", "messages": [msg], "max_tokens": 2});
        let (code, text) = post(&base, "/v1/chat/completions", &body, false);
        assert_eq!(code, 400, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], param, "{text}");
    }
    // Token-id prompts are the text's tokens: the same greedy output, the same prompt count.
    let tok = &cachet_tests::smollm2().tokenizer.as_ref().unwrap();
    let ids = tok.encode("The capital of France is").unwrap();
    let one = |prompt: serde_json::Value| {
        let body = serde_json::json!({"model": "smollm2", "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true});
        let (code, text) = post(&base, "/v1/completions", &body, false);
        assert_eq!(code, 200, "{text}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    };
    let by_text = one("The capital of France is".into());
    let by_ids = one(serde_json::json!(ids));
    assert_eq!(by_text["choices"][0]["text"], by_ids["choices"][0]["text"]);
    assert_eq!(
        by_text["usage"]["prompt_tokens"],
        by_ids["usage"]["prompt_tokens"]
    );
    // A batch: two prompts × n = 2, choices in prompt order, each prompt counted once.
    let body = serde_json::json!({"model": "smollm2", "prompt": [ids, [1, 2, 3]], "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": true});
    let (code, text) = post(&base, "/v1/completions", &body, false);
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert_eq!(choices[0]["text"], by_text["choices"][0]["text"]);
    assert_eq!(
        choices[0]["text"], choices[1]["text"],
        "greedy choices agree"
    );
    assert_eq!(v["usage"]["prompt_tokens"], ids.len() + 3);
    assert_eq!(v["usage"]["completion_tokens"], 24);
    // Out of the vocabulary: 400 naming the prompt.
    let body = serde_json::json!({"model": "smollm2", "prompt": [1, 99_999_999], "max_tokens": 2});
    let (code, text) = post(&base, "/v1/completions", &body, false);
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("\"param\":\"prompt\""), "{text}");
}

#[test]
fn unknown_fields_pass_with_a_warning_where_the_deployment_allows_it() {
    let (_server, base) = start_with(&config(), &["--unknown-fields", "warn"]);
    let body = serde_json::json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 2, "frobnicate": 1, "zeta": "x"});
    let (code, text) = post(&base, "/v1/completions", &body, true);
    assert_eq!(code, 200, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("x-cachet-warning: ignored unknown fields: frobnicate, zeta"),
        "{text}"
    );
    // Refused fields stay refused: the switch is for unknown ones only.
    let body = serde_json::json!({"model": "smollm2", "prompt": "Hello", "best_of": 3});
    assert_eq!(post(&base, "/v1/completions", &body, false).0, 400);
}

#[test]
fn the_official_openai_client_gets_n_logprobs_and_the_processors() {
    let (_server, base) = start(&config());
    python_check(
        "openai_api_check.py",
        &openai_site(),
        &[("BASE_URL", &base), ("KEY", "sk-test-acme")],
    );
}

#[test]
fn tools_are_refused_by_name_where_the_template_renders_none() {
    // SmolLM2's own template has no tools: a request with them gets a 400 that says so, and
    // `tool_choice: none` (nothing to render, nothing to parse) still works.
    let (_server, base) = start(&config());
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let body = serde_json::json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "tools": tools});
    let (code, text) = post(&base, "/v1/chat/completions", &body, false);
    assert_eq!(code, 400, "{text}");
    assert!(
        text.contains("\"param\":\"tools\"") && text.contains("--chat-template"),
        "{text}"
    );
    let mut body = body;
    body["tool_choice"] = "none".into();
    assert_eq!(post(&base, "/v1/chat/completions", &body, false).0, 200);
}

#[test]
fn the_official_clients_call_tools_in_all_three_apis() {
    let (_server, base) = start_with(&config(), &["--chat-template", TOOLS_TEMPLATE]);
    clients_check("tools_check.py", &base);
}

/// Runs `script` with the official `anthropic` and `openai` clients (and `jsonschema`) against
/// the server at `base`.
fn clients_check(script: &str, base: &str) {
    let site = anthropic_site();
    python_check(
        script,
        &site,
        &[("BASE_URL", base), ("KEY", "sk-test-acme")],
    );
}

/// The OpenAI Agents SDK with its default (strict) function tool runs a tool loop: a required
/// call, then a turn under `auto` with the strict tool (`tests/python/agents_check.py`).
#[test]
fn the_openai_agents_sdk_runs_a_tool_loop_with_a_strict_tool() {
    let (_server, base) = start_with(&config(), &["--chat-template", TOOLS_TEMPLATE]);
    python_check(
        "agents_check.py",
        &agents_site(),
        &[("BASE_URL", base.as_str()), ("KEY", "sk-test-acme")],
    );
}

#[test]
fn the_official_anthropic_client_speaks_messages_and_openai_speaks_responses() {
    let (_server, base) = start(&config());
    clients_check("anthropic_check.py", &base);
}

/// `cachet serve --tensor-parallel-size 3` (SmolLM2's 9 heads, 3 KV heads and 1,536 MLP units
/// over three CPU ranks) answers as the unsplit server does: the same greedy completion; a size
/// the model does not divide is refused at start-up, naming what does not.
#[test]
fn a_model_split_over_ranks_answers_as_the_whole_model() {
    let body = serde_json::json!({"model": "smollm2", "prompt": "The capital of France is",
        "max_tokens": 12, "temperature": 0});
    let answer = |extra: &[&str]| {
        let (_server, base) = start_with(&config(), extra);
        let (code, out) = post(&base, "/v1/completions", &body, false);
        assert_eq!(code, 200, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let whole = answer(&[]);
    let split = answer(&["--tensor-parallel-size", "3"]);
    assert_eq!(split, whole);
    assert!(!whole.is_empty());
    let cfg = std::env::temp_dir().join(format!("cachet-tp-{}.toml", std::process::id()));
    std::fs::write(&cfg, config()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cachet"))
        .arg("serve")
        .args(cachet_tests::SMOLLM2_CPU)
        .args([
            "--tensor-parallel-size",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    std::fs::remove_file(&cfg).unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{text}");
    let out = text;
    assert!(
        out.contains("does not divide the model's 9 attention heads"),
        "{out}"
    );
}
