//! From tokens to the text a client sees: incremental detokenization and stop strings. Text that
//! could still grow into a stop string is held back; a stop string found ends the request with
//! the text before it; a stop token's own text is never shown.

use crate::request::FinishReason;
use crate::tokenizer::{IncrementalDecoder, TextTokenizer};

/// The text state of one request's stream.
#[derive(Debug, Default)]
pub struct TextOutput {
    decoder: IncrementalDecoder,
    /// All generated text so far and how much of it was sent.
    text: String,
    sent: usize,
    /// The stop string found, if one ended the text.
    matched: Option<String>,
}

/// What one token adds to a stream.
#[derive(Debug, PartialEq, Eq)]
pub struct Delta {
    /// Text to send now.
    pub text: String,
    /// Set when this token ends the request (its own finish, or a stop string).
    pub finish: Option<FinishReason>,
}

impl TextOutput {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a generated token: `finish` is the scheduler's verdict on it (a stop token, a length
    /// limit), `stops` the request's stop strings.
    pub fn push(
        &mut self,
        tok: &TextTokenizer,
        id: u32,
        finish: Option<FinishReason>,
        stops: &[String],
    ) -> Delta {
        // Skip the text of a stop token; keep everything else.
        if finish != Some(FinishReason::Stop) {
            if let Ok(Some(piece)) = self.decoder.push(tok, id) {
                self.text.push_str(&piece);
            }
        }
        let unsent = &self.text[self.sent..];
        if let Some((pos, _)) = stops
            .iter()
            .filter_map(|s| unsent.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|x| x.0)
        {
            let text = unsent[..pos].to_string();
            self.matched = Some(
                stops
                    .iter()
                    .find(|s| unsent[pos..].starts_with(s.as_str()))
                    .cloned()
                    .unwrap_or_default(),
            );
            self.sent = self.text.len();
            return Delta {
                text,
                finish: Some(FinishReason::Stop),
            };
        }
        let hold = if finish.is_some() {
            0
        } else {
            held_back(unsent, stops)
        };
        let upto = self.text.len() - hold;
        let text = self.text[self.sent..upto].to_string();
        self.sent = upto;
        Delta { text, finish }
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Text held back when the request ends for `reason` (none after a stop string).
    pub fn rest(&self, reason: FinishReason) -> String {
        if reason == FinishReason::Stop && self.sent == self.text.len() {
            String::new()
        } else {
            self.text[self.sent..].to_string()
        }
    }
}

/// Bytes at the end of `unsent` that could still grow into a stop string.
pub fn held_back(unsent: &str, stops: &[String]) -> usize {
    let mut hold = 0;
    for s in stops {
        for k in (1..s.len().min(unsent.len() + 1)).rev() {
            if unsent.is_char_boundary(unsent.len() - k)
                && s.is_char_boundary(k)
                && unsent.ends_with(&s[..k])
            {
                hold = hold.max(k);
                break;
            }
        }
    }
    hold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_may_start_a_stop_string_is_held_back() {
        let stops = vec!["</answer>".to_string(), "END".to_string()];
        assert_eq!(held_back("the answer</ans", &stops), 5);
        assert_eq!(held_back("the answer E", &stops), 1);
        assert_eq!(held_back("the answer", &stops), 0);
        // Never inside a multi-byte character.
        assert_eq!(held_back("café", &["é!".to_string()]), 2);
        assert_eq!(held_back("caf\u{e9}", &["\u{301}x".to_string()]), 0);
    }
}
