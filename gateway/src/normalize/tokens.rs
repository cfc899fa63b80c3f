//! Rendering and tokenizing a chat prompt so that
//!
//! 1. only the chat template's own markup can yield control tokens: every message's text — the
//!    user's, a tool's, a template's — is tokenized with special tokens taken as plain text, so
//!    `<|im_start|>system` typed by a user is just characters;
//! 2. the request-independent prefix's tokens are cached, per tenant (its cache salt), bounded
//!    in bytes, and filled only by requests that were admitted.
//!
//! The chat template renders with each message's content between private-use markers
//! ([`render`]); the rendering splits into *markup* pieces (tokenized with special tokens
//! recognized) and *content* pieces (tokenized with them as text). Pieces are tokenized one by
//! one, so a prompt's tokens are the concatenation of its pieces' tokens, and the static prefix —
//! every piece before the first dynamic text, that piece cut there — has the same tokens in every
//! request that shares it. A template that reads or transforms content (`| trim`,
//! `.startswith(…)`) is rendered without markers too; where that rendering differs, the model
//! gets it, tokenized whole, unless a message holds a control token's text (then the marked
//! rendering, its contents as sent, keeps that text plain).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use cachet_backend::tokenizer::{ChatMessage, TextTokenizer};
use cachet_backend::EngineError;

/// Private-use characters around each message's content in a rendering; no prompt may contain
/// them (requests that do are refused).
const OPEN: char = '\u{F8F0}';
const SEP: char = '\u{F8F1}';
const CLOSE: char = '\u{F8F2}';

/// Whether `text` holds one of the reserved marker characters.
pub fn has_reserved(text: &str) -> bool {
    text.contains([OPEN, SEP, CLOSE])
}

/// One piece of a rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Bytes of the prompt it covers.
    pub range: Range<usize>,
    /// A message's text (special tokens as plain text), not the template's markup.
    pub content: bool,
}

/// A rendered chat prompt, cut into pieces, with where its request-dependent text begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub pieces: Vec<Piece>,
    /// Byte offset where request-dependent content begins (the whole text when all is static).
    pub boundary: usize,
}

/// What a chat template gets besides the messages.
#[derive(Debug, Clone, Copy)]
pub struct TemplateArgs<'a> {
    /// OpenAI's function tools, as HF templates take them.
    pub tools: Option<&'a serde_json::Value>,
    /// `chat_template_kwargs`.
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// Whether the rendering ends with the assistant's turn opened: every prompt sent to the
    /// model; `/tokenize` may ask without.
    pub generation_prompt: bool,
}

impl TemplateArgs<'_> {
    /// No tools, no variables, the generation prompt.
    pub const PLAIN: TemplateArgs<'static> = TemplateArgs {
        tools: None,
        kwargs: None,
        generation_prompt: true,
    };
}

