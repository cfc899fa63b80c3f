//! Prompt normalization: makes the cacheable prefix of prompts identical across requests.
//!
//! Templates (and people) write volatile values into text that is otherwise the same for every
//! request: "Current time: 2026-11-29T12:00:00Z. User id: user-42." at the top of a system prompt
//! makes every prompt differ from its first tokens on, and the prefix cache never hits. The
//! normalizer finds such spans in the *static* segments ([`detect`]), cuts them out (with their
//! labels, and the separators they leave), and relocates them, verbatim, into one context block
//! placed right before the first *dynamic* segment (`relocate`) or right after it
//! (`relocate-after`): the model still sees every value, and the static prefix is the same for
//! everyone. After the dynamic text, a multi-turn conversation's earlier user messages stay
//! cacheable too (the next turn's prompt repeats them without this turn's values).
//!
//! Without a tenant template, the model's chat template applies and the system message and
//! earlier turns count as static; the last message is dynamic.
//!
//! Properties (tested): idempotent; no value lost; requests that differ only in volatile values
//! get the same static segments; text without volatile spans is unchanged.

pub mod detect;
pub mod public;
pub mod tokens;

use std::sync::{Arc, Mutex};

use cachet_backend::tokenizer::ChatMessage;
use cachet_guest_sdk::{Cache, Segment};
use lru::LruCache;
use regex::Regex;

/// What the normalizer does for a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Leave prompts as they are.
    Off,
    /// Move volatile spans out of static segments into a block before the first dynamic segment
    /// (the default).
    #[default]
    Relocate,
    /// The same, with the block after the first dynamic segment.
    RelocateAfter,
}

impl std::str::FromStr for Mode {
    type Err = InvalidRules;
    fn from_str(s: &str) -> Result<Self, InvalidRules> {
        match s {
            "off" => Ok(Mode::Off),
            "relocate" => Ok(Mode::Relocate),
            "relocate-after" => Ok(Mode::RelocateAfter),
            other => Err(InvalidRules::Mode(other.to_string())),
        }
    }
}

/// What is wrong with a tenant's normalization settings.
#[derive(Debug, thiserror::Error)]
pub enum InvalidRules {
    #[error("normalize must be \"off\", \"relocate\" or \"relocate-after\", not \"{0}\"")]
    Mode(String),
    #[error("volatile_patterns has {0} patterns; the limit is {MAX_PATTERNS}")]
    TooMany(usize),
    #[error("a volatile_patterns entry is {0} bytes; the limit is {MAX_PATTERN_BYTES}")]
    TooLong(usize),
    #[error("volatile_patterns entry `{pattern}` is not a regex within the limits")]
    Pattern {
        pattern: String,
        #[source]
        source: regex::Error,
    },
}

/// A tenant's normalization rules.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub mode: Mode,
    /// Tenant-defined volatile patterns, on top of the built-in ones.
    pub patterns: Vec<Regex>,
    /// Static texts already normalized under these rules.
    pub memo: Memo,
}

/// Static texts already normalized under one tenant's rules. A system prompt comes back request
/// after request, and finding its spans scans it once per pattern (thirteen built-in ones, and
/// the tenant's); its result is kept under the text's hash instead. Bounded by bytes; one per
/// tenant (each tenant's rules are its own), so no tenant sees another's prompts in its timings.
#[derive(Clone, Default)]
pub struct Memo(Arc<Mutex<MemoEntries>>);

/// Most bytes of texts and their spans one tenant's memo holds.
pub const MEMO_BYTES: usize = 2 << 20;
/// Longer static texts are normalized every time (one would take a large share of the memo).
pub const MEMO_MAX_TEXT: usize = 64 << 10;

struct MemoEntries {
    map: LruCache<[u8; 32], Arc<Done>>,
    bytes: usize,
}

impl Default for MemoEntries {
    fn default() -> Self {
        MemoEntries {
            map: LruCache::unbounded(),
            bytes: 0,
        }
    }
}

/// A static text normalized: what is left of it, and the spans taken out, in order.
#[derive(Debug, PartialEq)]
struct Done {
    text: String,
    relocated: Vec<String>,
}

impl Done {
    /// What the memo counts for it (the key and bookkeeping included).
    fn bytes(&self) -> usize {
        128 + self.text.len() + self.relocated.iter().map(|r| r.len() + 24).sum::<usize>()
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.entries();
        write!(f, "Memo({} texts, {} bytes)", m.map.len(), m.bytes)
    }
}

impl Memo {
    fn entries(&self) -> std::sync::MutexGuard<'_, MemoEntries> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `text` normalized under `patterns` (and the built-in ones), from the memo if it was
    /// before.
    fn normalized(&self, text: &str, patterns: &[Regex]) -> Arc<Done> {
        if text.len() > MEMO_MAX_TEXT {
            return Arc::new(normalize_text(text, patterns));
        }
        let key = *blake3::hash(text.as_bytes()).as_bytes();
        if let Some(d) = self.entries().map.get(&key) {
            return d.clone();
        }
        let d = Arc::new(normalize_text(text, patterns));
        let mut m = self.entries();
        if m.map.put(key, d.clone()).is_none() {
            m.bytes += d.bytes();
        }
        while m.bytes > MEMO_BYTES {
            let Some((_, old)) = m.map.pop_lru() else {
                break;
            };
            m.bytes -= old.bytes();
        }
        d
    }

