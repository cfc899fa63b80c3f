//! ASCII message text through a byte-level BPE tokenizer without the `tokenizers` pipeline.
//!
//! The gateway tokenizes every chat message's text (the static prefix's tokens are cached, the
//! user's words are not: every real message differs). For the byte-level BPE vocabularies of
//! GPT-2, SmolLM, Llama 3 and Qwen2 the library's pipeline spends most of a short message's time
//! around the model, not in it: normalized strings with alignment tables, a backtracking regex
//! (`fancy_regex`) for the pre-tokenizer's split, an `Encoding` with offsets. For text that is
//! all ASCII (most prompts written in English, and all code) the split is a few byte classes:
//! [`Split::pieces`] cuts exactly where those regexes cut, and each piece goes, mapped to
//! GPT-2's byte characters, to the tokenizer's own BPE model (its merges and its word cache), so
//! the ids are the model's. Anything else — non-ASCII text, text holding an added token the
//! split would isolate, a tokenizer whose pipeline is not one of these — takes the library's
//! pipeline. Tests compare the cuts with the library's pre-tokenizers on a corpus built to hit
//! every branch, and the ids of real vocabularies end to end.

use std::ops::Range;
use std::sync::RwLock;

use rustc_hash::FxHashMap;
use tokenizers::models::ModelWrapper;
use tokenizers::Model;

/// GPT-2's split (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`),
/// or Llama 3's / Qwen2's (`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, Qwen2 with `\p{N}` alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Split {
    /// GPT-2's regex; `digits`: after every digit was cut off on its own (the `Digits`
    /// pre-tokenizer with `individual_digits`, as SmolLM and StarCoder do).
    Gpt2 { digits: bool },
    /// Llama 3's regex, digits in runs of at most `max_digits` (3; Qwen2: 1).
    Llama3 { max_digits: usize },
}

/// llama.cpp's and transformers' spellings of the Llama 3 and Qwen2 split patterns.
pub(crate) const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(crate) const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `\s` among ASCII bytes (Unicode White_Space: tab, LF, VT, FF, CR, space).
fn space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

/// `[^\s\p{L}\p{N}]` among ASCII bytes.
fn other(b: u8) -> bool {
    !space(b) && !b.is_ascii_alphanumeric()
}

/// The end of the run of bytes from `i` (below `end`) that `class` takes.
fn run(s: &[u8], mut i: usize, end: usize, class: impl Fn(u8) -> bool) -> usize {
    while i < end && class(s[i]) {
        i += 1;
    }
    i
}

/// A contraction at `i` (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`; any case when
/// `fold`): its end.
fn contraction(s: &[u8], i: usize, end: usize, fold: bool) -> Option<usize> {
    if s[i] != b'\'' || i + 1 >= end {
        return None;
    }
    let low = |b: u8| if fold { b.to_ascii_lowercase() } else { b };
    match low(s[i + 1]) {
        b's' | b't' | b'm' | b'd' => Some(i + 2),
        b'r' | b'v' if i + 2 < end && low(s[i + 2]) == b'e' => Some(i + 3),
        b'l' if i + 2 < end && low(s[i + 2]) == b'l' => Some(i + 3),
        _ => None,
    }
}

/// `\s+(?!\S)|\s+` at `i`, a whitespace byte, below `end`: the run, less its last byte where a
/// non-space follows and that leaves one.
fn spaces(s: &[u8], i: usize, end: usize) -> usize {
    let j = run(s, i, end, space);
    if j < end && j - i >= 2 {
        j - 1
    } else {
        j
    }
}

