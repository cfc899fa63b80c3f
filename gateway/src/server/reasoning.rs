//! A model's thinking split from its answer (`reasoning_content` beside `content`), for models
//! that think between `<think>` and `</think>` (Qwen3, DeepSeek-R1 and their distillations).
//!
//! One rule for whole and streamed responses: output that starts (after white space) with
//! `<think>` is reasoning up to `</think>` — or to its end, if it never closes (cut off by
//! `max_tokens`) — and content after it; output that does not start so is all content (Qwen3
//! with `enable_thinking: false`, whose template closes an empty think block in the prompt).

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Which parser `--reasoning-parser` chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// `<think>…</think>` (Qwen3, DeepSeek-R1).
    Think,
}

impl ReasoningParser {
    /// The parser for `--reasoning-parser NAME` (`auto`: `think` when the chat template writes
    /// `</think>`, else none).
    pub fn from_flag(
        name: &str,
        chat_template: Option<&str>,
    ) -> Result<Option<Self>, cachet_backend::BadValue> {
        match name {
            "auto" => Ok(chat_template
                .is_some_and(|t| t.contains(CLOSE))
                .then_some(ReasoningParser::Think)),
            "think" | "qwen3" | "deepseek_r1" => Ok(Some(ReasoningParser::Think)),
            "none" => Ok(None),
            other => Err(cachet_backend::BadValue::unknown(
                "reasoning parser",
                other,
                "auto, qwen3 (or think, deepseek_r1), none",
            )),
        }
    }
}

/// A piece of output: thinking or answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing decided yet: the output may still turn out to start with `<think>`.
    Start,
    Thinking,
    Answer,
}

/// Splits a stream of text pieces; text that may be the start of a tag is held back until the
/// next piece (or the end) decides it.
#[derive(Debug)]
pub struct ThinkSplitter {
    state: State,
    held: String,
}

impl Default for ThinkSplitter {
    fn default() -> Self {
        ThinkSplitter {
            state: State::Start,
            held: String::new(),
        }
    }
}

/// The longest suffix of `s` that is a proper prefix of `tag`.
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

impl ThinkSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// The pieces `text` completes.
    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(t) {
                        return out; // white space, or a part of `<think>`: wait
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => {
                    if let Some(at) = self.held.find(CLOSE) {
                        let rest = self.held.split_off(at + CLOSE.len());
                        self.held.truncate(at);
                        push(&mut out, Piece::Reasoning(std::mem::take(&mut self.held)));
                        self.held = rest;
                        self.state = State::Answer;
                    } else {
                        let keep = partial_tag(&self.held, CLOSE);
                        let tail = self.held.split_off(self.held.len() - keep);
                        push(
                            &mut out,
                            Piece::Reasoning(std::mem::replace(&mut self.held, tail)),
                        );
                        return out;
                    }
                }
                State::Answer => {
                    push(&mut out, Piece::Content(std::mem::take(&mut self.held)));
                    return out;
                }
            }
        }
    }

    /// [`ThinkSplitter::feed`] of one generated token's text, and whether the token belongs to
    /// the thinking (inside `<think>…</think>`, the tags included): what usage counts as
    /// reasoning tokens.
    pub fn feed_token(&mut self, text: &str) -> (Vec<Piece>, bool) {
        let before = self.state;
        let pieces = self.feed(text);
        (
            pieces,
            before == State::Thinking || self.state == State::Thinking,
        )
    }

    /// The end of the output: what was held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Thinking => push(&mut out, Piece::Reasoning(held)),
            State::Start | State::Answer => push(&mut out, Piece::Content(held)),
        }
        self.state = State::Answer;
        out
    }
}

fn push(out: &mut Vec<Piece>, p: Piece) {
    match &p {
        Piece::Reasoning(t) | Piece::Content(t) if t.is_empty() => {}
        _ => out.push(p),
    }
}

/// Pieces joined into (reasoning, content): `None` reasoning when there is none.
fn join(pieces: Vec<Piece>) -> (Option<String>, String) {
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for p in pieces {
        match p {
            Piece::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
            Piece::Content(t) => content.push_str(&t),
        }
    }
    (reasoning, content)
}

/// A whole output as (reasoning, content): `None` reasoning when it does not think.
pub fn split_whole(text: &str) -> (Option<String>, String) {
    let mut s = ThinkSplitter::new();
    let pieces = s.feed(text);
    finish_whole(s, pieces, text)
}

/// (reasoning, content) of a whole output `text` that `s` was fed, in pieces or at once, and
/// split into `pieces`.
pub fn finish_whole(
    mut s: ThinkSplitter,
    mut pieces: Vec<Piece>,
    text: &str,
) -> (Option<String>, String) {
    pieces.extend(s.finish());
    let (mut reasoning, content) = join(pieces);
    if reasoning.is_none() && text.trim_start().starts_with(OPEN) {
        reasoning = Some(String::new()); // an empty think block
    }
    (reasoning, content)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way of cutting `text` into two or three stream pieces gives the whole split.
    fn streamed_equals_whole(text: &str) {
        let whole = split_whole(text);
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &a in &cuts {
            for &b in cuts.iter().filter(|&&b| b >= a) {
                let mut s = ThinkSplitter::new();
                let mut pieces = Vec::new();
                for part in [&text[..a], &text[a..b], &text[b..]] {
                    pieces.extend(s.feed(part));
                }
                pieces.extend(s.finish());
                let (r, c) = join(pieces);
                assert_eq!(
                    (r.unwrap_or_default(), c),
                    (whole.0.clone().unwrap_or_default(), whole.1.clone()),
                    "{text:?} cut at {a}, {b}"
                );
            }
        }
    }

    #[test]
    fn thinking_is_split_from_the_answer_whole_and_streamed() {
        assert_eq!(
            split_whole("<think>\nadd 2 and 2\n</think>\n\nIt is 4."),
            (Some("\nadd 2 and 2\n".into()), "\n\nIt is 4.".into())
        );
        // No think block: all content (Qwen3 with enable_thinking false).
        assert_eq!(split_whole("It is 4."), (None, "It is 4.".into()));
        // Cut off while thinking: all reasoning.
        assert_eq!(
            split_whole("  <think>still going"),
            (Some("still going".into()), String::new())
        );
        // A `</think>` inside an answer that did not start thinking is text.
        assert_eq!(split_whole("a </think> b"), (None, "a </think> b".into()));
        assert_eq!(
            split_whole("<think></think>x"),
            (Some(String::new()), "x".into())
        );
        for t in [
            "<think>\nadd 2 and 2\n</think>\n\nIt is 4.",
            "It is 4.",
            "  <think>still going <",
            "<thin",
            "<think>a</thi",
            "ü<think>ö</think>ä",
            "<think>ü</think>ö</think>",
        ] {
            streamed_equals_whole(t);
        }
    }

    #[test]
    fn the_flag_picks_a_parser() {
        let qwen3 = "{%- if enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}";
        assert_eq!(
            ReasoningParser::from_flag("auto", Some(qwen3)).unwrap(),
            Some(ReasoningParser::Think)
        );
        assert_eq!(
            ReasoningParser::from_flag("auto", Some("{{ x }}")).unwrap(),
            None
        );
        assert_eq!(
            ReasoningParser::from_flag("none", Some(qwen3)).unwrap(),
            None
        );
        assert!(ReasoningParser::from_flag("r1", None)
            .unwrap_err()
            .to_string()
            .contains("qwen3"));
    }
}
