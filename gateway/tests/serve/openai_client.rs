//! The official `openai` Python client (from PyPI) against `cachet serve` over TLS.

use super::common::*;

#[test]
fn the_official_openai_client_works_against_cachet_serve_over_tls() {
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n\n[[tenant]]\nid = \"limited\"\napi_key_sha256 = [\"{}\"]\nrequests_per_minute = 2\n",
        key_hash("sk-test-acme"),
        key_hash("sk-test-limited")
    );
    let site = openai_site();
    let dir = std::env::temp_dir().join(format!("cachet-openai-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, crt, key) = make_certs(&dir, "openai");
    let (_server, base) = start_tls(&config, &crt, &key);
    python_check(
        "openai_check.py",
        &site,
        &[
            ("BASE_URL", &base),
            ("CA_FILE", ca.to_str().unwrap()),
            ("KEY", "sk-test-acme"),
            ("LIMITED_KEY", "sk-test-limited"),
        ],
    );
}

/// `cachet serve` on a Qwen2.5-Coder Instruct model (`model`, CPU) for tenant `acme`, with
/// `extra` model flags.
fn qwen_server(model: &str, extra: &[&str]) -> (Server, String) {
    match model {
        "qwen2.5-coder-1.5b" => cachet_tests::qwen15_path(),
        _ => cachet_tests::qwen05_path(),
    };
    let config = format!(
        "[[tenant]]\nid = \"acme\"\napi_key_sha256 = [\"{}\"]\n",
        key_hash("sk-test-acme")
    );
    let mut args = vec![
        "--model",
        model,
        "--device",
        "cpu",
        "--max-model-len",
        "1024",
    ];
    args.extend_from_slice(extra);
    start_model(&config, &args, &[], None, None)
}

/// The chat check of `qwen_check.py` against `model` served on the CPU: the greedy answer of
/// its first `max_tokens` tokens equal to transformers', streamed and whole, and a cache hit.
fn chat_with_qwen(model: &str, max_tokens: &str) {
    let _one = cachet_tests::one_real_model_at_a_time();
    let site = openai_site();
    let (_server, base) = qwen_server(model, &[]);
    let reference = cachet_tests::fixtures().join(format!("{model}_reference.json"));
    python_check(
        "qwen_check.py",
        &site,
        &[
            ("BASE_URL", &base),
            ("KEY", "sk-test-acme"),
            ("MODEL", model),
            ("REFERENCE", reference.to_str().unwrap()),
            ("MAX_TOKENS", max_tokens),
        ],
    );
}

/// Qwen2.5-Coder-0.5B-Instruct (qwen2: q/k/v biases, K-quant GGUF, its own chat template) served
/// on the CPU, driven by the official client: its whole 32-token reference answer.
#[test]
fn the_official_openai_client_chats_with_qwen25_coder() {
    chat_with_qwen("qwen2.5-coder-0.5b", "32");
}

/// Qwen2.5-Coder-1.5B-Instruct the same way (its first 16 tokens: 1.5B parameters in f32 on two
/// CPU cores). One real model at a time in this binary (each server holds its weights).
#[test]
fn the_official_openai_client_chats_with_qwen25_coder_15b() {
    chat_with_qwen("qwen2.5-coder-1.5b", "16");
}

/// Thinking split out of the answer on chat completions (`reasoning_content`), Messages
/// (`thinking` blocks) and Responses (`reasoning` items), whole and streamed, with its tokens in
/// the usage; `chat_template_kwargs` and Messages' `thinking` switch (`enable_thinking`) — with
/// a template that has Qwen3's thinking switch, through the official `openai` and `anthropic`
/// clients.
#[test]
fn reasoning_on_every_api_through_the_official_clients() {
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/chat-templates/chatml-thinking.jinja"
    );
    let _one = cachet_tests::one_real_model_at_a_time();
    let site = anthropic_site();
    let (_server, base) = qwen_server("qwen2.5-coder-0.5b", &["--chat-template", template]);
    python_check(
        "reasoning_check.py",
        &site,
        &[("BASE_URL", &base), ("KEY", "sk-test-acme")],
    );
}