    /// Texts held, and the bytes counted for them.
    #[cfg(test)]
    pub fn size(&self) -> (usize, usize) {
        let m = self.entries();
        (m.map.len(), m.bytes)
    }
}

/// Most `volatile_patterns` a tenant may have: each is run over every static segment of every
/// request, and an operator's change compiles them all before it is written.
pub const MAX_PATTERNS: usize = 64;
/// Longest pattern, in bytes.
pub const MAX_PATTERN_BYTES: usize = 1024;
/// Most memory one compiled pattern may take (the regex crate's size limit).
pub const MAX_PATTERN_PROGRAM: usize = 1 << 20;

impl Rules {
    /// Rules from a tenant's config values; an error says which pattern is wrong, or which
    /// limit the patterns are past (checked before any is compiled).
    pub fn new(mode: Option<&str>, patterns: &[String]) -> Result<Rules, InvalidRules> {
        let mode = mode.map_or(Ok(Mode::Relocate), str::parse)?;
        if patterns.len() > MAX_PATTERNS {
            return Err(InvalidRules::TooMany(patterns.len()));
        }
        if let Some(p) = patterns.iter().find(|p| p.len() > MAX_PATTERN_BYTES) {
            return Err(InvalidRules::TooLong(p.len()));
        }
        let patterns = patterns
            .iter()
            .map(|p| {
                regex::RegexBuilder::new(p)
                    .size_limit(MAX_PATTERN_PROGRAM)
                    .dfa_size_limit(MAX_PATTERN_PROGRAM)
                    .build()
                    .map_err(|source| InvalidRules::Pattern {
                        pattern: p.clone(),
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Rules {
            mode,
            patterns,
            memo: Memo::default(),
        })
    }
}

/// A normalized prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    pub segments: Vec<Segment>,
    /// The relocated spans, verbatim, in prompt order.
    pub relocated: Vec<String>,
}

/// Segments of a plain chat request: every message but the last is static, except the tool
/// conversation — tool results and the calls they answer are request data (dynamic).
pub fn chat_segments(messages: &[ChatMessage]) -> Vec<Segment> {
    let n = messages.len();
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| Segment {
            role: m.role.clone(),
            text: m.content.clone(),
            cache: if i + 1 < n && m.tool_calls.is_empty() && m.tool_call_id.is_none() {
                Cache::Static
            } else {
                Cache::Dynamic
            },
            tool_calls: m.tool_calls.clone(),
            tool_call_id: m.tool_call_id.clone(),
            name: m.name.clone(),
            reasoning_content: m.reasoning_content.clone(),
        })
        .collect()
}

/// Chat messages from segments (consecutive segments of one role make one message), and where
/// the first dynamic text starts: (message index, byte offset in its content).
pub fn to_messages(segments: &[Segment]) -> (Vec<ChatMessage>, Option<(usize, usize)>) {
    let mut messages: Vec<ChatMessage> = Vec::new();
    let mut first_dynamic = None;
    for s in segments {
        let n = messages.len();
        match messages.last_mut() {
            // A tool result is a message of its own, a message's calls come after its text,
            // its thinking before it, and one participant's text is not joined to another's.
            Some(m)
                if m.role == s.role
                    && m.tool_call_id.is_none()
                    && s.tool_call_id.is_none()
                    && m.tool_calls.is_empty()
                    && m.name == s.name
                    && s.reasoning_content.is_none() =>
            {
                if s.cache == Cache::Dynamic && first_dynamic.is_none() {
                    first_dynamic = Some((n - 1, m.content.len()));
                }
                m.content.push_str(&s.text);
                m.tool_calls.extend(s.tool_calls.iter().cloned());
            }
            _ => {
                if s.cache == Cache::Dynamic && first_dynamic.is_none() {
                    first_dynamic = Some((messages.len(), 0));
                }
                let mut m = ChatMessage::new(s.role.clone(), s.text.clone());
                m.tool_calls = s.tool_calls.clone();
                m.tool_call_id = s.tool_call_id.clone();
                m.name = s.name.clone();
                m.reasoning_content = s.reasoning_content.clone();
                messages.push(m);
            }
        }
    }
    (messages, first_dynamic)
}

/// A static text without its volatile spans, and the spans, in order.
fn normalize_text(text: &str, patterns: &[Regex]) -> Done {
    let mut text = text.to_string();
    let mut relocated = Vec::new();
    // Until no span is left: a cut can join what was around a span into a new one
    // ("session 3f2a…-11-29T12:00@00Z" leaves "session:00@00Z", a `key: value` pair), and
    // normalizing must be idempotent. Each round removes text, so this ends; real prompts
    // take one round and a second that finds nothing.
    loop {
        let spans = detect::find(&text, patterns);
        if spans.is_empty() {
            break;
        }
        relocated.extend(spans.iter().map(|sp| text[sp.start..sp.end].to_string()));
        let before = text.len();
        text = cut(&text, &spans);
        if text.len() >= before {
            break; // (spans are never empty, so this is only a safety net)
        }
    }
    Done { text, relocated }
}

/// Normalizes `segments` under `rules`.
pub fn normalize(segments: &[Segment], rules: &Rules) -> Normalized {
    let mut out = segments.to_vec();
    let mut relocated = Vec::new();
    if rules.mode == Mode::Off {
        return Normalized {
            segments: out,
            relocated,
        };
    }
    for s in out.iter_mut().filter(|s| s.cache == Cache::Static) {
        let d = rules.memo.normalized(&s.text, &rules.patterns);
        if !d.relocated.is_empty() {
            relocated.extend(d.relocated.iter().cloned());
            s.text.clone_from(&d.text);
        }
    }
    if relocated.is_empty() {
        return Normalized {
            segments: out,
            relocated,
        };
    }
    let after = rules.mode == Mode::RelocateAfter;
    let values = relocated.join("\n");
    let block = if after {
        format!("\n\n{values}")
    } else {
        format!("{values}\n\n")
    };
    match out.iter().position(|s| s.cache == Cache::Dynamic) {
        // A tool message stays one message (with its id), as does a named or thinking one:
        // the values go into its text.
        Some(i)
            if out[i].tool_call_id.is_some()
                || !out[i].tool_calls.is_empty()
                || out[i].name.is_some()
                || out[i].reasoning_content.is_some() =>
        {
            let text = &mut out[i].text;
            if after {
                text.push_str(&block);
            } else {
                text.insert_str(0, &block);
            }
        }
        Some(i) => {
            let role = out[i].role.clone();
            out.insert(if after { i + 1 } else { i }, Segment::varying(role, block));
        }
        None => out.push(Segment::varying("user", block)),
    }
    Normalized {
        segments: out,
        relocated,
    }
}

/// `text` without `spans`, and without the separators they leave behind: a span that starts a
/// sentence takes the punctuation and blanks after it; a span inside a sentence takes the blank
/// before it; a line that only the cut emptied goes with its newline.
fn cut(text: &str, spans: &[detect::Span]) -> String {
    let b = text.as_bytes();
    let blank = |c: u8| c == b' ' || c == b'\t';
    let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for sp in spans {
        let (mut start, mut end) = (sp.start, sp.end);
        // The character before the span, looking through blanks and earlier cuts.
        let mut k = start;
        loop {
            while k > 0 && blank(b[k - 1]) {
                k -= 1;
            }
            match ranges.last() {
                Some(&(rs, re)) if k > rs && k <= re => k = rs,
                _ => break,
            }
        }
        let starts_sentence =
            k == 0 || matches!(b[k - 1], b'\n' | b'.' | b'!' | b'?' | b';' | b':');
        if starts_sentence {
            if end < b.len() && matches!(b[end], b'.' | b',' | b';') {
                end += 1;
            }
            while end < b.len() && blank(b[end]) {
                end += 1;
            }
        } else if b[start - 1] == b' '
            && (end >= b.len()
                || matches!(
                    b[end],
                    b' ' | b',' | b'.' | b';' | b':' | b'!' | b'?' | b')' | b'\n'
                ))
        {
            start -= 1;
        }
        match ranges.last_mut() {
            Some(r) if start <= r.1 => r.1 = r.1.max(end),
            _ => ranges.push((start, end)),
        }
    }
    // Newlines are never cut: split ranges around them.
    let mut pieces: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        let mut a = s;
        for (i, _) in text[s..e].match_indices('\n') {
            if a < s + i {
                pieces.push((a, s + i));
            }
            a = s + i + 1;
        }
        if a < e {
            pieces.push((a, e));
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut pi = 0;
    let mut line_start = 0;
    let mut first = true;
    for line in text.split('\n') {
        let line_end = line_start + line.len();
        let mut kept = String::with_capacity(line.len());
        let mut at = line_start;
        let mut touched = false;
        while pi < pieces.len() && pieces[pi].1 <= line_end {
            let (ps, pe) = pieces[pi];
            kept.push_str(&text[at..ps]);
            at = pe;
            touched = true;
            pi += 1;
        }
        kept.push_str(&text[at..line_end]);
        let emptied = touched && kept.trim().is_empty();
        if !emptied {
            if !first {
                out.push('\n');
            }
            out.push_str(if touched {
                kept.trim_end_matches([' ', '\t'])
            } else {
                &kept
            });
            first = false;
        }
        line_start = line_end + 1;
    }
    out
}

#[cfg(test)]
mod tests;
