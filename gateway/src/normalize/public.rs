//! Public prefixes: operator-declared prompt starts (a vendor's system prompt served to many
//! tenants) whose cached blocks every tenant shares.
//!
//! A prefix is declared in the config (`[[public_prefix]]`), never by a tenant or a client: as a
//! system message (`system = "…"`, rendered with the model's chat template as every request's
//! system message is) or as the raw start of a prompt (`text = "…"`, tokenized with control
//! tokens recognized). Its tokens are computed once. A request's prompt shares the public part as
//! far as its tokens equal the prefix's — the longest common run from the start — rounded down to
//! whole blocks: those tokens decode to a prefix of the operator's text, so nothing the tenant
//! wrote is in a shared block. The engines hash those blocks under the public salt and salt every
//! block after them per tenant ([`cachet_backend::block_hash`]).

use cachet_backend::tokenizer::{ChatMessage, TextTokenizer};
use serde::Deserialize;

use super::tokens;

/// One `[[public_prefix]]` of the config file: exactly one of `system` and `text`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicPrefixConfig {
    /// Its name in metrics and logs.
    pub name: String,
    /// The text of a system message, as requests send it (after normalization).
    pub system: Option<String>,
    /// The raw start of a prompt, markup included (for `/v1/completions` text prompts).
    pub text: Option<String>,
}

/// A declared prefix, tokenized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicPrefix {
    pub name: String,
    pub tokens: Vec<u32>,
}

/// The deployment's public prefixes and its KV block size.
#[derive(Debug, Clone, Default)]
pub struct PublicPrefixes {
    prefixes: Vec<PublicPrefix>,
    block_size: usize,
}

/// A prompt's public part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublicPart<'a> {
    /// The prefix it starts with.
    pub name: &'a str,
    /// Leading full blocks wholly inside it.
    pub blocks: usize,
}

/// A `[[public_prefix]]` declaration that cannot share a block.
#[derive(Debug, thiserror::Error)]
pub enum InvalidPublicPrefix {
    #[error("{0} public prefixes declared; at most {MAX_PUBLIC_PREFIXES}")]
    TooMany(usize),
    #[error("public prefix `{0}`: names must be unique and non-empty")]
    Name(String),
    #[error("public prefix `{0}`: give exactly one of `system` and `text`")]
    OneOf(String),
    #[error("public prefix `{name}`: {tokens} tokens, fewer than one KV block ({block_size}): nothing to share")]
    Short {
        name: String,
        tokens: usize,
        block_size: usize,
    },
    #[error("public prefix `{name}`")]
    Tokens {
        name: String,
        #[source]
        source: cachet_backend::EngineError,
    },
}

/// Most public prefixes a deployment declares (each request is compared with every one).
pub const MAX_PUBLIC_PREFIXES: usize = 64;

impl PublicPrefixes {
    /// Tokenizes the declared prefixes; refuses a declaration that cannot share a block.
    pub fn new(
        configs: &[PublicPrefixConfig],
        tok: &TextTokenizer,
        block_size: usize,
    ) -> Result<Self, InvalidPublicPrefix> {
        use InvalidPublicPrefix as E;
        if configs.len() > MAX_PUBLIC_PREFIXES {
            return Err(E::TooMany(configs.len()));
        }
        let mut prefixes: Vec<PublicPrefix> = Vec::with_capacity(configs.len());
        for c in configs {
            let name = || c.name.clone();
            let tokens_err = |source| E::Tokens {
                name: name(),
                source,
            };
            if c.name.is_empty() || prefixes.iter().any(|p| p.name == c.name) {
                return Err(E::Name(name()));
            }
            let tokens = match (&c.system, &c.text) {
                (Some(system), None) => {
                    let r = tokens::render(
                        tok,
                        &[],
                        &[ChatMessage::new("system", system)],
                        tokens::TemplateArgs::PLAIN,
                        None,
                    )
                    .map_err(tokens_err)?;
                    let mut ids = Vec::new();
                    tokens::tokenize(tok, &r.text, &r.pieces, &mut ids).map_err(tokens_err)?;
                    ids
                }
                (None, Some(text)) => tok.encode(text).map_err(tokens_err)?,
                _ => return Err(E::OneOf(name())),
            };
            if tokens.len() < block_size {
                return Err(E::Short {
                    name: name(),
                    tokens: tokens.len(),
                    block_size,
                });
            }
            prefixes.push(PublicPrefix {
                name: c.name.clone(),
                tokens,
            });
        }
        Ok(PublicPrefixes {
            prefixes,
            block_size,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    pub fn prefixes(&self) -> &[PublicPrefix] {
        &self.prefixes
    }

    /// The public part of a prompt of token ids `ids`: the declared prefix it shares the most
    /// whole blocks with, if one.
    pub fn part_of(&self, ids: &[u32]) -> Option<PublicPart<'_>> {
        self.prefixes
            .iter()
            .map(|p| {
                let common = p.tokens.iter().zip(ids).take_while(|(a, b)| a == b).count();
                (p, common / self.block_size)
            })
            .filter(|&(_, blocks)| blocks > 0)
            .max_by_key(|&(_, blocks)| blocks)
            .map(|(p, blocks)| PublicPart {
                name: &p.name,
                blocks,
            })
    }
}
