use cachet_backend::tokenizer::ChatMessage;

use super::*;

fn seg(role: &str, text: &str, cache: Cache) -> Segment {
    Segment {
        cache,
        ..Segment::fixed(role, text)
    }
}

fn rules() -> Rules {
    Rules::default()
}

fn statics(n: &Normalized) -> Vec<String> {
    n.segments
        .iter()
        .filter(|s| s.cache == Cache::Static)
        .map(|s| s.text.clone())
        .collect()
}

#[test]
fn the_clock_and_user_id_at_the_top_of_a_system_prompt_move_before_the_question() {
    let prompt = |now: &str, user: &str| {
        vec![
            seg(
                "system",
                &format!("Current time: {now}. User id: {user}.\nYou are the assistant of Contoso Bank. Be brief."),
                Cache::Static,
            ),
            seg("user", "What is my balance?", Cache::Dynamic),
        ]
    };
    let a = normalize(&prompt("2026-11-29T12:00:00Z", "user-42"), &rules());
    let b = normalize(&prompt("2026-11-30T08:15:30Z", "user-7"), &rules());
    assert_eq!(
        statics(&a),
        ["You are the assistant of Contoso Bank. Be brief."]
    );
    assert_eq!(statics(&a), statics(&b));
    assert_eq!(
        a.relocated,
        ["Current time: 2026-11-29T12:00:00Z", "User id: user-42"]
    );
    assert_eq!(
        a.segments[1],
        seg(
            "user",
            "Current time: 2026-11-29T12:00:00Z\nUser id: user-42\n\n",
            Cache::Dynamic
        )
    );
    assert_eq!(
        a.segments[2],
        seg("user", "What is my balance?", Cache::Dynamic)
    );
    // Idempotent.
    assert_eq!(
        normalize(&a.segments, &rules()),
        Normalized {
            segments: a.segments.clone(),
            relocated: vec![]
        }
    );
    // Off means off.
    let off = Rules {
        mode: Mode::Off,
        ..Rules::default()
    };
    assert_eq!(
        normalize(&prompt("2026-11-29T12:00:00Z", "u"), &off).segments,
        prompt("2026-11-29T12:00:00Z", "u")
    );
}

#[test]
fn every_volatile_format_is_found() {
    let cases = [
        (
            "Generated 2026-11-29T12:00:00.123+01:00 by the scheduler",
            "2026-11-29T12:00:00.123+01:00",
        ),
        (
            "Sent on Sun, 29 Nov 2026 12:00:00 +0000 via mail",
            "Sun, 29 Nov 2026 12:00:00 +0000",
        ),
        ("Logged at 2026-11-29 12:00 in Paris", "2026-11-29 12:00"),
        ("The meeting is Nov 29, 2026 in room B", "Nov 29, 2026"),
        (
            "The meeting is Sunday, November 29, 2026 at 9:30 AM sharp",
            "Sunday, November 29, 2026 at 9:30 AM",
        ),
        ("Filed 29 Nov 2026 with the clerk", "29 Nov 2026"),
        ("Due 11/29/2026 at the latest", "11/29/2026"),
        ("The train leaves at 14:35 UTC from track 4", "14:35 UTC"),
        ("Snapshot 1795000000 was taken", "1795000000"),
        ("Snapshot 1795000000123 was taken", "1795000000123"),
        (
            "Request 3f2b8c1e-9a4d-4c7b-8e21-5d6f7a8b9c0d failed",
            "3f2b8c1e-9a4d-4c7b-8e21-5d6f7a8b9c0d",
        ),
        (
            "Commit 9fceb02d0ae598e95dc970b74767f19372d61af8 is live",
            "9fceb02d0ae598e95dc970b74767f19372d61af8",
        ),
        (
            "Token dXNlcjQyOnNlY3JldDEyMzQ1Njc4OTA= expired",
            "dXNlcjQyOnNlY3JldDEyMzQ1Njc4OTA=",
        ),
        (
            "Write to alice.smith+ops@example.co.uk soon",
            "alice.smith+ops@example.co.uk",
        ),
        ("Context session_id=abc123XYZ ok", "session_id=abc123XYZ"),
        (
            "Hello Customer ID: 99812, welcome back",
            "Customer ID: 99812",
        ),
    ];
    for (text, want) in cases {
        let spans = detect::find(text, &[]);
        let got: Vec<&str> = spans.iter().map(|s| &text[s.start..s.end]).collect();
        assert_eq!(got, [want], "in {text:?}");
    }
    // A tenant's own pattern.
    let extra = [Regex::new(r"ORD-\d{6}").unwrap()];
    let spans = detect::find("Your order ORD-123456 shipped", &extra);
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].kind, "tenant");
    // Labels come along.
    let text = "Today is 2026-11-29. Be kind.";
    let s = detect::find(text, &[]);
    assert_eq!(&text[s[0].start..s[0].end], "Today is 2026-11-29");
}

