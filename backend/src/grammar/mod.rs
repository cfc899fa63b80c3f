//! Structured outputs: a request's constraint (a JSON Schema, any JSON object, a regular
//! expression, a Lark grammar, one of a few strings) compiled by `llguidance` against the
//! model's vocabulary into a [`Matcher`] that gives, each step, the tokens allowed next as a
//! bitmask — applied to the logits on the device — and follows the tokens chosen.
//!
//! No constraint a client sends can take the process down: each is measured against
//! [`limits`] first (refused with the limit named), then compiled on a thread of its own whose
//! stack is sized for those limits, within [`COMPILE_DEADLINE`] and at most
//! [`GrammarCompiler::slots`] at a time; its first mask is computed there too, so a grammar past
//! the library's own work limits is refused at submission rather than failing its request later.
//! Masks of later steps run on [`mask_pool`], whose threads have the same stack.

pub mod limits;

use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

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
    /// Checks the constraint's shape against [`limits`] (cheap, linear in its size): call
    /// before any other work with it.
    pub fn check(&self) -> Result<(), limits::LimitError> {
        limits::check(self)
    }

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

/// Stack of the threads that compile constraints and compute their masks. llguidance
/// recurses over a grammar's structure; within [`limits`] the deepest constraints measured
/// (`grammar::tests`) need a fraction of this. Reserved address space: pages are committed only
/// as a thread touches them.
pub const STACK_BYTES: usize = 64 << 20;
/// Longest a constraint may take to compile (with its first mask) before it is refused.
pub const COMPILE_DEADLINE: Duration = Duration::from_secs(5);

/// The threads every request's grammar masks are computed on (a step's masks in parallel), with
/// stacks of [`STACK_BYTES`].
pub fn mask_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("cachet-mask-{i}"))
            .stack_size(STACK_BYTES)
            .build()
            .expect("starting the grammar mask threads")
    })
}

/// A count of compiles in flight, bounded.
#[derive(Default)]
struct Slots {
    busy: Mutex<usize>,
    freed: Condvar,
}

/// One compile's hold on a slot, given back when the compile ends (also one abandoned past its
/// deadline: it still holds the CPU, so it still counts).
struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.busy.lock().expect("slots lock") -= 1;
        self.0.freed.notify_one();
    }
}

/// llguidance's reason a vocabulary's parser factory could not be made, kept for every later
/// request.
#[derive(Debug, Clone)]
struct FactoryError(Arc<dyn std::error::Error + Send + Sync>);

/// Compiles constraints against one model's vocabulary (built on first use: indexing a
/// vocabulary takes a moment).
pub struct GrammarCompiler {
    tokenizer: TextTokenizer,
    eos: u32,
    model_vocab: usize,
    /// The factory, or llguidance's reason it could not be made (kept for every later request).
    factory: OnceLock<Result<Arc<ParserFactory>, FactoryError>>,
    slots: Arc<Slots>,
    max_slots: usize,
}

impl GrammarCompiler {
    pub fn new(tokenizer: TextTokenizer, eos: u32, model_vocab: usize) -> Self {
        GrammarCompiler {
            tokenizer,
            eos,
            model_vocab,
            factory: OnceLock::new(),
            slots: Default::default(),
            // Half the cores (at least two): compiles are CPU work beside the engine's.
            max_slots: std::thread::available_parallelism()
                .map_or(2, |n| n.get() / 2)
                .max(2),
        }
    }

    /// Most constraints compiled at once; a compile waits for a slot up to its deadline.
    pub fn slots(&self) -> usize {
        self.max_slots
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
                let mut f = ParserFactory::new_simple(&env).map_err(|e| {
                    FactoryError(Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
                        e,
                    )))
                })?;
                f.quiet();
                Ok(Arc::new(f))
            })
            .as_ref()
            .map_err(|e| {
                let mut msg = format!("structured outputs are unavailable: {}", e.0);
                let mut cause = e.0.source();
                while let Some(c) = cause {
                    msg.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                EngineError::InvalidRequest(msg)
            })
    }

    /// A slot, waiting until `deadline` for one.
    fn slot(&self, deadline: Instant) -> Result<Slot, EngineError> {
        let t0 = Instant::now();
        let mut busy = self.slots.busy.lock().expect("slots lock");
        while *busy >= self.max_slots {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EngineError::GrammarBusy {
                    limit: self.max_slots,
                    waited_ms: t0.elapsed().as_millis() as u64,
                });
            }
            busy = self
                .slots
                .freed
                .wait_timeout(busy, left)
                .expect("slots lock")
                .0;
        }
        *busy += 1;
        Ok(Slot(self.slots.clone()))
    }

    /// The matcher of `c`, or why it does not compile: checked against [`limits`], compiled on
    /// a thread of its own (stack of [`STACK_BYTES`]) with its first mask, within
    /// [`COMPILE_DEADLINE`].
    pub fn compile(&self, c: &Constraint) -> Result<Matcher, EngineError> {
        self.compile_within(c, COMPILE_DEADLINE)
    }

    /// [`Self::compile`] with another deadline.
    pub fn compile_within(&self, c: &Constraint, within: Duration) -> Result<Matcher, EngineError> {
        c.check()
            .map_err(|e| EngineError::InvalidRequest(format!("the constraint: {e}")))?;
        let deadline = Instant::now() + within;
        let factory = self.factory()?.clone();
        let grammar = c.grammar()?;
        let words = self.model_vocab.div_ceil(32);
        let slot = self.slot(deadline)?;
        let (tx, rx) = sync_channel(1);
        std::thread::Builder::new()
            .name("cachet-grammar".into())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                let _slot = slot;
                let _ = tx.send(build(&factory, grammar, words));
            })
            .map_err(|e| EngineError::InvalidRequest(format!("structured outputs: {e}")))?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => Err(EngineError::InvalidRequest(format!(
                "the constraint did not compile within {} ms; make it smaller or simpler",
                within.as_millis()
            ))),
            Err(RecvTimeoutError::Disconnected) => Err(EngineError::InvalidRequest(
                "the constraint's compile failed".into(),
            )),
        }
    }
}

