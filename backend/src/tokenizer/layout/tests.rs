use super::opacity;
use crate::tokenizer::{ChatMessage, TextTokenizer, ToolCall};

const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
const QWEN25: &str = include_str!("../../../../tests/fixtures/qwen2.5-chat-template.jinja");
const CHATML_TOOLS: &str = include_str!("../../../../examples/chat-templates/chatml-tools.jinja");
const CHATML_THINKING: &str =
    include_str!("../../../../examples/chat-templates/chatml-thinking.jinja");
/// Qwen3's way with an assistant's thinking: it looks inside the content.
const LOOKS_INSIDE: &str = "{%- for message in messages %}{%- set content = message.content %}{%- if message.role == 'assistant' and '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}";

#[test]
fn templates_that_only_copy_contents_are_recognised() {
    for (name, t) in [
        ("chatml", CHATML),
        ("qwen2.5", QWEN25),
        ("chatml-tools", CHATML_TOOLS),
        ("chatml-thinking", CHATML_THINKING),
        ("a content through a variable", "{% for m in messages %}{% set c = m.content %}{{ c }}{% endfor %}"),
        ("truth and type tests", "{% for m in messages %}{% if m.content and m.content is string and m.content is not none %}[{{ m['content'] ~ '|' }}]{% endif %}{% if not m.content %}-{% endif %}{% endfor %}"),
        ("or, if-expressions", "{% for m in messages %}{{ (m.content or '') + (m.content if m.content else '') }}{% endfor %}"),
        ("a macro written out", "{% macro one(r) %}{{ r }}{% endmacro %}{% for m in messages %}{{ one(m.role) }}{{ m.content }}{% endfor %}"),
        ("loop neighbours' roles", "{% for m in messages %}{% if loop.previtem is defined and loop.previtem.role == 'user' %}>{% endif %}{{ messages[loop.index0].role }}{{ m.content }}{% endfor %}"),
        ("a set block around contents", "{% set all %}{% for m in messages %}{{ m.content }}{% endfor %}{% endset %}{{ all }}"),
        ("the list's length and slices", "{{ messages|length }}{% for m in messages[1:] %}{{ m.content }}{% endfor %}{{ messages[0].content }}"),
    ] {
        assert!(opacity(t).is_ok(), "{name}: {:?}", opacity(t));
    }
}

#[test]
fn templates_that_look_inside_or_lose_track_of_a_content_are_refused() {
    for (t, why) in [
        (LOOKS_INSIDE, "comparison, `in`"),
        ("{% for m in messages %}{{ m.content|trim }}{% endfor %}", "`trim` filter on a content"),
        ("{% for m in messages %}{{ m.content.strip() }}{% endfor %}", "method `strip`"),
        ("{% for m in messages %}{% set c = m['content'] %}{{ c|upper }}{% endfor %}", "`upper` filter"),
        ("{% for m in messages %}{% if m.content == 'x' %}x{% endif %}{% endfor %}", "comparison"),
        ("{% for m in messages %}{% if m.content.startswith('/') %}x{% endif %}{% endfor %}", "method `startswith`"),
        ("{% for m in messages %}{{ m.content[0] }}{% endfor %}", "subscript of a content"),
        ("{% for m in messages %}{{ m.content[:10] }}{% endfor %}", "slice of a content"),
        ("{% for m in messages %}{{ m }}{% endfor %}", "written out whole"),
        ("{{ messages|tojson }}", "`tojson` filter on a message"),
        ("{% for m in messages %}{% for k, v in m|items %}{{ v }}{% endfor %}{% endfor %}", "`items` filter"),
        ("{% for m in messages %}{% for k in ['content'] %}{{ m[k]|trim }}{% endfor %}{% endfor %}", "filter on a content"),
        ("{% for m in messages %}{% for ch in m.content %}{{ ch }}{% endfor %}{% endfor %}", "loop over a content"),
        ("{% set ns = namespace(c='') %}{% for m in messages %}{% set ns.c = m.content %}{% endfor %}{{ ns.c|trim }}", "stores a message or a content in an attribute"),
        ("{% for m in messages %}{{ {'c': m.content}.c|trim }}{% endfor %}", "map literal"),
        ("{% macro f(x) %}{{ x|trim }}{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}", "argument"),
        ("{% macro sys() %}{{ messages[0].content }}{% endmacro %}{{ sys()|trim }}", "`trim` filter on a content"),
        ("{% set x %}{{ messages[0].content }}{% endset %}{{ x|length }}", "`length` filter on a content"),
        ("{% filter upper %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfilter %}", "filter block"),
        ("{% for m in messages %}{{ m.content * 2 }}{% endfor %}", "arithmetic"),
        ("{% for m in messages %}{{ loop.previtem.content|trim if loop.previtem }}{% endfor %}", "`trim` filter"),
        ("{% for m in messages %}{{ raise_exception(m.content) }}{% endfor %}", "argument"),
        ("{{ debug() }}", "does not know"),
        ("{% for m in messages %}{% set a, b = m.content %}{% endfor %}", "unpacks"),
    ] {
        let got = opacity(t).expect_err(t).to_string();
        assert!(got.contains(why), "{t}: {got}");
    }
}