/// Ordinary instructions: nothing in them may be taken for a volatile value.
const PLAIN: &[&str] = &[
    "You are a helpful assistant.",
    "Answer in at most 3 sentences.",
    "Our office is in Room 101 of Building 7.",
    "Pi is about 3.14159 and e about 2.71828.",
    "Version 2 of the API supports 50 requests per second.",
    "The 1990s were a decade of change; 2020 was not.",
    "Use the format key: value for settings, e.g. colour: blue.",
    "Never share passwords, card numbers or PINs.",
    "Refer to section 4.2.1 of the manual.",
    "Prices: a small coffee costs $3.50 and a large one $4.",
    "Reply in English or French (fr-FR) only.",
    "Step 1: read the question. Step 2: think. Step 3: answer.",
    "The ratio is 16:9 for wide screens.",
    "Call +44 20 7946 0958 for support.",
];

#[test]
fn text_without_volatile_spans_is_unchanged() {
    for t in PLAIN {
        let spans = detect::find(t, &[]);
        assert!(spans.is_empty(), "{t:?}: {spans:?}");
    }
    let segs = vec![
        seg("system", &PLAIN.join("\n"), Cache::Static),
        seg("user", "Hi at 12:00 from bob@example.com", Cache::Dynamic),
    ];
    let n = normalize(&segs, &rules());
    assert_eq!(n.segments, segs, "dynamic segments are never touched");
    assert!(n.relocated.is_empty());
}

/// A tiny deterministic generator for the property tests.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn hex(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| b"0123456789abcdef"[self.below(16) as usize] as char)
            .collect()
    }
    /// A labelled or bare volatile value, and the exact value text.
    fn volatile(&mut self) -> (String, String) {
        let y = 2020 + self.below(10);
        let (mo, d, h, mi, s) = (
            1 + self.below(12),
            1 + self.below(28),
            self.below(24),
            self.below(60),
            self.below(60),
        );
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let value = match self.below(9) {
            0 => format!("{y}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z"),
            1 => format!("{y}-{mo:02}-{d:02} {h:02}:{mi:02}"),
            2 => format!("{} {d}, {y}", MONTHS[mo as usize - 1]),
            3 => format!("{}", 1_600_000_000 + self.below(300_000_000)),
            4 => format!(
                "{}-{}-4{}-a{}-{}",
                self.hex(8),
                self.hex(4),
                self.hex(3),
                self.hex(3),
                self.hex(12)
            ),
            5 => format!("u{}x{}", self.below(1000), self.hex(17)),
            6 => format!("user{}@example.org", self.below(100_000)),
            7 => format!("{h:02}:{mi:02}"),
            _ => format!("{}{}", self.hex(12), self.below(1_000_000)),
        };
        let labelled = match self.below(4) {
            0 => format!("Current time: {value}"),
            1 => format!("User id: {value}"),
            2 => format!("Reference = {value}"),
            _ => value.clone(),
        };
        (labelled, value)
    }
}

/// A system prompt of plain sentences with volatile values put in at the given slots (the same
/// slots and sentences for two requests: only the values differ).
fn prompt_with(rng: &mut Rng, shape: &[(usize, bool)]) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut values = Vec::new();
    for &(sentence, with_value) in shape {
        if with_value {
            let (labelled, value) = rng.volatile();
            text.push_str(&labelled);
            text.push_str(". ");
            values.push(value);
        }
        text.push_str(PLAIN[sentence]);
        text.push(if sentence % 3 == 0 { '\n' } else { ' ' });
    }
    (text, values)
}

