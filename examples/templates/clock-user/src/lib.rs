//! The pattern that ruins prefix caches: the current time and the user's id written into the
//! very first words of a system prompt that is otherwise the same for everyone. Every request's
//! "static" prefix then differs from the first token on; the gateway's normalizer (see
//! `gateway/src/normalize`) moves such values out of the cacheable prefix.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;

use alloc::format;

use cachet_guest_sdk::{Error, Rendered, Request, Segment, Template};

const POLICY: &str = "You are the assistant of Contoso Bank. Be brief and accurate. Never ask \
for passwords or card numbers. For anything about a specific account, direct the user to the \
secure messages page.";

/// The template.
pub struct ClockUser;

impl Template for ClockUser {
    fn render(req: &Request) -> Result<Rendered, Error> {
        let question = req
            .last_user()
            .ok_or_else(|| Error::new("the request has no user message"))?;
        let user = req.user.as_deref().unwrap_or("anonymous");
        let mut out = Rendered::default();
        out.push(Segment::fixed(
            "system",
            format!("Current time: {}. User id: {user}.\n{POLICY}", req.now),
        ));
        out.push(Segment::varying("user", question));
        Ok(out)
    }
}

cachet_guest_sdk::export_template!(ClockUser);
