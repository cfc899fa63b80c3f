//! Tokenizing a prompt whose static prefix repeats: the prefix's tokens are cached by the blake3
//! of its text, and only the rest is tokenized per request.
//!
//! A byte-level BPE tokenizer may merge across any boundary in plain text, but never across an
//! added token (`<|im_start|>`, `<|im_end|>`): those are split out before anything else. So the
//! prompt is cut only right after the last added token that ends inside the static prefix, and
//! `tokens(prefix) ++ tokens(rest) == tokens(prompt)` (tested on many prompts).

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use cachet_backend::tokenizer::{ChatMessage, TextTokenizer};
use cachet_backend::EngineError;

/// A private-use marker that no prompt contains, to find where content lands in a rendering.
const MARK: &str = "\u{F8FF}\u{F8FE}cachet-boundary\u{F8FE}\u{F8FF}";

/// The result of [`PrefixTokens::encode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    /// Tokens of the cached, request-independent prefix.
    pub stable_tokens: usize,
    /// Whether the prefix's tokens came from the cache.
    pub hit: bool,
}

/// The prefix-token cache of one tokenizer.
pub struct PrefixTokens {
    added: Vec<String>,
    cache: Mutex<lru::LruCache<[u8; 32], Arc<Vec<u32>>>>,
}

impl PrefixTokens {
    pub fn new(tok: &TextTokenizer, capacity: usize) -> PrefixTokens {
        let mut added: Vec<String> = tok
            .inner()
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .filter(|c| !c.is_empty())
            .collect();
        added.sort();
        added.dedup();
        PrefixTokens {
            added,
            cache: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(capacity.max(1)).expect("max(1)"),
            )),
        }
    }

    /// Where the static prefix of `prompt` may be cut: right after the last added token that
    /// ends at or before `boundary` (0 when there is none).
    pub fn split_point(&self, prompt: &str, boundary: usize) -> usize {
        let head = &prompt[..boundary.min(prompt.len())];
        self.added
            .iter()
            .filter_map(|a| head.rfind(a.as_str()).map(|i| i + a.len()))
            .max()
            .unwrap_or(0)
    }

    /// Tokenizes `prompt`, whose first `boundary` bytes do not depend on the request.
    pub fn encode(
        &self,
        tok: &TextTokenizer,
        prompt: &str,
        boundary: usize,
    ) -> Result<Encoded, EngineError> {
        let cut = self.split_point(prompt, boundary);
        if cut == 0 {
            return Ok(Encoded {
                ids: tok.encode(prompt)?,
                stable_tokens: 0,
                hit: false,
            });
        }
        let (head, tail) = prompt.split_at(cut);
        let key = *blake3::hash(head.as_bytes()).as_bytes();
        let cached = self.cache.lock().expect("cache lock").get(&key).cloned();
        let (prefix, hit) = match cached {
            Some(p) => (p, true),
            None => {
                let p = Arc::new(tok.encode(head)?);
                self.cache.lock().expect("cache lock").put(key, p.clone());
                (p, false)
            }
        };
        let mut ids = Vec::with_capacity(prefix.len() + tail.len() / 3);
        ids.extend_from_slice(&prefix);
        ids.extend(tok.encode(tail)?);
        Ok(Encoded {
            ids,
            stable_tokens: prefix.len(),
            hit,
        })
    }
}

/// Renders `messages` with the chat template and returns the prompt and the byte offset where
/// request-dependent content begins: the first dynamic text is at byte `offset` of message
/// `index`'s content. `None` for the offset when the rendering does not allow a clean cut.
pub fn render_with_boundary(
    tok: &TextTokenizer,
    messages: &[ChatMessage],
    first_dynamic: Option<(usize, usize)>,
) -> Result<(String, Option<usize>), EngineError> {
    let prompt = tok.render_chat(messages, true)?;
    let Some((index, offset)) = first_dynamic else {
        return Ok((prompt.clone(), Some(prompt.len())));
    };
    let mut probe: Vec<ChatMessage> = messages[..=index].to_vec();
    let m = &mut probe[index];
    m.content.truncate(offset);
    m.content.push_str(MARK);
    let rendered = tok.render_chat(&probe, false)?;
    let boundary = rendered
        .find(MARK)
        .filter(|&at| prompt.as_bytes().starts_with(&rendered.as_bytes()[..at]));
    Ok((prompt, boundary))
}