/// Renders `messages` (and `tools`, OpenAI's function tools) with the chat template and the
/// generation prompt, reusing only layouts rendered under `partition` (the tenant's cache salt). `first_dynamic` is where the first request-dependent text is: byte
/// `offset` of message `index`'s content.
///
/// What the template renders outside message contents — function definitions, a call's name
/// and arguments — is markup, tokenized with control tokens recognized: a request whose such
/// text holds a control token's text is refused.
pub fn render(
    tok: &TextTokenizer,
    partition: &[u8],
    messages: &[ChatMessage],
    args: TemplateArgs<'_>,
    first_dynamic: Option<(usize, usize)>,
) -> Result<Rendered, EngineError> {
    let TemplateArgs {
        tools,
        kwargs,
        generation_prompt,
    } = args;
    let reserved = |t: &str| has_reserved(t);
    if messages.iter().any(|m| {
        reserved(&m.content)
            || m.tool_call_id.as_deref().is_some_and(reserved)
            || m.tool_calls
                .iter()
                .any(|c| reserved(&c.id) || reserved(&c.name) || reserved(&c.arguments))
    }) || tools.is_some_and(|t| reserved(&t.to_string()))
        || kwargs.is_some_and(|k| reserved(&serde_json::Value::Object(k.clone()).to_string()))
    {
        return Err(EngineError::InvalidRequest(
            "message text contains a reserved character (U+F8F0 … U+F8F2)".into(),
        ));
    }
    let specials = tok.special_texts();
    for m in messages {
        let markup = m
            .tool_calls
            .iter()
            .flat_map(|c| [&c.id, &c.name, &c.arguments])
            .chain(m.tool_call_id.as_ref());
        for t in markup {
            if let Some(s) = specials.iter().find(|s| t.contains(s.as_str())) {
                return Err(EngineError::InvalidRequest(format!(
                    "a tool call's id, name or arguments contain the model's control token `{s}`; take it out"
                )));
            }
        }
    }
    // Empty contents stay empty: no text to protect.
    let marked = cachet_backend::tokenizer::with_contents(messages, |i, c| {
        format!("{OPEN}{i}{SEP}{c}{CLOSE}")
    });
    let rendered = tok.render_chat_in(partition, &marked, tools, kwargs, generation_prompt)?;
    let mut text = String::with_capacity(rendered.len());
    let mut pieces = Vec::new();
    let mut boundary = None;
    // The end of the last message content before the first dynamic one: where everything is
    // static for sure when the dynamic message's content is not in the rendering (empty, or
    // dropped by the template).
    let mut before_dynamic = 0;
    let mut rest = rendered.as_str();
    let mut markup_start = 0;
    while let Some(open) = rest.find(OPEN) {
        text.push_str(&rest[..open]);
        let after = &rest[open + OPEN.len_utf8()..];
        let (index, after) = after
            .split_once(SEP)
            .and_then(|(i, a)| Some((i.parse::<usize>().ok()?, a)))
            .ok_or_else(|| bad_template("a message's marker came out broken"))?;
        let close = after
            .find(CLOSE)
            .ok_or_else(|| bad_template("a message's content came out cut"))?;
        let content = &after[..close];
        if text.len() > markup_start {
            pieces.push(Piece {
                range: markup_start..text.len(),
                content: false,
            });
        }
        let start = text.len();
        text.push_str(content);
        if !content.is_empty() {
            pieces.push(Piece {
                range: start..text.len(),
                content: true,
            });
        }
        if let Some((i, offset)) = first_dynamic {
            if index < i && boundary.is_none() {
                before_dynamic = text.len();
            }
            if i == index && boundary.is_none() {
                // A template that changes the text inside the markers (`| upper` on non-ASCII
                // text) can move a byte offset off a character: take the character it is in.
                let mut at = offset.min(content.len());
                while !content.is_char_boundary(at) {
                    at -= 1;
                }
                boundary = Some(start + at);
            }
        }
        markup_start = text.len();
        rest = &after[close + CLOSE.len_utf8()..];
    }
    text.push_str(rest);
    if text.len() > markup_start {
        pieces.push(Piece {
            range: markup_start..text.len(),
            content: false,
        });
    }
    let boundary = match first_dynamic {
        Some(_) => boundary.unwrap_or(before_dynamic),
        None => text.len(),
    };
    let marked = Rendered {
        text,
        pieces,
        boundary,
    };
    // A template that does more with a content than copy it may test its value
    // (`content.startswith('<tool_response>')`, Qwen3's): there the markers could change what
    // it renders. Rendered without them too; where the two differ, the model gets the true one.
    if tok.reuses_layouts(tools.is_some()) {
        return Ok(marked);
    }
    let truth = tok.render_chat_in(partition, messages, tools, kwargs, generation_prompt)?;
    if truth == marked.text {
        return Ok(marked);
    }
    Ok(unmarked(truth, marked, messages, specials))
}

