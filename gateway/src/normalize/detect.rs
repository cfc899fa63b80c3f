//! Finding volatile spans: values that change from request to request (timestamps, dates, times,
//! epoch numbers, long numeric ids, UUIDs, long hex or base64 ids, emails, `user: …`-style pairs, and a tenant's
//! own patterns), each extended over the label that introduces it ("Current time: …").

use std::sync::OnceLock;

use regex::Regex;

/// A volatile span of a text: `start..end` in bytes, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
    pub kind: &'static str,
}

const MONTH: &str = "(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)";
const WEEKDAY: &str =
    "(?:Mon(?:day)?|Tue(?:sday)?|Wed(?:nesday)?|Thu(?:rsday)?|Fri(?:day)?|Sat(?:urday)?|Sun(?:day)?)";

fn builtin() -> &'static [(&'static str, Regex)] {
    static P: OnceLock<Vec<(&'static str, Regex)>> = OnceLock::new();
    P.get_or_init(|| {
        let tz = r"(?:Z|[+-]\d{2}:?\d{2}|\s?(?:UTC|GMT))";
        let pats: Vec<(&'static str, String)> = vec![
            // RFC 3339 / ISO 8601 date-times and dates, `2026-11-29 12:00`.
            (
                "datetime",
                format!(r"\b\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]\d{{2}}:\d{{2}}(?::\d{{2}}(?:[.,]\d+)?)?{tz}?)?\b"),
            ),
            // RFC 2822: `Sun, 29 Nov 2026 12:00:00 +0000`.
            (
                "datetime",
                format!(r"\b{WEEKDAY},?\s+\d{{1,2}}\s+{MONTH}\s+\d{{4}}(?:\s+\d{{2}}:\d{{2}}(?::\d{{2}})?(?:\s*(?:[+-]\d{{4}}|[A-Z]{{2,4}}))?)?"),
            ),
            // `Sunday, November 29, 2026`, `Nov 29, 2026`, `29 Nov 2026`, with an optional time.
            (
                "date",
                format!(r"(?i)\b(?:{WEEKDAY},?\s+)?{MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}(?:,?\s+(?:at\s+)?\d{{1,2}}:\d{{2}}(?::\d{{2}})?(?:\s?[ap]\.?m\.?)?)?\b"),
            ),
            ("date", format!(r"(?i)\b\d{{1,2}}(?:st|nd|rd|th)?\s+{MONTH}\.?,?\s+\d{{4}}\b")),
            ("date", r"\b\d{1,2}/\d{1,2}/(?:\d{4}|\d{2})\b".to_string()),
            // Times: `12:00`, `9:41:07 PM`, `14:30 UTC`.
            (
                "time",
                r"(?i)\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?[ap]\.?m\.?)?(?:\s?(?:UTC|GMT|[A-Z]{2,4}T))?\b"
                    .to_string(),
            ),
            // Epoch seconds (2001-2033) or milliseconds; other long numeric ids (12+ digits).
            ("epoch", r"\b1\d{9}(?:\d{3})?\b".to_string()),
            ("number", r"\b\d{12,}\b".to_string()),
            (
                "uuid",
                r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b".to_string(),
            ),
            ("email", r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b".to_string()),
            // `user: alice`, `session_id=abc123`, `Customer ID: 991`.
            (
                "id",
                r#"(?i)\b(?:user(?:[ _-]?(?:id|name))?|uid|session(?:[ _-]?id)?|request[ _-]?id|trace[ _-]?id|customer(?:[ _-]?id)?|account(?:[ _-]?id)?|client[ _-]?id|device[ _-]?id|order[ _-]?id|ticket[ _-]?id|tenant[ _-]?id)\s*[:=#]\s*["']?[^\s,;"']*[^\s,;"'.:]["']?"#
                    .to_string(),
            ),
            // Long hex ids (with at least one digit), base64-like tokens (20+ chars, 2+ digits).
            ("hex", r"\b[0-9a-fA-F]{16,}\b".to_string()),
            ("token", r"\b[A-Za-z0-9_+/-]{20,}={0,2}".to_string()),
        ];
        pats.into_iter()
            .map(|(k, p)| (k, Regex::new(&p).expect("built-in volatile patterns compile")))
            .collect()
    })
}

fn label_before() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    R.get_or_init(|| {
        Regex::new(
            r"(?i)(?:\b[A-Za-z][A-Za-z _-]{0,30}[:=]\s*|\b(?:today is|now is|it is now|the (?:current )?(?:date|time|date and time) is|as of|generated (?:at|on)|updated (?:at|on))\s+)$",
        )
        .expect("label pattern compiles")
    })
}

fn accept(kind: &str, text: &str) -> bool {
    let digits = text.bytes().filter(u8::is_ascii_digit).count();
    match kind {
        "hex" => digits >= 1 && text.bytes().any(|b| b.is_ascii_alphabetic()),
        "token" => digits >= 2 && text.bytes().any(|b| b.is_ascii_alphabetic()),
        _ => true,
    }
}

/// Volatile spans of `text`, sorted and non-overlapping (overlaps merge into one span),
/// each extended over a label right before it.
pub fn find(text: &str, extra: &[Regex]) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    let mut add = |kind: &'static str, re: &Regex| {
        for m in re.find_iter(text) {
            if m.start() < m.end() && accept(kind, m.as_str()) {
                spans.push(Span {
                    start: m.start(),
                    end: m.end(),
                    kind,
                });
            }
        }
    };
    for (kind, re) in builtin() {
        add(kind, re);
    }
    for re in extra {
        add("tenant", re);
    }
    spans.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
    let mut merged: Vec<Span> = Vec::new();
    for s in spans {
        match merged.last_mut() {
            Some(last) if s.start <= last.end => last.end = last.end.max(s.end),
            _ => merged.push(s),
        }
    }
    // Labels: "Current time: <ts>" moves as a whole. A label never reaches back past a line
    // start, a sentence end or the previous span.
    let mut floor = 0;
    for s in &mut merged {
        let line_start = text[..s.start].rfind('\n').map_or(0, |i| i + 1);
        let from = floor.max(line_start);
        if let Some(m) = label_before().find(&text[from..s.start]) {
            let label = &text[from + m.start()..s.start];
            if !label.contains(['.', '!', '?']) {
                s.start = from + m.start();
            }
        }
        floor = s.end;
    }
    merged
}