/// Compiles `grammar` and computes its first mask (on a compile thread).
fn build(
    factory: &ParserFactory,
    grammar: TopLevelGrammar,
    words: usize,
) -> Result<Matcher, EngineError> {
    let parser = factory.create_parser(grammar).map_err(|e| {
        EngineError::InvalidRequest(format!("the constraint does not compile: {e}"))
    })?;
    let inner = llguidance::Matcher::new(Ok(parser));
    if let Some(e) = inner.get_error() {
        return Err(EngineError::InvalidRequest(format!(
            "the constraint does not compile: {e}"
        )));
    }
    let mut m = Matcher { inner };
    // The first mask: where a grammar passes the limits above but not the parser's own work
    // limits (items in a row of its chart, lexer fuel), the request is refused now.
    m.mask(&mut vec![0u32; words]).map_err(|e| {
        EngineError::InvalidRequest(format!("the constraint does not compile: {e}"))
    })?;
    Ok(m)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A byte-level vocabulary of the 256 bytes and an end token, built in code.
    pub fn byte_tokenizer() -> TextTokenizer {
        let vocab: serde_json::Map<String, serde_json::Value> = (0..=255u8)
            .map(|b| {
                (
                    crate::tokenizer::char_of_byte(b).to_string(),
                    serde_json::json!(b as u32),
                )
            })
            .collect();
        let j = serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": 256, "content": "<eos>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "vocab": vocab, "merges": []}
        });
        let inner: tokenizers::Tokenizer = j.to_string().parse().unwrap();
        TextTokenizer::new(inner, None, None, Some("<eos>".into()))
    }

    /// The deepest constraints the limits admit compile (on a compile thread) and give
    /// masks, each kind at its limit; one past it is refused before any work. At 2 MiB the
    /// library overflowed at a `$ref` chain of ~550 definitions and ~600 chained Lark rules
    /// (about 4 KiB a level): the compile threads' stack is many times what the limit needs.
    #[test]
    fn the_deepest_admitted_constraints_compile_and_one_level_more_is_refused() {
        let g = GrammarCompiler::new(byte_tokenizer(), 256, 257);
        let chain = |n| Constraint::JsonSchema(limits::tests::ref_chain(n, false));
        let rules = |n| Constraint::Lark(limits::tests::rule_chain(n));
        let props = |n: usize| {
            let mut v = serde_json::json!({"type": "string"});
            for _ in 0..n {
                v = serde_json::json!({"type": "object", "properties": {"a": v}, "required": ["a"]});
            }
            Constraint::JsonSchema(v)
        };
        for (what, at, past) in [
            (
                "a $ref chain",
                chain(limits::MAX_DEPTH - 2),
                chain(limits::MAX_DEPTH - 1),
            ),
            (
                "a rule chain",
                rules(limits::MAX_DEPTH - 2),
                rules(limits::MAX_DEPTH - 1),
            ),
            ("nested properties", props(100), props(limits::MAX_DEPTH)),
        ] {
            assert!(at.check().is_ok(), "{what}");
            let mut m = g.compile(&at).unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut mask = vec![0u32; 9];
            m.mask(&mut mask).unwrap();
            assert!(mask.iter().any(|&w| w != 0), "{what}: nothing allowed");
            let e = g.compile(&past).err().expect(what).to_string();
            assert!(e.contains("over the limit of"), "{what}: {e}");
        }
    }

    /// A grammar past the parser's own work limits is refused at compile (its first mask), not
    /// later in the request; a compile slower than its deadline is refused in time.
    #[test]
    fn work_past_the_parsers_limits_is_refused_at_compile_and_deadlines_hold() {
        let g = GrammarCompiler::new(byte_tokenizer(), 256, 257);
        // 1,000 alternatives (the limit) of one shared prefix: within ours.
        let alts: Vec<String> = (0..1000).map(|i| format!("item number {i}")).collect();
        let c = Constraint::Choice(alts);
        assert!(g.compile(&c).is_ok());
        // A deadline already past: refused at once, whatever the compile would take.
        let e = g
            .compile_within(&c, Duration::ZERO)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("did not compile within 0 ms"), "{e}");
        // Every slot held (compiles still running past their deadlines count): the next
        // compile waits for its deadline, then is refused as busy (503), not as bad input.
        let held: Vec<Slot> = (0..g.slots())
            .map(|_| g.slot(Instant::now() + COMPILE_DEADLINE).unwrap())
            .collect();
        let t0 = Instant::now();
        let e = g
            .compile_within(&c, Duration::from_millis(50))
            .err()
            .unwrap();
        assert!(e.is_overload(), "{e}");
        assert!(t0.elapsed() >= Duration::from_millis(50));
        drop(held);
        assert!(g.compile(&c).is_ok());
    }
}