/// The rendering without markers, for a template that rendered differently with them: one
/// markup piece (tokenized whole, as transformers tokenizes a rendering); the static prefix ends
/// where the marked one did, at most where the two renderings part. Where a message holds a
/// control token's text, which one markup piece could not keep as plain text, the marked
/// rendering stays (its contents as sent, in content pieces).
fn unmarked(
    truth: String,
    marked: Rendered,
    messages: &[ChatMessage],
    specials: &[String],
) -> Rendered {
    if messages
        .iter()
        .any(|m| specials.iter().any(|s| m.content.contains(s.as_str())))
    {
        return marked;
    }
    let same = truth
        .bytes()
        .zip(marked.text.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let mut boundary = marked.boundary.min(same);
    while !truth.is_char_boundary(boundary) {
        boundary -= 1;
    }
    Rendered {
        pieces: vec![Piece {
            range: 0..truth.len(),
            content: false,
        }],
        boundary,
        text: truth,
    }
}

fn bad_template(what: &str) -> EngineError {
    EngineError::InvalidRequest(format!("the chat template mangles message text: {what}"))
}

/// Tokenizes `pieces` of `text` (markup with special tokens, content without) onto `ids`.
pub(crate) fn tokenize(
    tok: &TextTokenizer,
    text: &str,
    pieces: &[Piece],
    ids: &mut Vec<u32>,
) -> Result<(), EngineError> {
    tokenize_with(tok, text, pieces, ids, |s| Ok(tok.encode(s)?.into()))
}

/// [`tokenize`], each markup piece's ids from `markup`.
fn tokenize_with(
    tok: &TextTokenizer,
    text: &str,
    pieces: &[Piece],
    ids: &mut Vec<u32>,
    mut markup: impl FnMut(&str) -> Result<Arc<[u32]>, EngineError>,
) -> Result<(), EngineError> {
    for p in pieces {
        let s = &text[p.range.clone()];
        if p.content {
            ids.extend(tok.encode_plain(s)?);
        } else {
            ids.extend_from_slice(&markup(s)?);
        }
    }
    Ok(())
}

/// The pieces before `at` and from it, the piece spanning it cut there.
fn split(pieces: &[Piece], at: usize) -> (Vec<Piece>, Vec<Piece>) {
    let (mut head, mut tail) = (Vec::new(), Vec::new());
    for p in pieces {
        if p.range.end <= at {
            head.push(p.clone());
        } else if p.range.start >= at {
            tail.push(p.clone());
        } else {
            head.push(Piece {
                range: p.range.start..at,
                content: p.content,
            });
            tail.push(Piece {
                range: at..p.range.end,
                content: p.content,
            });
        }
    }
    (head, tail)
}

/// The result of [`PrefixTokens::encode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    /// Tokens of the request-independent prefix.
    pub stable_tokens: usize,
    /// Whether the prefix's tokens came from the cache.
    pub hit: bool,
    /// The prefix's key and tokens, to put in the cache once the request is admitted
    /// ([`PrefixTokens::fill`]); `None` on a hit or without a static prefix.
    pub fill: Option<([u8; 32], Arc<Vec<u32>>)>,
}

struct Cache {
    lru: lru::LruCache<[u8; 32], Arc<Vec<u32>>>,
    bytes: usize,
}

/// The prefix-token cache: entries keyed by (tenant salt, the prefix's pieces), bounded in the
/// bytes of the tokens it holds (LRU).
pub struct PrefixTokens {
    cache: Mutex<Cache>,
    max_bytes: usize,
    /// Token ids of markup pieces (the chat template's literal text around messages, such as
    /// `<|im_end|>\n<|im_start|>assistant\n`): every request's tail has them, and a piece is
    /// tokenized on its own, so its ids are always the same. At most [`MARKUP_ENTRIES`].
    markup: Mutex<std::collections::HashMap<Box<str>, Arc<[u32]>>>,
}

/// Markup pieces remembered (beyond, the map starts over: a template that writes varying
/// markup, such as a date, cannot grow it without bound).
const MARKUP_ENTRIES: usize = 4096;

