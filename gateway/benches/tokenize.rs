//! Message text to ids on SmolLM2's vocabulary, the ASCII path (`encode_plain`) against the
//! `tokenizers` pipeline it stands in for (`encode_plain_reference`), side by side in one run:
//! the gateway cost benchmark's user message, a paragraph of prose, a code snippet, and a
//! non-ASCII message (which takes the library's pipeline either way). The ids are checked equal
//! before anything is timed.
//!
//!     cargo bench -p cachet-gateway --bench tokenize

use std::time::Duration;

use criterion::Criterion;

fn main() {
    let meta = cachet_backend::loader::load_meta(cachet_tests::smollm2_path().to_str().unwrap())
        .expect("SmolLM2");
    let tok = meta.tokenizer.expect("a GGUF tokenizer");
    assert!(tok.has_ascii_path());
    let texts = [
        (
            "question, 30 B",
            "What is the capital of France?".to_string(),
        ),
        (
            "prose, 1 KB",
            "Northwind routers keep their settings in flash; a reset restores the factory image. \
             If the status light blinks amber for more than 30 seconds, don't unplug it: it's \
             writing a firmware update (v2.14.3, 2026-11-29). "
                .repeat(4),
        ),
        (
            "code, 1 KB",
            "fn main() {\n    let xs: Vec<u64> = (0..100).map(|i| i * i).collect();\n    \
             println!(\"{}\", xs.iter().sum::<u64>());\n}\n"
                .repeat(9),
        ),
        (
            "non-ASCII, 60 B",
            "Quelle est la capitale de la France ? Réponds en français.".to_string(),
        ),
    ];
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (name, text) in &texts {
        assert_eq!(
            tok.encode_plain(text).unwrap(),
            tok.encode_plain_reference(text).unwrap(),
            "{name}"
        );
        c.bench_function(&format!("{name}: ASCII path"), |b| {
            b.iter(|| tok.encode_plain(std::hint::black_box(text)).unwrap())
        });
        c.bench_function(&format!("{name}: tokenizers pipeline"), |b| {
            b.iter(|| {
                tok.encode_plain_reference(std::hint::black_box(text))
                    .unwrap()
            })
        });
    }
    c.final_summary();
}