/// 1 to `most` sentences, each with a volatile value before it one time in `one_in`.
fn random_shape(rng: &mut Rng, most: u64, one_in: u64) -> Vec<(usize, bool)> {
    let n = 1 + rng.below(most) as usize;
    (0..n)
        .map(|_| {
            (
                rng.below(PLAIN.len() as u64) as usize,
                rng.below(one_in) == 0,
            )
        })
        .collect()
}

#[test]
fn properties_hold_on_random_prompts() {
    let mut shapes = Rng(0x5eed);
    for case in 0..1000 {
        let shape = random_shape(&mut shapes, 8, 3);
        let mut r1 = Rng(1000 + case);
        let mut r2 = Rng(9_000_000 + case * 7);
        let (t1, v1) = prompt_with(&mut r1, &shape);
        let (t2, _) = prompt_with(&mut r2, &shape);
        let segs = |t: &str| {
            vec![
                seg("system", t, Cache::Static),
                seg("user", "question?", Cache::Dynamic),
            ]
        };
        let a = normalize(&segs(&t1), &rules());
        let b = normalize(&segs(&t2), &rules());
        // Same static prefix for requests that differ only in volatile values.
        assert_eq!(statics(&a), statics(&b), "case {case}:\n{t1}\n---\n{t2}");
        // No value lost: each one is in the context block, verbatim.
        let block = a
            .segments
            .iter()
            .find(|s| s.cache == Cache::Dynamic)
            .unwrap();
        for v in &v1 {
            assert!(
                block.text.contains(v.as_str()),
                "case {case}: {v:?} lost from {:?}",
                block.text
            );
            assert!(
                !statics(&a)[0].contains(v.as_str()),
                "case {case}: {v:?} still static"
            );
        }
        // Nothing else is lost: every plain sentence is still in the static text.
        for &(s, _) in &shape {
            assert!(
                statics(&a)[0].contains(PLAIN[s]),
                "case {case}: lost {:?}",
                PLAIN[s]
            );
        }
        // Idempotent.
        assert_eq!(
            normalize(&a.segments, &rules()).segments,
            a.segments,
            "case {case}"
        );
        // Without volatile values, unchanged.
        if v1.is_empty() {
            assert_eq!(a.segments, segs(&t1), "case {case}");
        }
    }
}

#[test]
fn chat_requests_count_earlier_turns_as_static() {
    let msgs = [
        ChatMessage::new("system", "Be brief. Session id: 8812"),
        ChatMessage::new("user", "hi"),
        ChatMessage::new("assistant", "hello"),
        ChatMessage::new("user", "what time is it? 12:00?"),
    ];
    let segs = chat_segments(&msgs);
    assert_eq!(
        segs.iter().map(|s| s.cache).collect::<Vec<_>>(),
        [Cache::Static, Cache::Static, Cache::Static, Cache::Dynamic]
    );
    let n = normalize(&segs, &rules());
    assert_eq!(n.segments[0].text, "Be brief.");
    assert_eq!(
        n.segments[3],
        seg("user", "Session id: 8812\n\n", Cache::Dynamic)
    );
    assert_eq!(n.segments[4].text, "what time is it? 12:00?");
}