impl Split {
    /// The pieces the split cuts ASCII `text` into, in order, covering it.
    pub(crate) fn pieces(self, text: &str, out: &mut Vec<Range<usize>>) {
        let s = text.as_bytes();
        debug_assert!(s.is_ascii());
        match self {
            Split::Gpt2 { digits: false } => gpt2(s, 0, s.len(), out),
            Split::Gpt2 { digits: true } => {
                // Every digit a piece of its own; GPT-2's regex inside the runs between.
                let mut start = 0;
                for (i, b) in s.iter().enumerate() {
                    if b.is_ascii_digit() {
                        gpt2(s, start, i, out);
                        out.push(i..i + 1);
                        start = i + 1;
                    }
                }
                gpt2(s, start, s.len(), out);
            }
            Split::Llama3 { max_digits } => llama3(s, max_digits, out),
        }
    }
}

/// GPT-2's regex over `s[start..end]`.
fn gpt2(s: &[u8], start: usize, end: usize, out: &mut Vec<Range<usize>>) {
    let mut i = start;
    while i < end {
        let c = s[i];
        let to = if let Some(e) = contraction(s, i, end, false) {
            e
        } else {
            // ` ?` then a run of letters, digits or others — the class of the byte after the
            // optional space decides which alternative matches.
            let at = if c == b' ' && i + 1 < end && !space(s[i + 1]) {
                i + 1
            } else {
                i
            };
            let b = s[at];
            if b.is_ascii_alphabetic() {
                run(s, at, end, |b| b.is_ascii_alphabetic())
            } else if b.is_ascii_digit() {
                run(s, at, end, |b| b.is_ascii_digit())
            } else if !space(b) {
                run(s, at, end, other)
            } else {
                spaces(s, i, end)
            }
        };
        out.push(i..to);
        i = to;
    }
}

/// Llama 3's regex over `s` (Qwen2's with `max_digits` 1).
fn llama3(s: &[u8], max_digits: usize, out: &mut Vec<Range<usize>>) {
    let end = s.len();
    let mut i = 0;
    while i < end {
        let c = s[i];
        let letters = |from: usize| run(s, from, end, |b| b.is_ascii_alphabetic());
        let to = if let Some(e) = contraction(s, i, end, true) {
            e
        } else if c.is_ascii_alphabetic() {
            // `[^\r\n\p{L}\p{N}]?\p{L}+` without its optional byte.
            letters(i)
        } else if c != b'\r'
            && c != b'\n'
            && !c.is_ascii_digit()
            && i + 1 < end
            && s[i + 1].is_ascii_alphabetic()
        {
            // … with it: any byte but CR, LF, a letter or a digit (a space, a tab, `(`, …).
            letters(i + 1)
        } else if c.is_ascii_digit() {
            run(s, i, end, |b| b.is_ascii_digit()).min(i + max_digits)
        } else if other(c) || (c == b' ' && i + 1 < end && other(s[i + 1])) {
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
            let o = run(s, if other(c) { i } else { i + 1 }, end, other);
            run(s, o, end, |b| b == b'\r' || b == b'\n')
        } else {
            // Whitespace: `\s*[\r\n]+` ends after the run's last CR or LF; without one,
            // `\s+(?!\S)|\s+`.
            let j = run(s, i, end, space);
            match s[i..j].iter().rposition(|&b| b == b'\r' || b == b'\n') {
                Some(p) => i + p + 1,
                None => spaces(s, i, end),
            }
        };
        out.push(i..to);
        i = to;
    }
}

/// Pieces whose ids [`AsciiBpe`] keeps: at most this many (the map is emptied when a request
/// would pass it) …
const CACHE_PIECES: usize = 1 << 14;
/// … of at most this many bytes each.
const CACHE_PIECE_BYTES: usize = 64;

/// A byte-level BPE tokenizer's ASCII fast path (see the module's text).
pub(crate) struct AsciiBpe {
    split: Split,
    /// GPT-2's character for each ASCII byte.
    chars: [char; 128],
    /// The added tokens the plain tokenizer still isolates (those not special) that are ASCII:
    /// text holding one goes through the library.
    added: Vec<String>,
    /// The ids of pieces seen before, by their bytes (bounded by [`CACHE_PIECES`] and
    /// [`CACHE_PIECE_BYTES`]): a hit costs a hash of the piece, where the model's own word cache
    /// also builds a token (and its string) per id.
    cache: RwLock<PieceIds>,
}

