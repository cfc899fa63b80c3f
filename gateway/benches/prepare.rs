//! What preparing the gateway cost benchmark's chat request costs on one core, stage by stage,
//! on SmolLM2's tokenizer and chat template: the body parsed and checked (`parse_request`), the
//! chat template rendered as transformers would (`render_chat_with`), and the same rendering
//! with the markers that cut it into markup and content pieces (`normalize::tokens::render`).
//!
//!     cargo bench -p cachet-gateway --bench prepare

use std::time::Duration;

use cachet_gateway::server::fields::UnknownFields;
use cachet_gateway::server::openai::{self, Input};
use criterion::Criterion;

const BODY: &str = r#"{"model":"smollm2","max_tokens":1,"messages":[{"role":"system","content":"You are a helpful assistant for Acme routers."},{"role":"user","content":"What is the capital of France?"}]}"#;

fn main() {
    let meta = cachet_backend::loader::load_meta(cachet_tests::smollm2_path().to_str().unwrap())
        .expect("SmolLM2");
    let tok = meta.tokenizer.expect("a GGUF tokenizer");
    let parsed = openai::parse_request(true, BODY.as_bytes(), UnknownFields::Reject).unwrap();
    let Input::Chat(_, msgs) = &parsed.input else {
        unreachable!("a chat body")
    };
    let msgs = msgs.clone();
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    c.bench_function("parse_request (chat body, 180 B)", |b| {
        b.iter(|| {
            openai::parse_request(
                true,
                std::hint::black_box(BODY.as_bytes()),
                UnknownFields::Reject,
            )
            .unwrap()
        })
    });
    c.bench_function("render_chat_with (2 messages, a layout seen before)", |b| {
        b.iter(|| {
            tok.render_chat_with(std::hint::black_box(&msgs), None, None, true)
                .unwrap()
        })
    });
    c.bench_function(
        "render_chat_direct (2 messages, the template engine)",
        |b| {
            b.iter(|| {
                tok.render_chat_direct(std::hint::black_box(&msgs), None, None, true)
                    .unwrap()
            })
        },
    );
    c.bench_function("normalize::tokens::render (2 messages, marked)", |b| {
        b.iter(|| {
            cachet_gateway::normalize::tokens::render(
                &tok,
                &[],
                std::hint::black_box(&msgs),
                cachet_gateway::normalize::tokens::TemplateArgs::PLAIN,
                Some((1, 0)),
            )
            .unwrap()
        })
    });
    c.final_summary();
}