#[test]
fn a_tool_conversation_is_request_data_and_keeps_its_messages_apart() {
    use cachet_backend::tokenizer::ToolCall;
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = vec![ToolCall {
        id: "call_1".into(),
        name: "clock".into(),
        arguments: "{}".into(),
    }];
    let result = |id: &str, text: &str| {
        let mut m = ChatMessage::new("tool", text);
        m.tool_call_id = Some(id.into());
        m
    };
    let msgs = [
        ChatMessage::new("system", "Be brief. Session id: 8812"),
        ChatMessage::new("user", "what time is it?"),
        call,
        result("call_1", "2026-12-01T12:00:00Z"),
        result("call_2", "second result"),
    ];
    let segs = chat_segments(&msgs);
    assert_eq!(
        segs.iter().map(|s| s.cache).collect::<Vec<_>>(),
        [
            Cache::Static,
            Cache::Static,
            Cache::Dynamic,
            Cache::Dynamic,
            Cache::Dynamic
        ],
        "the call and its results are dynamic: never normalized, never in the static prefix"
    );
    let n = normalize(&segs, &rules());
    // The relocated session id goes into the first dynamic message (the call), which stays
    // one message with its calls.
    let (back, first) = to_messages(&n.segments);
    assert_eq!(back.len(), 5, "{back:?}");
    assert_eq!(back[2].tool_calls, msgs[2].tool_calls);
    assert_eq!(back[2].content, "Session id: 8812\n\n");
    assert_eq!(first, Some((2, 0)));
    // Two results in a row stay two messages, each with its id; the clock in a result is
    // left alone.
    assert_eq!(back[3].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(back[3].content, "2026-12-01T12:00:00Z");
    assert_eq!(back[4].tool_call_id.as_deref(), Some("call_2"));
}

#[test]
fn names_and_thinking_keep_their_messages_apart_through_normalization() {
    let named = |name: &str, text: &str| {
        let mut m = ChatMessage::new("user", text);
        m.name = Some(name.into());
        m
    };
    let mut answer = ChatMessage::new("assistant", "Paris.");
    answer.reasoning_content = Some("Easy.".into());
    let msgs = [
        ChatMessage::new("system", "Be brief. Session id: 8812"),
        named("alice", "I'm Alice."),
        named("bob", "Capital of France?"),
        answer,
        named("bob", "Thanks"),
    ];
    let n = normalize(&chat_segments(&msgs), &rules());
    let (back, _) = to_messages(&n.segments);
    // The session id moved into the first dynamic message (bob's last), which keeps its name.
    assert_eq!(back.len(), 5, "{back:?}");
    assert_eq!(back[0].content, "Be brief.");
    for (b, m) in back.iter().zip(&msgs).skip(1) {
        assert_eq!((&b.role, &b.name), (&m.role, &m.name));
        assert_eq!(b.reasoning_content, m.reasoning_content);
    }
    assert_eq!(back[4].content, "Session id: 8812\n\nThanks");
}

#[test]
fn bad_rules_say_what_to_fix() {
    assert!(Rules::new(Some("sometimes"), &[])
        .unwrap_err()
        .to_string()
        .contains("\"off\", \"relocate\" or \"relocate-after\""));
    let unclosed = Rules::new(None, &["(unclosed".into()]).unwrap_err();
    assert!(unclosed.to_string().contains("(unclosed"));
    // The regex crate's own words stay as the cause.
    let cause = std::error::Error::source(&unclosed).unwrap().to_string();
    assert!(cause.contains("unclosed group"), "{cause}");
    assert_eq!(Rules::new(None, &[]).unwrap().mode, Mode::Relocate);
}

#[test]
fn relocate_after_puts_the_values_behind_the_new_message_so_the_next_turn_reuses_it() {
    let after = Rules::new(Some("relocate-after"), &[]).unwrap();
    let system = "Current time: 2026-11-29T12:00:00Z. You are a helpful assistant.";
    let turn = |msgs: &[(&str, &str)], rules: &Rules| {
        let msgs: Vec<ChatMessage> = msgs.iter().map(|(r, t)| ChatMessage::new(*r, *t)).collect();
        let n = normalize(&chat_segments(&msgs), rules);
        let (messages, _) = to_messages(&n.segments);
        messages
            .iter()
            .map(|m| format!("<{}>{}", m.role, m.content))
            .collect::<String>()
    };
    let t1 = [("system", system), ("user", "What is a B-tree?")];
    let t2 = [
        ("system", system),
        ("user", "What is a B-tree?"),
        ("assistant", "A balanced search tree."),
        ("user", "And a trie?"),
    ];
    // After: the first turn's question precedes its values, so the second turn's prompt (which
    // repeats the question without them) shares it.
    let (a1, a2) = (turn(&t1, &after), turn(&t2, &after));
    assert!(
        a1.contains("<user>What is a B-tree?\n\nCurrent time: 2026-11-29T12:00:00Z"),
        "{a1}"
    );
    let shared = |x: &str, y: &str| x.bytes().zip(y.bytes()).take_while(|(a, b)| a == b).count();
    assert!(
        a2.starts_with(&a1[..a1.find("\n\nCurrent time").unwrap()]),
        "{a1}\n{a2}"
    );
    assert!(
        a2.ends_with("And a trie?\n\nCurrent time: 2026-11-29T12:00:00Z"),
        "{a2}"
    );
    // Before (the default): the values come first, so the turns share only the system prompt.
    let (b1, b2) = (turn(&t1, &rules()), turn(&t2, &rules()));
    assert!(
        b1.contains("<user>Current time: 2026-11-29T12:00:00Z\n\nWhat is a B-tree?"),
        "{b1}"
    );
    assert!(shared(&b1, &b2) < shared(&a1, &a2));
    // Idempotent and lossless as before.
    let segs = chat_segments(&[
        ChatMessage::new("system", system),
        ChatMessage::new("user", "Hi"),
    ]);
    let once = normalize(&segs, &after);
    assert_eq!(normalize(&once.segments, &after).segments, once.segments);
    assert_eq!(
        once.relocated,
        vec!["Current time: 2026-11-29T12:00:00Z".to_string()]
    );
}

/// One tenant's rules normalize request after request from their memo: every result equals a
/// fresh normalization's (the random prompts above, each sent twice and again after others), the
/// memo keeps to its byte bound, and a text over the size limit is normalized without it.
#[test]
fn the_memo_answers_as_normalizing_again_would_and_stays_bounded() {
    let tenant = Rules::new(None, &[r"ORD-\d{6}".into()]).unwrap();
    let fresh = || Rules::new(None, &[r"ORD-\d{6}".into()]).unwrap();
    let mut shapes = Rng(0xface);
    let mut sent = Vec::new();
    for case in 0..300 {
        let shape = random_shape(&mut shapes, 6, 2);
        let (mut text, _) = prompt_with(&mut Rng(77 + case), &shape);
        if case % 5 == 0 {
            text.push_str(&format!(" Order ORD-{:06} is open.", case * 37));
        }
        sent.push(vec![
            seg("system", &text, Cache::Static),
            seg("user", "question?", Cache::Dynamic),
        ]);
    }
    for round in 0..2 {
        for (i, segs) in sent.iter().enumerate() {
            let want = normalize(segs, &fresh());
            assert_eq!(normalize(segs, &tenant), want, "round {round}, prompt {i}");
            assert_eq!(
                normalize(segs, &tenant),
                want,
                "round {round}, prompt {i}, again"
            );
        }
    }
    let distinct: std::collections::HashSet<&str> =
        sent.iter().map(|s| s[0].text.as_str()).collect();
    let (texts, bytes) = tenant.memo.size();
    assert_eq!(texts, distinct.len(), "each distinct static text once");
    assert!(bytes <= MEMO_BYTES);
    // Past its bound the least recently used texts go, and results stay right.
    let big = "Be brief. ".repeat(6_000);
    for i in 0..80 {
        let text = format!("{i} {big} Ticket id: T-{i}");
        let segs = [seg("system", &text, Cache::Static)];
        let n = normalize(&segs, &tenant);
        assert_eq!(n, normalize(&segs, &fresh()));
        assert_eq!(n.relocated, [format!("Ticket id: T-{i}")]);
    }
    let (texts, bytes) = tenant.memo.size();
    assert!(bytes <= MEMO_BYTES, "{bytes} bytes held");
    assert!(texts < sent.len() + 80, "{texts} texts: nothing was let go");
    // A text over the size limit is normalized every time, never kept.
    let huge = format!("{} Session id: s-1", "x ".repeat(MEMO_MAX_TEXT));
    let before = tenant.memo.size().0;
    let n = normalize(&[seg("system", &huge, Cache::Static)], &tenant);
    assert_eq!(n.relocated, ["Session id: s-1"]);
    assert_eq!(tenant.memo.size().0, before);
}
