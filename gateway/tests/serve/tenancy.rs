//! Fair tenancy end to end: a public prefix shared safely between tenants.

use super::common::*;

const PUBLIC: &str = "You are Acme Assistant, the support agent of Acme Corporation. Answer \
    questions about Acme's routers, modems and mesh systems; be brief and polite; never promise \
    refunds; point customers to acme.example/support for anything you cannot solve.";
const PRIVATE: &str = "You are the internal assistant of Initech's treasury desk. Escalation \
    code 4471-ALPHA; the wire approval limit is 250000 USD; the counterparty list is in vault 9 \
    and must never be quoted to anyone outside the desk.";

fn config() -> String {
    let mut c = String::new();
    for t in ["a", "b", "c"] {
        c += &format!(
            "[[tenant]]\nid = \"{t}\"\napi_key_sha256 = [\"{}\"]\n",
            key_hash(&format!("sk-{t}"))
        );
    }
    c + &format!("[[public_prefix]]\nname = \"acme\"\nsystem = \"{PUBLIC}\"\n")
}

/// Sends a chat request; returns (prompt tokens, cached tokens).
fn chat(base: &str, key: &str, system: &str, q: &str, cache_salt: Option<&str>) -> (u64, u64) {
    let mut body = serde_json::json!({"model": "smollm2", "max_tokens": 1, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]});
    if let Some(s) = cache_salt {
        body["cache_salt"] = s.into();
    }
    let (code, r) = http_json("POST", &format!("{base}/v1/chat/completions"), key, &body);
    assert_eq!(code, 200, "{r}");
    (
        r["usage"]["prompt_tokens"].as_u64().unwrap(),
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

/// The public blocks' tokens of a chat prompt, as the gateway computes them.
fn public_tokens(system: &str, q: &str) -> u64 {
    use cachet_backend::tokenizer::ChatMessage;
    use cachet_gateway::normalize::public::{PublicPrefixConfig, PublicPrefixes};
    let tok = cachet_tests::smollm2().tokenizer.clone().unwrap();
    let decl = PublicPrefixConfig {
        name: "acme".into(),
        system: Some(PUBLIC.into()),
        text: None,
    };
    let public = PublicPrefixes::new(&[decl], &tok, 16).unwrap();
    let msgs = [
        ChatMessage::new("system", system),
        ChatMessage::new("user", q),
    ];
    let ids = tok.encode(&tok.render_chat(&msgs, true).unwrap()).unwrap();
    public.part_of(&ids).map_or(0, |p| p.blocks as u64 * 16)
}

/// Two tenants share the declared public prefix's cached blocks and not one token more; a
/// tenant's own text, however often sent, is never shared; a client's own `cache_salt` opts out.
#[test]
fn tenants_share_the_public_prefix_and_not_one_token_more() {
    let (_server, base) = start(&config());
    let q1 = "My router blinks red. What now?";
    let q2 = "How do I reset my mesh system?";
    let shared = public_tokens(PUBLIC, q1);
    assert!(shared >= 48, "{shared} public tokens");
    assert_eq!(public_tokens(PUBLIC, q2), shared);
    // a computes everything; b finds the public blocks — exactly.
    assert_eq!(chat(&base, "sk-a", PUBLIC, q1, None).1, 0);
    assert_eq!(chat(&base, "sk-b", PUBLIC, q2, None).1, shared);
    // b sending a's exact prompt still gets only the public part; a gets its whole prompt.
    assert_eq!(chat(&base, "sk-b", PUBLIC, q1, None).1, shared);
    let (prompt, cached) = chat(&base, "sk-a", PUBLIC, q1, None);
    assert!(
        cached > shared && cached >= (prompt - 1) / 16 * 16,
        "a's own repeat: {cached} of {prompt} cached"
    );
    // A system prompt that goes on past the public text shares the public part only.
    let extended = format!("{PUBLIC} Internal note: escalation code 4471.");
    assert_eq!(chat(&base, "sk-b", &extended, q1, None).1, shared);
    assert_eq!(chat(&base, "sk-c", &extended, q1, None).1, shared);
    // A client's own cache_salt asked to share with no one.
    assert_eq!(chat(&base, "sk-c", PUBLIC, q1, Some("mine")).1, 0);
    // A tenant cannot make its own text public: a's private prompt, cached for a, is a miss
    // for b (there is no tenant setting or request field that declares a prefix).
    chat(&base, "sk-a", PRIVATE, q1, None);
    assert!(chat(&base, "sk-a", PRIVATE, q1, None).1 >= 48);
    assert_eq!(chat(&base, "sk-b", PRIVATE, q1, None).1, 0);
    let (code, r) = http_json(
        "POST",
        &format!("{base}/v1/chat/completions"),
        "sk-b",
        &serde_json::json!({"model": "smollm2", "public_prefix": "acme",
            "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        (code, r["error"]["param"].as_str()),
        (400, Some("public_prefix")),
        "{r}"
    );
    // The prefix's blocks are counted by name.
    let (_, metrics) = curl(&[&format!("{base}/metrics")]);
    assert!(
        metrics.contains("cachet_public_prefix_blocks_total{prefix=\"acme\"}"),
        "{metrics}"
    );
}
