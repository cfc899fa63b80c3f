//! Real models' chat templates behind `cachet serve` (SmolLM2's weights, ChatML): Qwen3's own
//! template (tests/fixtures, as Qwen3-0.6B ships it; it calls Python's string methods) answers
//! plain chat, chat with tools and a tool round trip, reasoning in the history and
//! `enable_thinking`; a template that fails on a plain conversation is refused at start; one
//! that fails on a request answers 500 naming the template's error (and logs it), while its
//! own `raise_exception` is the client's 400; thinking sent back (`reasoning_content`, Messages'
//! `thinking` blocks) and participants' names reach the template.

use super::common::*;

fn config() -> String {
    format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-test-acme")
    )
}

fn chat(base: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    post_json(base, "/v1/chat/completions", "sk-test-acme", &body)
}

fn weather() -> serde_json::Value {
    serde_json::json!({"type": "function", "function": {"name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})
}

#[test]
fn qwen3s_own_template_answers_chat_with_tools_and_reasoning() {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/qwen3-chat-template.jinja"
    );
    let (_server, base) = start_with(&config(), &["--chat-template", template]);
    let ask = |messages: serde_json::Value, extra: serde_json::Value| {
        let mut body = serde_json::json!({"model": "smollm2", "messages": messages,
            "max_tokens": 4, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (code, v) = chat(&base, body);
        assert_eq!(code, 200, "{v}");
        assert!(v["choices"][0]["message"].is_object(), "{v}");
    };
    let none = serde_json::json!({});
    ask(
        serde_json::json!([{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}]),
        none.clone(),
    );
    ask(
        serde_json::json!([{"role": "user", "content": "Weather in Paris?"}]),
        serde_json::json!({"tools": [weather()]}),
    );
    ask(
        serde_json::json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]),
        serde_json::json!({"tools": [weather()]}),
    );
    // The template splits a past answer's reasoning off with `.split('</think>')` and
    // `.lstrip('\n')`: Python's methods.
    ask(
        serde_json::json!([{"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nParis."},
            {"role": "user", "content": "And of Italy?"}]),
        none,
    );
    ask(
        serde_json::json!([{"role": "user", "content": "Hi"}]),
        serde_json::json!({"chat_template_kwargs": {"enable_thinking": false}}),
    );
}

#[test]
fn a_failing_template_is_refused_at_start_and_a_failing_request_is_the_servers_500() {
    let dir = std::env::temp_dir().join(format!("cachet-templates-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Fails on every conversation: refused at start, naming the template and its error.
    let broken = dir.join("broken.jinja");
    std::fs::write(
        &broken,
        "{% for m in messages %}{{ m.content.no_such_method() }}{% endfor %}",
    )
    .unwrap();
    let cfg = dir.join("tenants.toml");
    std::fs::write(&cfg, config()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cachet"))
        .arg("serve")
        .args(cachet_tests::SMOLLM2_CPU)
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .arg("--chat-template")
        .arg(&broken)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("broken.jinja") && err.contains("no_such_method"),
        "{err}"
    );
    // Fails on tool results only: a 500 naming the template's error; its raise_exception (a
    // conversation opening with the assistant) is the client's 400 with the template's words.
    let picky = dir.join("picky.jinja");
    std::fs::write(
        &picky,
        "{% if messages[0].role == 'assistant' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}\
         {% for m in messages %}{% if m.role == 'tool' %}{{ m.content.no_such_method() }}{% endif %}\
         <|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    .unwrap();
    let log = dir.join("serve.log");
    let (server, base) = start_under(
        &config(),
        &[
            "--chat-template",
            picky.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        None,
        Some(&log),
    );
    let msg = |messages: serde_json::Value| serde_json::json!({"model": "smollm2", "max_tokens": 2, "messages": messages});
    let (code, v) = chat(
        &base,
        msg(serde_json::json!([{"role": "user", "content": "hello"}])),
    );
    assert_eq!(code, 200, "{v}");
    let (code, v) = chat(
        &base,
        msg(serde_json::json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])),
    );
    assert_eq!(code, 500, "{v}");
    assert_eq!(v["error"]["code"], "chat_template_error", "{v}");
    let text = v["error"]["message"].as_str().unwrap();
    assert!(
        text.contains("chat template") && text.contains("no_such_method"),
        "{v}"
    );
    let (code, v) = chat(
        &base,
        msg(serde_json::json!([{"role": "assistant", "content": "hi"},
            {"role": "user", "content": "hello"}])),
    );
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Conversation roles must alternate"),
        "{v}"
    );
    drop(server);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("\"level\":\"ERROR\"") && l.contains("no_such_method")),
        "{logged}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An assistant's thinking sent back reaches the model's template: as `reasoning_content` on a
/// chat, as a `thinking` block on Messages — the same prompt either way. Qwen3's template
/// keeps the thinking of a tool loop's turns (after the last user message), so the prompt
/// holds it; a participant's `name` is passed to the template too.
#[test]
fn thinking_sent_back_reaches_the_template_on_chat_and_messages() {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/qwen3-chat-template.jinja"
    );
    let (_server, base) = start_with(&config(), &["--chat-template", template]);
    let thought = "The user wants Paris; call the tool.";
    let chat_messages = |thinking: bool| {
        let mut call = serde_json::json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]});
        if thinking {
            call["reasoning_content"] = thought.into();
        }
        serde_json::json!([{"role": "user", "content": "Weather in Paris?"}, call,
            {"role": "tool", "tool_call_id": "toolu_1", "content": "{\"temp\": 21}"}])
    };
    let tokenize = |messages: serde_json::Value| {
        let (code, t) = post_json(
            &base,
            "/tokenize",
            "sk-test-acme",
            &serde_json::json!({"model": "smollm2", "messages": messages, "tools": [weather()]}),
        );
        assert_eq!(code, 200, "{t}");
        let (code, d) = post_json(
            &base,
            "/detokenize",
            "sk-test-acme",
            &serde_json::json!({"tokens": t["tokens"]}),
        );
        assert_eq!(code, 200, "{d}");
        (
            t["count"].as_u64().unwrap(),
            d["prompt"].as_str().unwrap().to_string(),
        )
    };
    let (with, prompt) = tokenize(chat_messages(true));
    assert!(
        prompt.contains(&format!("<think>\n{thought}\n</think>")),
        "{prompt}"
    );
    let (without, _) = tokenize(chat_messages(false));
    assert!(with > without, "{with} vs {without}");
    // Messages: the same turn as Anthropic's clients send it back.
    let count = |thinking: bool| {
        let mut blocks = vec![serde_json::json!({"type": "tool_use", "id": "toolu_1",
            "name": "get_weather", "input": {"city": "Paris"}})];
        if thinking {
            blocks.insert(
                0,
                serde_json::json!({"type": "thinking", "thinking": thought, "signature": ""}),
            );
        }
        let (code, c) = post_json(
            &base,
            "/v1/messages/count_tokens",
            "sk-test-acme",
            &serde_json::json!({"model": "smollm2",
                "tools": [{"name": "get_weather", "description": "Current weather of a city.",
                    "input_schema": weather()["function"]["parameters"]}],
                "messages": [{"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": blocks},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                        "content": "{\"temp\": 21}"}]}]}),
        );
        assert_eq!(code, 200, "{c}");
        c["input_tokens"].as_u64().unwrap()
    };
    assert_eq!(count(true), with);
    assert_eq!(count(false), without);
    // Names: each participant's, in the template's hands (Qwen3's leaves them out), and a name
    // that is no text is refused by its field.
    let named = serde_json::json!([{"role": "user", "name": "alice", "content": "I'm Alice."},
        {"role": "user", "name": "bob", "content": "Who spoke first?"}]);
    let (code, v) = chat(
        &base,
        serde_json::json!({"model": "smollm2", "messages": named, "max_tokens": 2}),
    );
    assert_eq!(code, 200, "{v}");
    let (code, v) = chat(
        &base,
        serde_json::json!({"model": "smollm2", "max_tokens": 2,
            "messages": [{"role": "user", "name": 7, "content": "Hi"}]}),
    );
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["param"], "messages[0].name", "{v}");
}
