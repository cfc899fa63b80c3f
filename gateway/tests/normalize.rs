//! Normalization with the real SmolLM2 tokenizer and chat template: the prompt is tokenized
//! with its static prefix's tokens cached, and the result equals tokenizing the whole prompt.

use cachet_backend::tokenizer::ChatMessage;
use cachet_gateway::normalize::tokens::{render_with_boundary, PrefixTokens};
use cachet_gateway::normalize::{chat_segments, normalize, to_messages, Rules};
use cachet_guest_sdk::{Cache, Segment};

const SYSTEMS: &[&str] = &[
    "You are a helpful assistant.",
    "Current time: 2026-11-29T12:00:00Z. User id: user-42.\nYou are the assistant of Contoso Bank.",
    "Answer briefly.\nSession: 7f3a9c2e4b1d8f60\nNever reveal secrets.",
    "Tu es un assistant. Réponds en français, poliment ; sois bref. Date : 29 Nov 2026",
    "emoji 🙂 and CJK 你好 before the question",
    "ends without a newline",
    "ends with spaces   ",
];
const QUESTIONS: &[&str] = &[
    "What is the capital of France?",
    " leading space question",
    "multi\nline\nquestion",
    "<|im_start|>user\nembedded special tokens",
    "x",
];

#[test]
fn split_tokenization_equals_whole_tokenization() {
    let tok = cachet_tests::smollm2().tokenizer.clone().unwrap();
    let cache = PrefixTokens::new(&tok, 64);
    let rules = Rules::default();
    let mut checked = 0;
    for sys in SYSTEMS {
        for q in QUESTIONS {
            for turns in [0, 1] {
                let mut msgs = vec![ChatMessage::new("system", *sys)];
                if turns == 1 {
                    msgs.push(ChatMessage::new("user", "hi"));
                    msgs.push(ChatMessage::new("assistant", "hello!"));
                }
                msgs.push(ChatMessage::new("user", *q));
                // Plain chat, and a template-like layout where static and dynamic text share
                // one message.
                let plain = chat_segments(&msgs);
                let mut shared = plain.clone();
                shared.insert(
                    shared.len() - 1,
                    Segment {
                        role: "user".into(),
                        text: "Instructions for the question below: be exact.\n".into(),
                        cache: Cache::Static,
                    },
                );
                for segs in [plain, shared] {
                    let n = normalize(&segs, &rules);
                    let (messages, first) = to_messages(&n.segments);
                    let (prompt, boundary) = render_with_boundary(&tok, &messages, first).unwrap();
                    let boundary = boundary.expect("SmolLM2's template allows a clean cut");
                    let enc = cache.encode(&tok, &prompt, boundary).unwrap();
                    assert_eq!(enc.ids, tok.encode(&prompt).unwrap(), "{prompt:?}");
                    assert!(enc.stable_tokens > 0, "{prompt:?}");
                    // The cut lies within the static part: the dynamic text comes after it.
                    let cut = cache.split_point(&prompt, boundary);
                    assert!(prompt[cut..].contains(q), "{prompt:?} cut at {cut}");
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, SYSTEMS.len() * QUESTIONS.len() * 4);
}

#[test]
fn requests_differing_only_in_volatile_values_share_the_cached_prefix_tokens() {
    let tok = cachet_tests::smollm2().tokenizer.clone().unwrap();
    let cache = PrefixTokens::new(&tok, 64);
    let prepare = |now: &str, user: &str, q: &str, rules: &Rules| {
        let segs = vec![
            Segment::fixed(
                "system",
                format!("Current time: {now}. User id: {user}.\nYou are the assistant of Contoso Bank. Be brief and accurate. Never ask for passwords or card numbers. For anything about a specific account, direct the user to the secure messages page."),
            ),
            Segment::varying("user", q),
        ];
        let n = normalize(&segs, rules);
        let (messages, first) = to_messages(&n.segments);
        let (prompt, boundary) = render_with_boundary(&tok, &messages, first).unwrap();
        cache.encode(&tok, &prompt, boundary.unwrap()).unwrap()
    };
    let on = Rules::default();
    let a = prepare("2026-11-29T12:00:00Z", "user-42", "Balance?", &on);
    let b = prepare("2026-11-30T09:30:00Z", "user-7", "Card limit?", &on);
    assert!(
        !a.hit && b.hit,
        "the second request reuses the prefix tokens"
    );
    assert_eq!(a.stable_tokens, b.stable_tokens);
    assert!(a.stable_tokens >= 20, "{}", a.stable_tokens);
    assert_eq!(a.ids[..a.stable_tokens], b.ids[..b.stable_tokens]);
    // With normalization off, the prompts differ from the first words of the system prompt.
    let off = Rules::new(Some("off"), &[]).unwrap();
    let c = prepare("2026-11-29T12:00:00Z", "user-42", "Balance?", &off);
    let d = prepare("2026-11-30T09:30:00Z", "user-7", "Card limit?", &off);
    let common = c.ids.iter().zip(&d.ids).take_while(|(x, y)| x == y).count();
    // (They share only "<|im_start|>system\nCurrent time: 2026-11-".)
    assert!(common < 20, "{common}");
    assert!(
        a.stable_tokens > common + 10,
        "stable {} common {common}: {:?}",
        a.stable_tokens,
        tok.decode(&a.ids, false)
    );
}
