//! A support-bot persona: a fixed system prompt and few-shot examples (all static, so every
//! request shares them as one cached prefix), then the user's question (dynamic).
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;

use cachet_guest_sdk::{Error, Rendered, Request, Segment, Template};

const PERSONA: &str = "You are Ada, the support assistant of Northwind Routers. Answer in at most \
three sentences, politely, and only about Northwind products. If you do not know, say so and \
offer to open a ticket.";

const EXAMPLES: [(&str, &str); 2] = [
    (
        "My router's light is blinking orange.",
        "A blinking orange light means the router has no internet signal. Check that the WAN \
cable is plugged in, then restart the router.",
    ),
    (
        "How do I reset my password?",
        "Open 192.168.1.1, choose Settings → Admin, and pick Reset password. You will need the \
code printed under the router.",
    ),
];

/// The template.
pub struct SupportBot;

impl Template for SupportBot {
    fn render(req: &Request) -> Result<Rendered, Error> {
        let question = req
            .last_user()
            .ok_or_else(|| Error::new("the request has no user message"))?;
        let mut out = Rendered::default();
        out.push(Segment::fixed("system", PERSONA));
        for (q, a) in EXAMPLES {
            out.push(Segment::fixed("user", q));
            out.push(Segment::fixed("assistant", a));
        }
        out.push(Segment::varying("user", question));
        out.max_tokens = Some(256);
        Ok(out)
    }
}

cachet_guest_sdk::export_template!(SupportBot);