/// A piece's bytes → its ids.
type PieceIds = FxHashMap<Box<[u8]>, Box<[u32]>>;

impl AsciiBpe {
    /// The fast path for `t` (the tokenizer that takes special tokens as text), when its
    /// pipeline is one [`Split`] describes exactly: a BPE model, no normalizer or a Unicode
    /// normal form (the identity on ASCII), one of the byte-level pre-tokenizers, no truncation
    /// or padding.
    pub(crate) fn of(t: &tokenizers::Tokenizer) -> Option<AsciiBpe> {
        let ModelWrapper::BPE(_) = t.get_model() else {
            return None;
        };
        if t.get_truncation().is_some() || t.get_padding().is_some() {
            return None;
        }
        if let Some(n) = t.get_normalizer() {
            let v = serde_json::to_value(n).ok()?;
            let identity = |v: &serde_json::Value| {
                matches!(v["type"].as_str(), Some("NFC" | "NFD" | "NFKC" | "NFKD"))
            };
            let ok = identity(&v)
                || (v["type"] == "Sequence"
                    && v["normalizers"]
                        .as_array()
                        .is_some_and(|a| a.iter().all(identity)));
            if !ok {
                return None;
            }
        }
        let split = split_of(&serde_json::to_value(t.get_pre_tokenizer()?).ok()?)?;
        let mut chars = ['\0'; 128];
        for (b, c) in chars.iter_mut().enumerate() {
            *c = super::char_of_byte(b as u8);
        }
        let special = t.get_added_vocabulary().get_encode_special_tokens();
        let added = t
            .get_added_tokens_decoder()
            .into_values()
            .filter(|a| !(a.special && special) && a.content.is_ascii())
            .map(|a| a.content)
            .collect();
        Some(AsciiBpe {
            split,
            chars,
            added,
            cache: RwLock::default(),
        })
    }

    /// `text`'s ids through `t`'s model (the tokenizer this was made [`of`](Self::of)), or
    /// `None` when the text is not for this path.
    pub(crate) fn encode(
        &self,
        t: &tokenizers::Tokenizer,
        text: &str,
    ) -> Option<tokenizers::Result<Vec<u32>>> {
        if !text.is_ascii() || self.added.iter().any(|a| text.contains(a.as_str())) {
            return None;
        }
        let ModelWrapper::BPE(bpe) = t.get_model() else {
            return None;
        };
        let mut pieces = Vec::with_capacity(text.len() / 4 + 1);
        self.split.pieces(text, &mut pieces);
        let mut ids = Vec::with_capacity(pieces.len() + 4);
        let mut word = String::with_capacity(32);
        let mut seen = Vec::new();
        {
            let cache = self.cache.read().unwrap_or_else(|e| e.into_inner());
            for p in pieces {
                let bytes = &text.as_bytes()[p];
                if let Some(hit) = cache.get(bytes) {
                    ids.extend_from_slice(hit);
                    continue;
                }
                word.clear();
                word.extend(bytes.iter().map(|&b| self.chars[b as usize]));
                let from = ids.len();
                match bpe.tokenize(&word) {
                    Ok(tokens) => ids.extend(tokens.iter().map(|t| t.id)),
                    Err(e) => return Some(Err(e)),
                }
                if bytes.len() <= CACHE_PIECE_BYTES {
                    seen.push((Box::<[u8]>::from(bytes), Box::<[u32]>::from(&ids[from..])));
                }
            }
        }
        if !seen.is_empty() {
            let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
            if cache.len() + seen.len() > CACHE_PIECES {
                cache.clear();
            }
            cache.extend(seen.into_iter().take(CACHE_PIECES));
        }
        Some(Ok(ids))
    }
}

