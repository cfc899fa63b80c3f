//! Retrieval-augmented generation: fixed instructions (static), then the retrieved documents the
//! client sends in the `documents` variable (a JSON array of `{title, text}`), numbered so the
//! answer can cite them, then the question (both dynamic).
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use cachet_guest_sdk::{Error, Rendered, Request, Segment, Template};

const INSTRUCTIONS: &str = "Answer the question using only the numbered documents below. Cite \
the documents you use as [1], [2], … If the documents do not contain the answer, say that you \
do not know.";

#[derive(serde::Deserialize)]
struct Doc {
    title: String,
    text: String,
}

/// The template.
pub struct Rag;

impl Template for Rag {
    fn render(req: &Request) -> Result<Rendered, Error> {
        let question = req
            .last_user()
            .ok_or_else(|| Error::new("the request has no user message"))?;
        let docs: Vec<Doc> = match req.var("documents") {
            Some(raw) => serde_json::from_str(raw).map_err(|e| {
                Error::new(format!(
                    "the `documents` variable must be a JSON array of {{title, text}}: {e}"
                ))
            })?,
            None => Vec::new(),
        };
        let mut context = String::new();
        for (i, d) in docs.iter().enumerate() {
            context.push_str(&format!("[{}] {}\n{}\n\n", i + 1, d.title, d.text.trim()));
        }
        if docs.is_empty() {
            context.push_str("(no documents were retrieved)\n\n");
        }
        let mut out = Rendered::default();
        out.push(Segment::fixed("system", INSTRUCTIONS));
        out.push(Segment::varying("user", format!("Documents:\n\n{context}")));
        out.push(Segment::varying("user", format!("Question: {question}")));
        Ok(out)
    }
}

cachet_guest_sdk::export_template!(Rag);