/// A one-word tokenizer: these tests are about the rendering only.
fn tokenizer(template: &str) -> TextTokenizer {
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"},
    });
    TextTokenizer::new(
        json.to_string().parse().unwrap(),
        None,
        Some("<s>".into()),
        Some("</s>".into()),
    )
    .with_chat_template(template.to_string())
}

/// Conversations of every shape the templates branch on, with contents that would break a
/// careless splice (template syntax, the placeholder characters, empty ones).
fn conversations() -> Vec<(Vec<ChatMessage>, Option<serde_json::Value>)> {
    let texts = [
        "What is the capital of France?",
        "",
        "{{ messages }} {% if x %}",
        "\u{E000}0:1\u{E001} and \u{E000}",
        "line one\n\n  line two  ",
        "</think>after",
    ];
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "description": "\u{E000}x:0\u{E001}", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut out = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for _ in 0..120 {
        let mut msgs = Vec::new();
        if next(2) == 0 {
            msgs.push(ChatMessage::new("system", texts[next(texts.len())]));
        }
        for turn in 0..1 + next(4) {
            msgs.push(ChatMessage::new("user", texts[next(texts.len())]));
            match next(3) {
                0 => {}
                1 => msgs.push(ChatMessage::new("assistant", texts[next(texts.len())])),
                _ => {
                    let mut a = ChatMessage::new("assistant", texts[next(texts.len())]);
                    a.tool_calls = vec![ToolCall {
                        id: format!("call_{turn}"),
                        name: "get_weather".into(),
                        arguments: r#"{"city": "Paris \u{E000}"}"#.into(),
                    }];
                    msgs.push(a);
                    let mut t = ChatMessage::new("tool", texts[next(texts.len())]);
                    t.tool_call_id = Some(format!("call_{turn}"));
                    msgs.push(t);
                }
            }
        }
        out.push((msgs, (next(2) == 0).then(|| tools.clone())));
    }
    out
}

#[test]
fn layouts_render_what_the_template_engine_renders() {
    for (name, t) in [
        ("chatml", CHATML),
        ("qwen2.5", QWEN25),
        ("chatml-tools", CHATML_TOOLS),
        ("chatml-thinking", CHATML_THINKING),
        ("looks inside", LOOKS_INSIDE),
    ] {
        let tok = tokenizer(t);
        let kwargs: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"enable_thinking": false}"#).unwrap();
        let mut renders = 0;
        for (msgs, tools) in conversations() {
            for (kw, gen) in [(None, true), (Some(&kwargs), false)] {
                renders += 1;
                let want = tok.render_chat_direct(&msgs, tools.as_ref(), kw, gen);
                let got = tok.render_chat_with(&msgs, tools.as_ref(), kw, gen);
                match (want, got) {
                    (Ok(w), Ok(g)) => assert_eq!(g, w, "{name}: {msgs:?}"),
                    (Err(w), Err(g)) => assert_eq!(g.to_string(), w.to_string(), "{name}"),
                    (w, g) => panic!("{name}: engine {w:?}, layout {g:?}"),
                }
            }
        }
        let compiled = tok.compiled(false).unwrap();
        match &compiled.layouts {
            Ok(l) => {
                // Fewer layouts than renderings: the contents vary, layouts repeat.
                assert!(
                    l.len() > 10 && l.len() < renders,
                    "{name}: {} layouts",
                    l.len()
                );
            }
            Err(_) => assert_eq!(name, "looks inside"),
        }
    }
}

#[test]
fn one_layout_serves_every_content() {
    let tok = tokenizer(CHATML);
    for q in ["Hi", "What is 2+2?", "{{ x }}"] {
        let msgs = [
            ChatMessage::new("system", "Be terse."),
            ChatMessage::new("user", q),
        ];
        assert_eq!(
            tok.render_chat_with(&msgs, None, None, true).unwrap(),
            format!("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
        );
    }
    assert_eq!(
        tok.compiled(false).unwrap().layouts.as_ref().unwrap().len(),
        1
    );
    // An empty content is another layout (templates test it).
    let msgs = [
        ChatMessage::new("system", ""),
        ChatMessage::new("user", "Hi"),
    ];
    tok.render_chat_with(&msgs, None, None, true).unwrap();
    assert_eq!(
        tok.compiled(false).unwrap().layouts.as_ref().unwrap().len(),
        2
    );
    // Partitions (tenants) do not share layouts.
    for p in [&b"tenant a"[..], b"tenant b", b"tenant a"] {
        tok.render_chat_in(p, &msgs, None, None, true).unwrap();
    }
    assert_eq!(
        tok.compiled(false).unwrap().layouts.as_ref().unwrap().len(),
        4
    );
}