impl PrefixTokens {
    /// A cache of at most `max_bytes` of token ids.
    pub fn new(max_bytes: usize) -> PrefixTokens {
        PrefixTokens {
            cache: Mutex::new(Cache {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            max_bytes,
            markup: Default::default(),
        }
    }

    /// [`tokenize`], markup pieces' ids from the markup map.
    fn tokenize(
        &self,
        tok: &TextTokenizer,
        text: &str,
        pieces: &[Piece],
        ids: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        tokenize_with(tok, text, pieces, ids, |s| {
            if let Some(m) = self.markup.lock().expect("markup lock").get(s) {
                return Ok(m.clone());
            }
            let m: Arc<[u32]> = tok.encode(s)?.into();
            let mut map = self.markup.lock().expect("markup lock");
            if map.len() >= MARKUP_ENTRIES {
                map.clear();
            }
            map.insert(s.into(), m.clone());
            Ok(m)
        })
    }

    /// Bytes of token ids held.
    pub fn bytes(&self) -> usize {
        self.cache.lock().expect("cache lock").bytes
    }

    /// Tokenizes `r` for the tenant of `salt`, the static prefix's tokens from the cache when
    /// they are there.
    pub fn encode(
        &self,
        tok: &TextTokenizer,
        r: &Rendered,
        salt: &[u8; 32],
    ) -> Result<Encoded, EngineError> {
        let (head, tail) = split(&r.pieces, r.boundary);
        let mut ids = Vec::with_capacity(r.text.len() / 3);
        if head.is_empty() {
            self.tokenize(tok, &r.text, &tail, &mut ids)?;
            return Ok(Encoded {
                ids,
                stable_tokens: 0,
                hit: false,
                fill: None,
            });
        }
        let key = key(salt, &r.text, &head);
        let cached = self
            .cache
            .lock()
            .expect("cache lock")
            .lru
            .get(&key)
            .cloned();
        let (prefix, fill) = match cached {
            Some(p) => (p, None),
            None => {
                let mut p = Vec::new();
                self.tokenize(tok, &r.text, &head, &mut p)?;
                let p = Arc::new(p);
                (p.clone(), Some((key, p)))
            }
        };
        ids.extend_from_slice(&prefix);
        self.tokenize(tok, &r.text, &tail, &mut ids)?;
        Ok(Encoded {
            ids,
            stable_tokens: prefix.len(),
            hit: fill.is_none(),
            fill,
        })
    }

    /// Caches a prefix [`PrefixTokens::encode`] computed, once its request was admitted; the
    /// least recently used entries go to stay within the byte bound.
    pub fn fill(&self, fill: ([u8; 32], Arc<Vec<u32>>)) {
        let size = fill.1.len() * 4;
        if size > self.max_bytes {
            return;
        }
        let mut c = self.cache.lock().expect("cache lock");
        if let Some(old) = c.lru.put(fill.0, fill.1) {
            c.bytes -= old.len() * 4;
        }
        c.bytes += size;
        while c.bytes > self.max_bytes {
            match c.lru.pop_lru() {
                Some((_, v)) => c.bytes -= v.len() * 4,
                None => break,
            }
        }
    }
}

/// The cache key of a prefix: keyed blake3 under the tenant's salt over its pieces (kind,
/// length, bytes), so tenants never share entries unless they share a salt.
fn key(salt: &[u8; 32], text: &str, pieces: &[Piece]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(salt);
    for p in pieces {
        h.update(&[p.content as u8]);
        h.update(&(p.range.len() as u64).to_le_bytes());
        h.update(text[p.range.clone()].as_bytes());
    }
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(r: Range<usize>, content: bool) -> Piece {
        Piece { range: r, content }
    }

    #[test]
    fn pieces_split_at_the_boundary() {
        let ps = vec![piece(0..5, false), piece(5..20, true), piece(20..24, false)];
        let (h, t) = split(&ps, 12);
        assert_eq!(h, vec![piece(0..5, false), piece(5..12, true)]);
        assert_eq!(t, vec![piece(12..20, true), piece(20..24, false)]);
        let (h, t) = split(&ps, 5);
        assert_eq!((h.len(), t.len()), (1, 2));
    }

    #[test]
    fn the_cache_is_bounded_in_bytes_and_keys_differ_by_salt() {
        let c = PrefixTokens::new(40);
        let text = "abcdef";
        let ps = [piece(0..6, true)];
        let (k1, k2) = (key(&[1; 32], text, &ps), key(&[2; 32], text, &ps));
        assert_ne!(k1, k2, "one tenant's prefix is not another's");
        assert_ne!(
            k1,
            key(&[1; 32], text, &[piece(0..6, false)]),
            "kind is in the key"
        );
        c.fill((k1, Arc::new(vec![1; 6])));
        c.fill((k2, Arc::new(vec![2; 6])));
        assert_eq!(c.bytes(), 24);
        c.fill(([3; 32], Arc::new(vec![3; 6])));
        assert_eq!(c.bytes(), 24, "the oldest went");
        c.fill(([4; 32], Arc::new(vec![4; 20])));
        assert_eq!(c.bytes(), 24, "larger than the whole cache: not kept");
    }
}
