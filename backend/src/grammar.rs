//! Structured outputs: a request's constraint (a JSON Schema, any JSON object, a regular
//! expression, a Lark grammar, one of a few strings) compiled by `llguidance` against the
//! model's vocabulary into a [`Matcher`] that gives, each step, the tokens allowed next as a
//! bitmask — applied to the logits on the device — and follows the tokens chosen.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::ParserFactory;
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::tokenizer::TextTokenizer;

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "value")]
pub enum Constraint {
    /// JSON valid under this schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Text of this grammar (llguidance's Lark syntax).
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

impl Constraint {
    fn grammar(&self) -> Result<TopLevelGrammar, EngineError> {
        Ok(match self {
            Constraint::JsonSchema(s) => {
                if !s.is_object() && !s.is_boolean() {
                    return Err(EngineError::InvalidRequest(
                        "a JSON schema is an object (or true / false)".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(compact(s.clone()))
            }
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Constraint::Choice(c) => {
                if c.is_empty() || c.iter().any(|x| x.is_empty()) {
                    return Err(EngineError::InvalidRequest(
                        "a choice takes one or more non-empty strings".into(),
                    ));
                }
                // A Lark alternation of JSON-quoted string literals.
                let alts: Vec<String> = c
                    .iter()
                    .map(|x| serde_json::to_string(x).expect("a string serialises"))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
        })
    }
}

/// JSON without whitespace (llguidance's `,` and `:` separators), unless the schema sets
/// llguidance's `x-guidance` options itself: a model left free to pick whitespace can spend its
/// whole budget on newlines.
fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// One request's grammar state.
pub struct Matcher {
    inner: llguidance::Matcher,
}

impl Matcher {
    /// The tokens allowed next, as bits over `out`'s 32-bit words (token `t` is bit `t % 32` of
    /// word `t / 32`); ids beyond the tokenizer's vocabulary are never allowed.
    pub fn mask(&mut self, out: &mut [u32]) -> Result<(), EngineError> {
        let m = self
            .inner
            .compute_mask_or_eos()
            .map_err(|e| EngineError::InvalidRequest(format!("the grammar failed: {e}")))?;
        let bits = m.as_slice();
        let n = bits.len().min(out.len());
        out[..n].copy_from_slice(&bits[..n]);
        out[n..].fill(0);
        Ok(())
    }
    /// Follows a chosen token; an error when the grammar does not allow it.
    pub fn consume(&mut self, tok: u32) -> Result<(), EngineError> {
        self.inner
            .consume_token(tok)
            .map_err(|e| EngineError::InvalidRequest(format!("the grammar refused a token: {e}")))
    }
    /// How many leading `drafts` the grammar allows (speculative drafts are cut there).
    pub fn valid_prefix(&mut self, drafts: &[u32]) -> usize {
        self.inner.validate_tokens(drafts).unwrap_or(0)
    }
    /// The masks of a verification step: the row after the known tokens, then one after each
    /// draft (followed tentatively and taken back), into `out` (`1 + drafts.len()` rows).
    pub fn masks_through(&mut self, drafts: &[u32], out: &mut [u32]) -> Result<(), EngineError> {
        let words = out.len() / (1 + drafts.len());
        let mut rows = out.chunks_mut(words);
        self.mask(rows.next().expect("a row"))?;
        let mut followed = 0;
        let mut result = Ok(());
        for (d, row) in drafts.iter().zip(rows) {
            if let Err(e) = self.consume(*d) {
                result = Err(e);
                break;
            }
            followed += 1;
            if let Err(e) = self.mask(row) {
                result = Err(e);
                break;
            }
        }
        self.inner
            .rollback(followed)
            .map_err(|e| EngineError::InvalidRequest(format!("the grammar failed: {e}")))?;
        result
    }
    /// Whether the grammar is complete and allows nothing more.
    pub fn is_stopped(&self) -> bool {
        self.inner.is_stopped()
    }
}

/// Compiles constraints against one model's vocabulary (built on first use: indexing a
/// vocabulary takes a moment).
pub struct GrammarCompiler {
    tokenizer: TextTokenizer,
    eos: u32,
    model_vocab: usize,
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
}

impl GrammarCompiler {
    pub fn new(tokenizer: TextTokenizer, eos: u32, model_vocab: usize) -> Self {
        GrammarCompiler {
            tokenizer,
            eos,
            model_vocab,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&Arc<ParserFactory>, EngineError> {
        self.factory
            .get_or_init(|| {
                // Every token's bytes; special tokens behind the trie's marker so no grammar can
                // produce them as text.
                let n = self.tokenizer.vocab_size().min(self.model_vocab);
                let words: Vec<Vec<u8>> = (0..n as u32)
                    .map(|id| {
                        let b = self.tokenizer.token_bytes(id);
                        if self.tokenizer.is_special(id) || b.is_empty() {
                            let mut m = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                            m.extend(b);
                            m
                        } else {
                            b
                        }
                    })
                    .collect();
                let info = TokRxInfo::new(n as u32, self.eos);
                let trie = TokTrie::from(&info, &words);
                let env: Arc<dyn TokenizerEnv + Sync> = Arc::new(ApproximateTokEnv::new(trie));
                let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                f.quiet();
                Ok(Arc::new(f))
            })
            .as_ref()
            .map_err(|e| {
                EngineError::InvalidRequest(format!("structured outputs are unavailable: {e}"))
            })
    }

    /// The matcher of `c`, or why it does not compile.
    pub fn compile(&self, c: &Constraint) -> Result<Matcher, EngineError> {
        let factory = self.factory()?;
        let parser = factory.create_parser(c.grammar()?).map_err(|e| {
            EngineError::InvalidRequest(format!("the constraint does not compile: {e}"))
        })?;
        let inner = llguidance::Matcher::new(Ok(parser));
        if let Some(e) = inner.get_error() {
            return Err(EngineError::InvalidRequest(format!(
                "the constraint does not compile: {e}"
            )));
        }
        Ok(Matcher { inner })
    }
}