/// The [`Split`] a pre-tokenizer (as its JSON) performs on ASCII text, if it is one.
fn split_of(v: &serde_json::Value) -> Option<Split> {
    let byte_level = |v: &serde_json::Value, regex: bool| {
        v["type"] == "ByteLevel" && v["add_prefix_space"] == false && v["use_regex"] == regex
    };
    if byte_level(v, true) {
        return Some(Split::Gpt2 { digits: false });
    }
    let seq = v
        .get("pretokenizers")
        .filter(|_| v["type"] == "Sequence")?
        .as_array()?;
    match seq.as_slice() {
        [d, b]
            if d["type"] == "Digits" && d["individual_digits"] == true && byte_level(b, true) =>
        {
            Some(Split::Gpt2 { digits: true })
        }
        [s, b]
            if s["type"] == "Split"
                && s["behavior"] == "Isolated"
                && s["invert"] == false
                && byte_level(b, false) =>
        {
            match s["pattern"]["Regex"].as_str()? {
                LLAMA3_SPLIT => Some(Split::Llama3 { max_digits: 3 }),
                QWEN2_SPLIT => Some(Split::Llama3 { max_digits: 1 }),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// Strings that reach every branch of both splits: runs and mixes of letters of both
    /// cases, digits, spaces, tabs, CR/LF, VT/FF, apostrophes (contractions of both cases and
    /// not), punctuation, control bytes — from a fixed-seed generator, plus prose and code.
    fn corpus() -> Vec<String> {
        let atoms: &[&str] = &[
            "a", "Z", "word", "Hello", "x", "0", "7", "12", "1234", "2025", " ", "  ", "   ", "\t",
            "\n", "\r\n", "\r", "\n\n", " \n", "\x0b", "\x0c", "'", "'s", "'S", "'t", "'re", "'RE",
            "'Ve", "'m", "'ll", "'LL", "'d", "'x", "''", "!", "?!", "(", ")", "{", "}", ".", "...",
            ",", "-", "_", "#", "$", "\\", "\"", "\x01", "\x1f", "\x7f", "don't", "I'M", " 42",
            "\tfn", "(x)", "a1b2", "::", "->", " ;\n",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut out: Vec<String> = (0..4000)
            .map(|_| {
                let n = (next() % 12) as usize;
                (0..n)
                    .map(|_| atoms[(next() % atoms.len() as u64) as usize])
                    .collect()
            })
            .collect();
        // Every ASCII byte alone and in pairs.
        for a in 0u8..128 {
            out.push((a as char).to_string());
            for b in [b' ', b'a', b'1', b'\n', b'\'', b'!', b'\t'] {
                out.push(format!("{}{}", a as char, b as char));
                out.push(format!("{}{}", b as char, a as char));
            }
        }
        out.push("It's 2026-12-02T13:05:00Z; we'll   ship v1.2.3 — no, wait".replace('—', "-"));
        out.push(
            "fn main() {\n    let x = vec![1, 22, 333, 4444];\n\n\tprintln!(\"{x:?}\");\r\n}\n"
                .into(),
        );
        out
    }

    fn library_pieces(pre: &tokenizers::PreTokenizerWrapper, text: &str) -> Vec<Range<usize>> {
        let mut p = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut p).unwrap();
        p.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| a..b)
            .collect()
    }

    fn pre(json: serde_json::Value) -> tokenizers::PreTokenizerWrapper {
        serde_json::from_value(json).unwrap()
    }

    fn byte_level(regex: bool) -> serde_json::Value {
        serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex})
    }

    #[test]
    fn the_splits_cut_where_the_librarys_pre_tokenizers_cut() {
        let split = |re: &str| {
            serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false},
                byte_level(false)]})
        };
        let cases = [
            (byte_level(true), Split::Gpt2 { digits: false }),
            (
                serde_json::json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
                Split::Gpt2 { digits: true },
            ),
            (split(LLAMA3_SPLIT), Split::Llama3 { max_digits: 3 }),
            (split(QWEN2_SPLIT), Split::Llama3 { max_digits: 1 }),
        ];
        let corpus = corpus();
        for (json, want) in cases {
            assert_eq!(split_of(&json), Some(want), "{json}");
            let library = pre(json);
            let mut ours = Vec::new();
            for text in &corpus {
                ours.clear();
                want.pieces(text, &mut ours);
                assert_eq!(ours, library_pieces(&library, text), "{want:?} on {text:?}");
            }
        }
    }

    #[test]
    fn other_pipelines_are_not_taken_for_one_of_these() {
        for json in [
            serde_json::json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
            serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": false}, byte_level(true)]}),
            serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": false},
                byte_level(false)]}),
            serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Removed", "invert": false},
                byte_level(false)]}),
            serde_json::json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}),
        ] {
            assert_eq!(split_of(&json), None, "{json}");
        }
    }

    /// A byte-level BPE tokenizer of the 256 byte characters and a few merges, GPT-2's split.
    fn tiny_tokenizer() -> tokenizers::Tokenizer {
        let chars: Vec<char> = (0u8..=255).map(super::super::char_of_byte).collect();
        let mut vocab: serde_json::Map<String, serde_json::Value> = chars
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), i.into()))
            .collect();
        let merges = [
            ("Ġ", "t"),
            ("Ġt", "h"),
            ("Ġth", "e"),
            ("e", "r"),
            ("1", "2"),
        ];
        for (a, b) in merges {
            let n = vocab.len();
            vocab.insert(format!("{a}{b}"), n.into());
        }
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": byte_level(true), "post_processor": null,
            "decoder": null,
            "model": {"type": "BPE", "vocab": vocab,
                      "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()},
        });
        json.to_string().parse().unwrap()
    }

    #[test]
    fn ids_equal_the_pipelines_and_the_piece_cache_stays_bounded() {
        let t = tiny_tokenizer();
        let fast = AsciiBpe::of(&t).expect("GPT-2's pipeline");
        let library = |text: &str| t.encode_fast(text, false).unwrap().get_ids().to_vec();
        for text in corpus().iter().chain(corpus().iter()) {
            assert_eq!(
                fast.encode(&t, text).unwrap().unwrap(),
                library(text),
                "{text:?}"
            );
        }
        // More distinct pieces than the cache keeps: it is emptied, never grows past its bound,
        // and answers stay right.
        for i in 0..(CACHE_PIECES + CACHE_PIECES / 2) {
            let text = format!("the w{i:x}q 12 there");
            assert_eq!(fast.encode(&t, &text).unwrap().unwrap(), library(&text));
            assert!(fast.cache.read().unwrap().len() <= CACHE_PIECES);
        }
        let long = "x".repeat(CACHE_PIECE_BYTES + 1);
        assert_eq!(fast.encode(&t, &long).unwrap().unwrap(), library(&long));
        assert!(!fast.cache.read().unwrap().contains_key(long.as_bytes()));
        // Not for this path: non-ASCII text.
        assert!(fast.encode(&t, "café").is_none());
    }

    #[test]
    fn byte_characters_are_gpt2s() {
        use super::super::{byte_of_char, char_of_byte};
        assert_eq!(char_of_byte(b' '), 'Ġ');
        assert_eq!(char_of_byte(b'\n'), 'Ċ');
        assert_eq!(char_of_byte(b'\t'), 'ĉ');
        assert_eq!(char_of_byte(b'a'), 'a');
        assert_eq!(char_of_byte(0), 'Ā');
        assert_eq!(char_of_byte(0x7f), 'ġ');
        for b in 0u8..=255 {
            assert_eq!(byte_of_char(char_of_byte(b)), Some(b));
        }
    }
}
